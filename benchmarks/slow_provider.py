"""Lateness of plain deadlines while a provider hangs, in real time.

One process on SQLite: dueflow's worker loop (``Worker.run``, as ``dueflow serve`` runs it) and
the payment simulator behind ``httpx.ASGITransport``. The first order has a WeChat Pay trade
whose close is made to hang for ``--hang`` seconds (simulator ``fail-next``, mode ``timeout``);
it falls due first. Right after it, ``--orders`` plain orders (no trade) are placed one every
``--every`` seconds, each due ``--pay`` seconds later, so their deadlines keep coming while the
close hangs (the first of them in the trading order's own batch). Lateness is each plain order's cancel_unpaid timer: ``done_at - due_at``. Printed
as one JSON line; afterwards the database is checked (every plain order cancelled, its goods on
sale again, no timer left claimed or due).

    .venv/bin/python benchmarks/slow_provider.py              # 60 orders, 10 s hang
    .venv/bin/python benchmarks/slow_provider.py --orders 100 --every 0.1
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import tempfile
from pathlib import Path

import httpx
from sqlalchemy import select

from dueflow import bootstrap
from dueflow.clock import SystemClock
from dueflow.config import load_settings
from dueflow.payments.simulator import SimulatorConfig
from dueflow.payments.simulator.app import create_app as simulator_app
from dueflow.service import accounts, orders, payments
from dueflow.store import migrate, schema
from dueflow.store.db import Database
from dueflow.worker.runner import Worker


async def measure(args: argparse.Namespace, path: Path) -> dict[str, object]:
    url = f"sqlite:///{path}"
    db = Database.from_url(url)
    await migrate.upgrade(db)
    await db.dispose()
    config = SimulatorConfig.generate(clock=SystemClock(), hang_seconds=args.hang)
    settings = load_settings(
        database_url=url,
        public_url="http://dueflow",
        pay_timeout=f"{args.pay}s",
        reminder_after=f"{args.pay * 10}s",
        **dataclasses.asdict(config.client_config("http://sim")),
    )
    transport = httpx.ASGITransport(app=simulator_app(config))
    async with (
        httpx.AsyncClient(transport=transport, base_url="http://sim") as sim,
        bootstrap.running(settings, http=sim, migrate_sqlite=False) as deps,
    ):
        seller, _ = await accounts.add_user(deps, "seller")
        buyer, _ = await accounts.add_user(deps, "buyer")

        async def place() -> int:
            goods_id = await accounts.add_goods(deps, seller_id=seller.id, title="t", price="9.90")
            return await orders.place_order(deps, buyer_id=buyer.id, goods_id=goods_id)

        trading = await place()
        await payments.start_payment(deps, order_id=trading, user_id=buyer.id, provider="wechatpay")
        armed = await sim.post(
            "/control/fail-next",
            json={"provider": "wechatpay", "method": "close", "mode": "timeout"},
        )
        assert armed.status_code == 200, armed.text
        stop = asyncio.Event()
        worker = Worker(deps)
        loop = asyncio.create_task(worker.run(stop))
        plain = []
        # Placed from now on, they fall due from the trading order's deadline on: while its
        # close hangs (the first in the same batch as the trading order).
        for _ in range(args.orders):
            plain.append(await place())
            await asyncio.sleep(args.every)
        await asyncio.sleep(args.pay + 2)
        stop.set()
        deps.trigger.wake()
        await asyncio.wait_for(loop, timeout=args.hang + 30)
        result = await check(deps, plain, args)
        async with deps.db.read() as conn:
            (hung,) = (
                await conn.execute(
                    select(schema.timers.c.attempts, schema.timers.c.last_error).where(
                        schema.timers.c.order_id == trading,
                        schema.timers.c.kind == "cancel_unpaid",
                    )
                )
            ).all()
        result["trading_order_attempts"] = hung.attempts
        return result


async def check(deps, plain: list[int], args: argparse.Namespace) -> dict[str, object]:  # type: ignore[no-untyped-def]
    t, o, g = schema.timers, schema.orders, schema.goods
    async with deps.db.read() as conn:
        late = [
            (r.done_at - r.due_at).total_seconds() * 1000
            for r in await conn.execute(
                select(t.c.due_at, t.c.done_at).where(
                    t.c.order_id.in_(plain), t.c.kind == "cancel_unpaid"
                )
            )
            if r.done_at is not None
        ]
        status = {r.status for r in await conn.execute(select(o.c.status).where(o.c.id.in_(plain)))}
        held = (await conn.execute(select(g.c.id).where(g.c.reserved_order_id.in_(plain)))).all()
        claimed = (await conn.execute(select(t.c.id).where(t.c.state == "claimed"))).all()
    assert len(late) == len(plain), f"{len(plain) - len(late)} plain orders not cancelled"
    assert status == {"cancelled_unpaid"}, status
    assert not held and not claimed, (held, claimed)
    late.sort()
    return {
        "bench": "slow_provider",
        "orders": len(plain),
        "hang_s": args.hang,
        "lateness_ms_p50": round(statistics.median(late), 1),
        "lateness_ms_p99": round(late[min(len(late) - 1, int(len(late) * 0.99))], 1),
        "lateness_ms_max": round(late[-1], 1),
        "checked": True,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=60)
    parser.add_argument("--every", type=float, default=0.2, help="seconds between plain orders")
    parser.add_argument("--pay", type=float, default=4.0, help="pay timeout in seconds")
    parser.add_argument("--hang", type=float, default=10.0, help="seconds the close hangs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(asyncio.run(measure(args, Path(tmp) / "bench.db"))))


if __name__ == "__main__":
    main()

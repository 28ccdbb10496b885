"""Payments end to end in one process: dueflow (SQLite), the payment simulator and dueflow's
notify routes call each other through ``httpx.ASGITransport`` (no TCP); a FakeClock shared by
both drives only the deadlines, wall-clock time is measured with ``time.perf_counter``.

Two measurements, one JSON line each:

* ``notify``: N paid orders (half Alipay, half WeChat Pay); ``POST /control/deliver`` sends every
  notification to dueflow, which verifies (RSA signatures, AES-GCM for WeChat), keeps the inbox
  row and confirms the payment. Timed per provider until every order is pending_shipment; also
  the process's CPU time per notification (``cpu_ms_each``: the simulator's and dueflow's work
  together, all threads), steadier than the rate on a shared machine.
* ``close``: M orders with a started and scanned attempt, none paid; the clock passes the pay
  deadline and ``Worker(deps).drain()`` closes every trade at the simulator (bounded by
  ``provider_concurrency``) and cancels the orders. Optionally again with a concurrency of 1.

    .venv/bin/python benchmarks/payments.py                         # 2,000 paid, 10,000 expiring
    .venv/bin/python benchmarks/payments.py --expiring 2000 --serial 500
    .venv/bin/python benchmarks/payments.py --expiring 0 --serial 0  # notifications only
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from sqlalchemy import func, select

from dueflow import bootstrap
from dueflow.api.app import create_app as dueflow_app
from dueflow.clock import FakeClock
from dueflow.config import load_settings
from dueflow.payments.simulator import SimulatorConfig
from dueflow.payments.simulator.app import create_app as simulator_app
from dueflow.service import accounts, orders, payments
from dueflow.service.deps import Deps
from dueflow.store import migrate, schema
from dueflow.store.db import Database
from dueflow.worker.runner import Worker

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
PROVIDERS = ("alipay", "wechatpay")


class Forward(httpx.AsyncBaseTransport):
    """A transport to an ASGI app that exists only later (the two apps call each other)."""

    def __init__(self) -> None:
        self.app = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert self.app is not None
        return await httpx.ASGITransport(app=self.app).handle_async_request(request)


@dataclass
class Market:
    deps: Deps
    clock: FakeClock
    sim: httpx.AsyncClient
    seller: int
    buyer: int


@contextlib.asynccontextmanager
async def market(path: Path, provider_concurrency: int) -> AsyncIterator[Market]:
    url = f"sqlite:///{path}"
    db = Database.from_url(url)
    try:
        await migrate.upgrade(db)
    finally:
        await db.dispose()
    clock = FakeClock(START)
    forward = Forward()
    config = SimulatorConfig.generate(clock=clock, transport=forward)
    settings = load_settings(
        database_url=url,
        public_url="http://dueflow",
        provider_concurrency=provider_concurrency,
        **dataclasses.asdict(config.client_config("http://sim")),
    )
    async with (
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=simulator_app(config)), base_url="http://sim"
        ) as sim,
        bootstrap.running(settings, clock=clock, http=sim, migrate_sqlite=False) as deps,
    ):
        forward.app = dueflow_app(deps)
        seller, _ = await accounts.add_user(deps, "seller")
        buyer, _ = await accounts.add_user(deps, "buyer")
        yield Market(deps, clock, sim, seller.id, buyer.id)


async def control(m: Market, action: str, provider: str, pay_no: str) -> None:
    answer = await m.sim.post(
        f"/control/{action}", json={"provider": provider, "out_trade_no": pay_no}
    )
    assert answer.status_code == 200, answer.text


async def prepare(m: Market, count: int, parallel: int) -> dict[str, list[tuple[int, str]]]:
    """``count`` orders, each with a started and scanned attempt, alternating providers.
    Returns {provider: [(order_id, pay_no)]}."""
    started: dict[str, list[tuple[int, str]]] = {p: [] for p in PROVIDERS}
    limit = asyncio.Semaphore(parallel)

    async def one(i: int) -> None:
        provider = PROVIDERS[i % 2]
        async with limit:
            goods_id = await accounts.add_goods(
                m.deps, seller_id=m.seller, title=f"item {i}", price="88.00"
            )
            order_id = await orders.place_order(m.deps, buyer_id=m.buyer, goods_id=goods_id)
            pay_no, _ = await payments.start_payment(
                m.deps, order_id=order_id, user_id=m.buyer, provider=provider
            )
            await control(m, "scan", provider, pay_no)
        started[provider].append((order_id, pay_no))

    await asyncio.gather(*(one(i) for i in range(count)))
    return started


async def statuses(deps: Deps) -> dict[str, int]:
    async with deps.db.read() as conn:
        query = select(schema.orders.c.status, func.count()).group_by(schema.orders.c.status)
        return {status: n for status, n in (await conn.execute(query)).all()}


async def events_per_order(deps: Deps, event: str) -> dict[int, int]:
    """How many orders have each count of ``event`` timeline entries: {count: orders}."""
    async with deps.db.read() as conn:
        per_order = (
            select(func.count().label("n"))
            .where(schema.order_events.c.event == event)
            .group_by(schema.order_events.c.order_id)
            .subquery()
        )
        query = select(per_order.c.n, func.count()).group_by(per_order.c.n)
        return {n: orders for n, orders in (await conn.execute(query)).all()}


async def inbox(deps: Deps) -> dict[str, int]:
    async with deps.db.read() as conn:
        column = schema.notifications.c.outcome
        query = select(column, func.count()).group_by(column)
        return {outcome: n for outcome, n in (await conn.execute(query)).all()}


async def notify(args: argparse.Namespace, tmp: Path) -> dict[str, object]:
    async with market(tmp / "notify.db", args.provider_concurrency) as m:
        t0 = time.perf_counter()
        started = await prepare(m, args.orders, args.setup_parallel)
        setup_s = time.perf_counter() - t0
        per_provider: dict[str, dict[str, object]] = {}
        total_s = 0.0
        total_cpu_s = 0.0  # this process's CPU, all threads: less sensitive to a busy machine
        for provider in PROVIDERS:
            for _, pay_no in started[provider]:
                await control(m, "pay", provider, pay_no)
            rounds = 0
            t0 = time.perf_counter()
            c0 = time.process_time()
            paid = 0
            while paid < len(started[provider]):
                answer = await m.sim.post("/control/deliver")
                rounds += 1
                if answer.json()["sent"] == 0:  # failed attempts wait for their retry time
                    m.clock.advance(timedelta(seconds=30))
                paid = (await statuses(m.deps)).get("pending_shipment", 0) - sum(
                    len(started[p]) for p in PROVIDERS[: PROVIDERS.index(provider)]
                )
                if rounds > 100:
                    break
            seconds = time.perf_counter() - t0
            cpu_s = time.process_time() - c0
            total_s += seconds
            total_cpu_s += cpu_s
            per_provider[provider] = {
                "notifications": len(started[provider]),
                "seconds": round(seconds, 3),
                "per_s": round(len(started[provider]) / seconds),
                "cpu_ms_each": round(cpu_s * 1000 / len(started[provider]), 2),
                "deliver_rounds": rounds,
            }
        moves = await events_per_order(m.deps, "pay")
        final = await statuses(m.deps)
        outcomes = await inbox(m.deps)
    return {
        "measurement": "notify",
        "orders": args.orders,
        "setup_seconds": round(setup_s, 1),
        "seconds": round(total_s, 3),
        "notifications_per_s": round(args.orders / total_s),
        "cpu_ms_each": round(total_cpu_s * 1000 / args.orders, 2),
        "by_provider": per_provider,
        "statuses": final,
        "pay_events_per_order": moves,
        "inbox": outcomes,
        "ok": final == {"pending_shipment": args.orders}
        and moves == {1: args.orders}
        and outcomes == {"confirmed": args.orders},
    }


async def close(
    args: argparse.Namespace, tmp: Path, count: int, concurrency: int
) -> dict[str, object]:
    async with market(tmp / f"close-{concurrency}.db", concurrency) as m:
        t0 = time.perf_counter()
        started = await prepare(m, count, args.setup_parallel)
        setup_s = time.perf_counter() - t0
        m.clock.advance(timedelta(minutes=31))
        t0 = time.perf_counter()
        claimed = await Worker(m.deps).drain()
        seconds = time.perf_counter() - t0
        final = await statuses(m.deps)
        state = (await m.sim.get("/control/state")).json()
    pay_nos = {pay_no for pairs in started.values() for _, pay_no in pairs}
    trades: dict[str, int] = {}
    for trade in state["trades"]:
        if trade["out_trade_no"] in pay_nos:
            trades[trade["status"]] = trades.get(trade["status"], 0) + 1
    return {
        "measurement": "close",
        "orders": count,
        "provider_concurrency": concurrency,
        "setup_seconds": round(setup_s, 1),
        "timers_claimed": claimed,
        "seconds": round(seconds, 3),
        "orders_per_s": round(count / seconds),
        "statuses": final,
        "trades": trades,
        "ok": final == {"cancelled_unpaid": count} and trades == {"closed": count},
    }


async def run(args: argparse.Namespace, tmp: Path) -> list[dict[str, object]]:
    results = []
    if args.orders:
        results.append(await notify(args, tmp))
        print(json.dumps(results[-1]), flush=True)
    if args.expiring:
        results.append(await close(args, tmp, args.expiring, args.provider_concurrency))
        print(json.dumps(results[-1]), flush=True)
    if args.serial:
        results.append(await close(args, tmp, args.serial, 1))
        print(json.dumps(results[-1]), flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--orders", type=int, default=2_000, help="paid orders (0: skip)")
    parser.add_argument("--expiring", type=int, default=10_000, help="expiring orders (0: skip)")
    parser.add_argument(
        "--serial", type=int, default=1_000, help="expiring orders closed one at a time (0: skip)"
    )
    parser.add_argument("--provider-concurrency", type=int, default=32)
    parser.add_argument(
        "--setup-parallel", type=int, default=16, help="orders set up at once (not timed)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dueflow-payments-") as tmp:
        results = asyncio.run(run(args, Path(tmp)))
    if not all(r["ok"] for r in results):
        print("PAYMENTS INCOMPLETE: see the JSON lines above", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

"""Payments end to end in one process: dueflow (SQLite), the payment simulator and dueflow's
notify routes call each other through ``httpx.ASGITransport`` (no TCP); a FakeClock shared by
both drives only the deadlines, wall-clock time is measured with ``time.perf_counter``.

Two measurements, one JSON line each:

* ``notify``: N paid orders (half Alipay, half WeChat Pay); ``POST /control/deliver`` sends every
  notification to dueflow, which verifies (RSA signatures, AES-GCM for WeChat), keeps the inbox
  row and confirms the payment. Timed per provider until every order is pending_shipment; also
  the process's CPU time per notification (``cpu_ms_each``: the simulator's and dueflow's work
  together, all threads), steadier than the rate on a shared machine.
* ``direct``: the same, but the simulator's notifications (signed, encrypted) are kept as it
  sends them and then POSTed straight to dueflow's notify routes, ``--direct-concurrency`` at a
  time: the rate and CPU of dueflow alone (the simulator's signing and sending left out), to
  set beside the place-order server's CPU an order.
* ``statements``: statements and transactions per start payment and per notification (Alipay
  and WeChat Pay: a payment, a duplicate, a second code paid and refunded), counted with SQLAlchemy's cursor events on
  dueflow's engine while one call runs alone; on PostgreSQL a transaction adds two round trips
  (BEGIN and COMMIT) to its statements.
* ``close``: M orders with a started and scanned attempt, none paid; the clock passes the pay
  deadline and ``Worker(deps).drain()`` closes every trade at the simulator (bounded by
  ``provider_concurrency``) and cancels the orders. Optionally again with a concurrency of 1.

    .venv/bin/python benchmarks/payments.py                         # 2,000 paid, 10,000 expiring
    .venv/bin/python benchmarks/payments.py --expiring 2000 --serial 500
    .venv/bin/python benchmarks/payments.py --expiring 0 --serial 0  # notifications only
    .venv/bin/python benchmarks/payments.py --orders 0 --expiring 0 --serial 0 \
        --database-url postgresql://postgres@127.0.0.1/bench              # the counts only

``--database-url`` (PostgreSQL or MySQL) is emptied and migrated afresh for each measurement;
by default each uses a new SQLite file.
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
from sqlalchemy import event, func, select
from sqlalchemy.engine import Connection

import _backends
from dueflow import bootstrap
from dueflow.api.app import create_app as dueflow_app
from dueflow.clock import FakeClock
from dueflow.config import load_settings
from dueflow.payments.simulator import SimulatorConfig
from dueflow.payments.simulator.app import create_app as simulator_app
from dueflow.service import accounts, orders, payments
from dueflow.service.deps import Deps
from dueflow.store import schema
from dueflow.worker.runner import Worker

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
PROVIDERS = ("alipay", "wechatpay")


class Forward(httpx.AsyncBaseTransport):
    """A transport to an ASGI app that exists only later (the two apps call each other)."""

    def __init__(self) -> None:
        self.app = None
        #: While a list: requests are kept here, not sent (answered 503, so never acknowledged).
        self.kept: list[httpx.Request] | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.kept is not None:
            await request.aread()
            self.kept.append(request)
            return httpx.Response(503)
        assert self.app is not None
        return await httpx.ASGITransport(app=self.app).handle_async_request(request)


@dataclass
class Market:
    deps: Deps
    clock: FakeClock
    sim: httpx.AsyncClient
    forward: Forward
    seller: int
    buyer: int


@contextlib.asynccontextmanager
async def market(
    path: Path, provider_concurrency: int, database_url: str | None = None
) -> AsyncIterator[Market]:
    """dueflow on a fresh database (``database_url`` emptied, or a new SQLite file at
    ``path``), the simulator beside it, a seller and a buyer."""
    url = database_url or f"sqlite:///{path}"
    db = await _backends.fresh(url)
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
        yield Market(deps, clock, sim, forward, seller.id, buyer.id)


class Statements:
    """What dueflow's engine runs while :meth:`counting`: SQL statements (BEGIN and COMMIT not
    among them) and transactions, write and read, from SQLAlchemy's events."""

    def __init__(self, deps: Deps) -> None:
        self.on = False
        self.statements = 0
        self.writes = 0
        self.reads = 0
        engine = deps.db.engine.sync_engine
        event.listen(engine, "before_cursor_execute", self._statement)
        event.listen(engine, "commit", self._commit)
        event.listen(engine, "rollback", self._commit)

    def _statement(self, _conn: Connection, _cursor: object, sql: str, *_args: object) -> None:
        if self.on and not sql.lstrip().upper().startswith("BEGIN"):
            self.statements += 1

    def _commit(self, conn: Connection) -> None:
        if not self.on:
            return
        if conn.get_execution_options().get("dueflow_read"):
            self.reads += 1
        else:
            self.writes += 1

    @contextlib.asynccontextmanager
    async def counting(self) -> AsyncIterator[None]:
        """Count what runs inside the block (added to what was counted before)."""
        self.on = True
        try:
            yield
        finally:
            self.on = False

    def taken(self, calls: int) -> dict[str, float]:
        """What was counted, per call (statements, write and read transactions); then zero."""
        counts = {
            "statements": round(self.statements / calls, 2),
            "write_transactions": round(self.writes / calls, 2),
            "read_transactions": round(self.reads / calls, 2),
        }
        self.statements = self.writes = self.reads = 0
        return counts


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


async def count_statements(args: argparse.Namespace, tmp: Path) -> dict[str, object]:
    """Statements and transactions of one start payment and one notification at a time."""
    each = args.count_each
    async with market(tmp / "statements.db", args.provider_concurrency, args.database_url) as m:
        counter = Statements(m.deps)
        by_provider: dict[str, dict[str, object]] = {}
        for provider in PROVIDERS:
            pay_nos = []
            for i in range(2 * each):
                goods_id = await accounts.add_goods(
                    m.deps, seller_id=m.seller, title=f"{provider} {i}", price="88.00"
                )
                order_id = await orders.place_order(m.deps, buyer_id=m.buyer, goods_id=goods_id)
                async with counter.counting():
                    pay_no, _ = await payments.start_payment(
                        m.deps, order_id=order_id, user_id=m.buyer, provider=provider
                    )
                pay_nos.append(pay_no)
            started = counter.taken(2 * each)
            for pay_no in pay_nos[:each]:
                await control(m, "pay", provider, pay_no)
                async with counter.counting():
                    await m.sim.post("/control/deliver")
            paid = counter.taken(each)
            for pay_no in pay_nos[each:]:
                answer = await m.sim.post(
                    "/control/pay",
                    json={"provider": provider, "out_trade_no": pay_no, "duplicate": 2},
                )
                assert answer.status_code == 200, answer.text
                async with counter.counting():
                    await m.sim.post("/control/deliver")
            pair = counter.taken(each)
            for i in range(each):  # two codes paid: the second is refunded (paid_twice)
                goods_id = await accounts.add_goods(
                    m.deps, seller_id=m.seller, title=f"{provider} twice {i}", price="88.00"
                )
                order_id = await orders.place_order(m.deps, buyer_id=m.buyer, goods_id=goods_id)
                codes = [
                    (
                        await payments.start_payment(
                            m.deps, order_id=order_id, user_id=m.buyer, provider=provider
                        )
                    )[0]
                    for _ in range(2)
                ]
                for pay_no in codes:
                    await control(m, "pay", provider, pay_no)
                    async with counter.counting():
                        await m.sim.post("/control/deliver")
            twice = counter.taken(each)
            by_provider[provider] = {
                "start_payment": started,
                "notification_paid": paid,
                "notification_duplicate": {k: round(pair[k] - paid[k], 2) for k in paid},
                "notification_paid_twice": {k: round(twice[k] - paid[k], 2) for k in paid},
            }
        outcomes = await inbox(m.deps)
        final = await statuses(m.deps)
        dialect = m.deps.db.dialect
    total = 3 * each * len(PROVIDERS)
    return {
        "measurement": "statements",
        "dialect": dialect,
        "calls_each": each,
        "by_provider": by_provider,
        "inbox": outcomes,
        "ok": final == {"pending_shipment": total}
        and outcomes == {"confirmed": total, "duplicate": total // 3, "refund": total // 3},
    }


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
    async with market(tmp / "notify.db", args.provider_concurrency, args.database_url) as m:
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


async def direct(args: argparse.Namespace, tmp: Path) -> dict[str, object]:
    """The same notifications, signed by the simulator beforehand and sent straight to
    dueflow's notify routes at ``--direct-concurrency``: dueflow's own rate and CPU."""
    async with market(tmp / "direct.db", args.provider_concurrency, args.database_url) as m:
        started = await prepare(m, args.direct, args.setup_parallel)
        m.forward.kept = []
        for provider in PROVIDERS:
            for _, pay_no in started[provider]:
                await control(m, "pay", provider, pay_no)
        await m.sim.post("/control/deliver")
        kept, m.forward.kept = m.forward.kept, None
        limit = asyncio.Semaphore(args.direct_concurrency)
        transport = httpx.ASGITransport(app=m.forward.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://dueflow") as client:

            async def send(request: httpx.Request) -> int:
                headers = {
                    k: v for k, v in request.headers.items() if k not in ("host", "content-length")
                }
                async with limit:
                    answer = await client.post(
                        request.url.path, content=request.content, headers=headers
                    )
                return answer.status_code

            t0 = time.perf_counter()
            c0 = time.process_time()
            codes = await asyncio.gather(*(send(request) for request in kept))
            seconds = time.perf_counter() - t0
            cpu_s = time.process_time() - c0
        answers: dict[int, int] = {}
        for code in codes:
            answers[code] = answers.get(code, 0) + 1
        moves = await events_per_order(m.deps, "pay")
        final = await statuses(m.deps)
        outcomes = await inbox(m.deps)
    return {
        "measurement": "direct",
        "notifications": len(kept),
        "concurrency": args.direct_concurrency,
        "seconds": round(seconds, 3),
        "notifications_per_s": round(len(kept) / seconds),
        "cpu_ms_each": round(cpu_s * 1000 / len(kept), 2),
        "answers": answers,
        "statuses": final,
        "ok": len(kept) == args.direct
        and final == {"pending_shipment": args.direct}
        and moves == {1: args.direct}
        and outcomes == {"confirmed": args.direct},
    }


async def close(
    args: argparse.Namespace, tmp: Path, count: int, concurrency: int
) -> dict[str, object]:
    async with market(tmp / f"close-{concurrency}.db", concurrency, args.database_url) as m:
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
    if args.count_each:
        results.append(await count_statements(args, tmp))
        print(json.dumps(results[-1]), flush=True)
    if args.orders:
        results.append(await notify(args, tmp))
        print(json.dumps(results[-1]), flush=True)
    if args.direct:
        results.append(await direct(args, tmp))
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
    parser.add_argument(
        "--count-each",
        type=int,
        default=10,
        help="start payments and notifications counted one at a time, per provider (0: skip)",
    )
    parser.add_argument(
        "--direct",
        type=int,
        default=2_000,
        help="paid orders whose notifications go straight to dueflow (0: skip)",
    )
    parser.add_argument("--direct-concurrency", type=int, default=32)
    parser.add_argument(
        "--database-url", help="PostgreSQL or MySQL, emptied first (default: SQLite files)"
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

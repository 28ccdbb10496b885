"""How much a start payment and a notification cost the database (issue 12): the statements
and write transactions each runs, counted with SQLAlchemy's cursor and commit events on
dueflow's engine. A start needs two write transactions: it keeps the attempt before the
provider hears of it and records the answer after; a notification one: its inbox row is kept
with its effects, after it is verified. The statement counts are ceilings: a leaner path
may run fewer, a slip that reads a row twice fails here."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest
from sqlalchemy import event

from dueflow.service import orders, payments
from tests.unit.payments import test_payment_flow
from tests.unit.payments.test_payment_flow import Market

# test_payment_flow's market (dueflow and the simulator calling each other) and its options.
market = test_payment_flow.market
sim_options = test_payment_flow.sim_options


@dataclass
class Counts:
    statements: list[str] = field(default_factory=list)
    writes: int = 0
    reads: int = 0


@asynccontextmanager
async def counted(market: Market) -> AsyncIterator[Counts]:
    """What dueflow's engine runs inside the block (BEGIN not counted as a statement)."""
    counts = Counts()
    engine = market.deps.db.engine.sync_engine

    def statement(_conn, _cursor, sql, *_rest) -> None:
        if not sql.lstrip().upper().startswith("BEGIN"):
            counts.statements.append(sql)

    def commit(conn) -> None:
        if conn.get_execution_options().get("dueflow_read"):
            counts.reads += 1
        else:
            counts.writes += 1

    event.listen(engine, "before_cursor_execute", statement)
    event.listen(engine, "commit", commit)
    try:
        yield counts
    finally:
        event.remove(engine, "before_cursor_execute", statement)
        event.remove(engine, "commit", commit)


def lines(counts: Counts) -> Iterator[str]:
    return (sql.split(" WHERE ")[0][:80] for sql in counts.statements)


#: The snapshot of an order's new events (store/snapshots.py), last in the event's own write
#: transaction: the order, its lines, payments and refunds read, then the events recorded for
#: the end of the transaction written with it (one INSERT) and the others filled (one UPDATE),
#: either or both.
SNAPSHOT = ("SELECT orders.", "SELECT order_lines.", "SELECT payments.", "SELECT refunds.")
SNAPSHOT_WRITES = ("INSERT INTO order_events", "UPDATE order_events SET snapshot")


def apart_from_the_snapshot(counts: Counts) -> list[str]:
    """The statements but the one snapshot (checked to be there, as :data:`SNAPSHOT` and one
    or two of :data:`SNAPSHOT_WRITES`)."""
    sql = counts.statements
    n = len(SNAPSHOT)
    [start] = [
        i
        for i in range(len(sql) - n)
        if all(s.startswith(p) for s, p in zip(sql[i : i + n], SNAPSHOT, strict=True))
        and sql[i + n].startswith(SNAPSHOT_WRITES)
    ]
    end = start + n
    while end < len(sql) and sql[end].startswith(SNAPSHOT_WRITES):
        end += 1
    return sql[:start] + sql[end:]


async def start(market: Market, provider: str, order_id: int) -> str:
    pay_no, _ = await payments.start_payment(
        market.deps, order_id=order_id, user_id=market.buyer, provider=provider
    )
    return pay_no


@pytest.mark.parametrize("provider", ["alipay", "wechatpay"])
async def test_a_start_payment_writes_twice_and_never_reads_its_attempt_back(market, provider):
    order_id = await market.order()
    async with counted(market) as counts:
        await start(market, provider, order_id)
    assert counts.writes == 2, list(lines(counts))
    assert counts.reads == 0
    # The order locked, the attempt, its timeline entry, the lines for the subject, the event's
    # snapshot (4 reads, 1 UPDATE); the answer.
    assert len(counts.statements) <= 10, list(lines(counts))
    rest = apart_from_the_snapshot(counts)
    assert len(rest) <= 5, list(lines(counts))
    assert not any(sql.startswith("SELECT payments.") for sql in rest)


@pytest.mark.parametrize("provider", ["alipay", "wechatpay"])
async def test_a_notification_commits_its_inbox_row_with_its_effects(market, provider):
    order_id = await market.order()
    pay_no = await start(market, provider, order_id)
    async with counted(market) as paid:
        await market.pay(provider, pay_no)
    assert await market.status(order_id) == "pending_shipment"
    assert (paid.writes, paid.reads) == (1, 0), list(lines(paid))
    # The pay event's snapshot is filled last in the transaction (4 reads, 1 UPDATE).
    assert len(paid.statements) <= 14, list(lines(paid))
    assert paid.statements[-1].startswith(SNAPSHOT_WRITES)
    rest = apart_from_the_snapshot(paid)
    assert rest[-1].startswith("INSERT INTO notifications")
    assert sum("notifications" in sql for sql in paid.statements) == 1
    assert len(rest) <= 9, list(lines(paid))


@pytest.mark.parametrize("provider", ["alipay", "wechatpay"])
async def test_a_second_code_paid_is_refunded_without_reading_its_rows_again(market, provider):
    order_id = await market.order()
    first, second = [await start(market, provider, order_id) for _ in range(2)]
    await market.pay(provider, first)
    async with counted(market) as twice:
        await market.pay(provider, second)
    view = await orders.order_view(market.deps, order_id)
    assert [r["reason"] for r in view["refunds"]] == ["paid_twice"]
    assert (twice.writes, twice.reads) == (1, 0), list(lines(twice))
    # Read once, locked: the attempt with its order's status; never the order or attempt again
    # (but once more, both, for the snapshot of the transaction's events, at its end).
    rest = apart_from_the_snapshot(twice)
    assert not any(sql.startswith("SELECT orders.") for sql in rest)
    assert sum(sql.startswith("SELECT payments.") for sql in rest) == 1

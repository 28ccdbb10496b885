"""Seeding and polling on any backend, for the benchmarks (SQLite, PostgreSQL, MariaDB)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import func, insert, literal, select, text, update

import _seed
from dueflow.store import migrate
from dueflow.store.db import Database, async_url
from dueflow.store.schema import goods, metadata, order_events, orders, timers


async def fresh(url: str) -> Database:
    """A migrated, empty database at ``url``."""
    db = Database.from_url(url)
    if db.dialect != "sqlite":
        async with db.engine.begin() as conn:
            await conn.run_sync(metadata.drop_all)
            await conn.execute(text("DROP TABLE IF EXISTS alembic_version"))
    await migrate.upgrade(db)
    return db


async def seed_unpaid(db: Database, url: str, path: Any, count: int, due: datetime) -> None:
    """``count`` unpaid orders holding their own goods, with cancel_unpaid timers at ``due``."""
    if db.dialect == "sqlite":
        _seed.seed_unpaid(path, count, due)
        return
    now = datetime.now(UTC).replace(tzinfo=None)
    due_naive = due.astimezone(UTC).replace(tzinfo=None)
    users_rows = [(1, "seller", "h1", False, now), (2, "buyer", "h2", False, now)]
    goods_rows = [
        (i, 1, "item", Decimal("12.50"), "on_sale", i, now, now) for i in range(1, count + 1)
    ]
    order_rows = [
        (
            i,
            "marketplace",
            "normal",
            2,
            1,
            i,
            Decimal("12.50"),
            "pending_payment",
            now,
            due_naive,
            now,
        )
        for i in range(1, count + 1)
    ]
    timer_rows = [
        (i, i, "cancel_unpaid", due_naive, due_naive, "scheduled", 0, False, now)
        for i in range(1, count + 1)
    ]
    line_rows = [(i, i, "goods", i, "item", 1, Decimal("12.50")) for i in range(1, count + 1)]
    if db.dialect == "postgresql":
        import asyncpg

        conn = await asyncpg.connect(async_url(url).replace("postgresql+asyncpg", "postgresql"))
        try:
            await conn.copy_records_to_table(
                "users",
                records=users_rows,
                columns=["id", "name", "token_hash", "is_admin", "created_at"],
            )
            await conn.copy_records_to_table(
                "goods",
                records=goods_rows,
                columns=[
                    "id",
                    "seller_id",
                    "title",
                    "price",
                    "status",
                    "reserved_order_id",
                    "created_at",
                    "updated_at",
                ],
            )
            await conn.copy_records_to_table(
                "orders",
                records=order_rows,
                columns=[
                    "id",
                    "flow",
                    "order_type",
                    "buyer_id",
                    "seller_id",
                    "goods_id",
                    "amount",
                    "status",
                    "created_at",
                    "pay_deadline",
                    "updated_at",
                ],
            )
            await conn.copy_records_to_table(
                "order_lines",
                records=line_rows,
                columns=["id", "order_id", "kind", "item_id", "label", "quantity", "price"],
            )
            await conn.copy_records_to_table(
                "timers",
                records=timer_rows,
                columns=[
                    "id",
                    "order_id",
                    "kind",
                    "deadline_at",
                    "due_at",
                    "state",
                    "attempts",
                    "stuck",
                    "created_at",
                ],
            )
            for table in ("users", "goods", "orders", "order_lines", "timers"):
                await conn.execute(
                    f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))"
                )
            await conn.execute("ANALYZE")
        finally:
            await conn.close()
        return
    async with db.engine.begin() as conn:
        raw = await conn.get_raw_connection()
        cursor = raw.driver_connection.cursor()
        await cursor.executemany(
            "INSERT INTO users (id, name, token_hash, is_admin, created_at) VALUES (%s,%s,%s,%s,%s)",
            users_rows,
        )
        for start in range(0, count, 20_000):
            await cursor.executemany(
                "INSERT INTO goods (id, seller_id, title, price, status, reserved_order_id, created_at, updated_at)"
                " VALUES (%s,%s,%s,%s,%s,%s,%s,%s)",
                goods_rows[start : start + 20_000],
            )
            await cursor.executemany(
                "INSERT INTO orders (id, flow, order_type, buyer_id, seller_id, goods_id, amount, status,"
                " created_at, pay_deadline, updated_at) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)",
                order_rows[start : start + 20_000],
            )
            await cursor.executemany(
                "INSERT INTO order_lines (id, order_id, kind, item_id, label, quantity, price)"
                " VALUES (%s,%s,%s,%s,%s,%s,%s)",
                line_rows[start : start + 20_000],
            )
            await cursor.executemany(
                "INSERT INTO timers (id, order_id, kind, deadline_at, due_at, state, attempts, stuck, created_at)"
                " VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s)",
                timer_rows[start : start + 20_000],
            )


async def set_due(db: Database, due: datetime) -> None:
    """Move every pay deadline and timer to ``due``."""
    async with db.engine.begin() as conn:
        await conn.execute(update(orders).values(pay_deadline=due))
        await conn.execute(update(timers).values(due_at=due, deadline_at=due))


async def add_reminders(db: Database, due: datetime) -> None:
    """A ``pay_reminder`` timer for every order, due (and its deadline) at ``due``."""
    columns = ["order_id", "kind", "deadline_at", "due_at", "state", "attempts", "stuck"]
    columns.append("created_at")
    rows = select(
        timers.c.order_id,
        literal("pay_reminder"),
        literal(due, timers.c.due_at.type),
        literal(due, timers.c.due_at.type),
        literal("scheduled"),
        literal(0),
        literal(False),
        timers.c.created_at,
    ).where(timers.c.kind == "cancel_unpaid")
    async with db.engine.begin() as conn:
        await conn.execute(insert(timers).from_select(columns, rows))


async def reminders_settled(db: Database) -> dict[str, Any]:
    """The reminders' timers by state and outcome, and the lateness of those that ran."""
    async with db.report() as conn:
        rows = (
            await conn.execute(
                select(
                    timers.c.state, timers.c.outcome, timers.c.deadline_at, timers.c.done_at
                ).where(timers.c.kind == "pay_reminder")
            )
        ).all()
    counts: dict[str, int] = {}
    for row in rows:
        key = f"{row.state}: {row.outcome}" if row.outcome else row.state
        counts[key] = counts.get(key, 0) + 1
    late = sorted((r.done_at - r.deadline_at).total_seconds() for r in rows if r.done_at)
    return {
        "by_outcome": counts,
        "lateness_max_s": round(late[-1], 3) if late else None,
    }


async def cancelled(db: Database) -> int:
    async with db.report() as conn:
        query = (
            select(func.count()).select_from(orders).where(orders.c.status == "cancelled_unpaid")
        )
        return int((await conn.execute(query)).scalar_one())


async def notices_sent(db: Database) -> tuple[int, datetime | None]:
    """How many order_closed notices are done (sent), and when the last of them was."""
    async with db.report() as conn:
        count, last = (
            await conn.execute(
                select(func.count(), func.max(timers.c.done_at)).where(
                    timers.c.state == "done", timers.c.kind == "order_closed"
                )
            )
        ).one()
    return int(count), last


async def outcome(db: Database) -> dict[str, Any]:
    """Lateness per done cancel timer, goods released, cancel events."""
    async with db.report() as conn:
        rows = (
            await conn.execute(
                # The cancels only: each cancel writes an order_closed notice timer too.
                select(timers.c.deadline_at, timers.c.done_at).where(
                    timers.c.state == "done", timers.c.kind == "cancel_unpaid"
                )
            )
        ).all()
        released = (
            await conn.execute(
                select(func.count())
                .select_from(goods)
                .where(goods.c.reserved_order_id.is_(None), goods.c.status == "on_sale")
            )
        ).scalar_one()
        events = (
            await conn.execute(
                select(func.count())
                .select_from(order_events)
                .where(order_events.c.event == "pay_timeout")
            )
        ).scalar_one()
    late = sorted((done - deadline).total_seconds() for deadline, done in rows)
    last = max((done for _, done in rows), default=None)
    return {
        "late": late,
        "last": last,
        "released": int(released),
        "events": int(events),
        "done": len(rows),
    }

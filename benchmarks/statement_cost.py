"""What one hot statement costs in CPU, by the way it is executed, on SQLite, PostgreSQL, MariaDB.

Inside a write transaction of dueflow's own ``Database.write()`` (migrated schema, seeded goods),
three statements of the place-order path are run N times each:

- ``select``: the goods by primary key (every column, typed: Decimal price, aware datetimes);
- ``update``: the guarded hold (``reserved_order_id`` set WHERE status = 'on_sale' AND
  reserved_order_id IS NULL), its row count read;
- ``insert``: an order inserted, its id returned.

Each is executed five ways:

- ``core``: as dueflow's store does today (``goods.get``, ``goods.hold_goods``,
  ``orders.insert_order``): a Core statement built per call, ``AsyncConnection.execute``, the
  compiled cache warm;
- ``core-prebuilt``: the Core statement built once with ``bindparam`` s, ``execute(stmt, params)``;
- ``driver-sql``: ``exec_driver_sql`` with the SQL compiled once, the parameters bound and the
  result typed by the same processors as ``hot``;
- ``hot``: :mod:`dueflow.store.hot`: compiled once per dialect, run on the driver connection;
- ``bare``: the driver itself with the SQL text and no typing at all (the floor).

Every round runs every (statement, way) pair for N statements in one transaction that is then
rolled back, the ways' order rotated per round; the figures are medians over the rounds of CPU
(``time.process_time``) and wall time (``time.perf_counter``) per statement. The database server
runs on the same machine: its CPU is not counted, the wall time includes it.

    .venv/bin/python benchmarks/statement_cost.py                       # SQLite only
    .venv/bin/python benchmarks/statement_cost.py --postgres postgresql://postgres@127.0.0.1/bench \\
        --mysql mysql://root@127.0.0.1/bench --n 400 --rounds 7
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

sys.path.insert(0, str(Path(__file__).parent))
import _backends
from dueflow.store import goods as goods_store
from dueflow.store import hot
from dueflow.store import orders as orders_store
from dueflow.store.db import Database
from dueflow.store.schema import goods, orders, users

WAYS = ("core", "core-prebuilt", "driver-sql", "hot", "bare")
KINDS = ("select", "update", "insert")
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
PRICE = Decimal("12.50")

GOODS_BY_ID = select(goods).where(goods.c.id == bindparam("goods_id"))
HOLD = (
    update(goods)
    .where(
        goods.c.id == bindparam("goods_id"),
        goods.c.status == goods_store.ON_SALE,
        goods.c.reserved_order_id.is_(None),
    )
    .values(reserved_order_id=bindparam("order_id"), updated_at=bindparam("now"))
)
NEW_ORDER = (
    insert(orders)
    .values(
        flow="marketplace",
        order_type="normal",
        buyer_id=bindparam("buyer_id"),
        seller_id=bindparam("seller_id"),
        goods_id=bindparam("goods_id"),
        amount=bindparam("amount"),
        status="pending_payment",
        created_at=bindparam("now"),
        pay_deadline=bindparam("deadline"),
        updated_at=bindparam("now"),
    )
    .returning(orders.c.id)
)
HOT = {"select": hot.Hot(GOODS_BY_ID), "update": hot.Hot(HOLD), "insert": hot.Hot(NEW_ORDER)}
CORE = {"select": GOODS_BY_ID, "update": HOLD, "insert": NEW_ORDER}


class Rollback(Exception):
    """Raised to end a measuring transaction without keeping what it wrote."""


def params(kind: str, goods_id: int) -> dict[str, Any]:
    """The parameters of one statement of ``kind`` on these goods."""
    if kind == "select":
        return {"goods_id": goods_id}
    if kind == "update":
        return {"goods_id": goods_id, "order_id": goods_id, "now": NOW}
    return {
        "buyer_id": 2,
        "seller_id": 1,
        "goods_id": goods_id,
        "amount": PRICE,
        "now": NOW,
        "deadline": NOW + timedelta(minutes=15),
    }


async def core(conn: AsyncConnection, kind: str, goods_id: int) -> Any:
    """Today's store functions."""
    if kind == "select":
        return await goods_store.get(conn, goods_id)
    if kind == "update":
        return await goods_store.hold_goods(conn, goods_id, goods_id, NOW)
    values = params(kind, goods_id)
    return await orders_store.insert_order(
        conn,
        flow="marketplace",
        order_type="normal",
        buyer_id=2,
        seller_id=1,
        goods_id=goods_id,
        amount=PRICE,
        status="pending_payment",
        created_at=NOW,
        pay_deadline=values["deadline"],
        updated_at=NOW,
    )


async def core_prebuilt(conn: AsyncConnection, kind: str, goods_id: int) -> Any:
    """The Core statement built once."""
    result = await conn.execute(CORE[kind], params(kind, goods_id))
    if kind == "update":
        return result.rowcount == 1
    return result.first()


async def driver_sql(conn: AsyncConnection, kind: str, goods_id: int) -> Any:
    """``exec_driver_sql`` with the SQL and processors of the hot plan (built once)."""
    plan = HOT[kind].plan(conn.dialect)
    given = params(kind, goods_id)
    args = tuple(
        value if name is None else given[name] if bind is None else bind(given[name])
        for (name, value), bind in zip(plan.slots, plan.binders, strict=True)
    )
    result = await conn.exec_driver_sql(plan.sql, args)
    if kind == "update":
        return result.rowcount == 1
    row = result.first()
    return None if row is None else hot._typed(plan, row)


async def hot_way(conn: AsyncConnection, kind: str, goods_id: int) -> Any:
    """dueflow.store.hot."""
    if kind == "update":
        return await HOT[kind].rowcount(conn, **params(kind, goods_id)) == 1
    return await HOT[kind].first(conn, **params(kind, goods_id))


def bare_for(db: Database) -> Callable[[AsyncConnection, str, int], Awaitable[Any]]:
    """The driver alone: SQL text, naive datetimes by hand, rows as the driver gives them."""
    naive = NOW.replace(tzinfo=None)
    deadline = naive + timedelta(minutes=15)
    price: Any = str(PRICE) if db.dialect == "sqlite" else PRICE

    def args(conn: AsyncConnection, kind: str, goods_id: int) -> tuple[str, tuple[Any, ...]]:
        sql = HOT[kind].plan(conn.dialect).sql
        if kind == "select":
            return sql, (goods_id,)
        if kind == "update":
            return sql, (goods_id, naive, goods_id, "on_sale")
        order = ("marketplace", "normal", 2, 1, goods_id, price, "pending_payment", naive)
        if db.dialect == "postgresql":  # $8 (now) stands for updated_at too
            return sql, (*order, deadline)
        return sql, (*order, deadline, naive)

    async def on_asyncpg(conn: AsyncConnection, kind: str, goods_id: int) -> Any:
        driver = (await conn.get_raw_connection()).driver_connection
        sql, values = args(conn, kind, goods_id)
        if kind == "update":
            return await driver.execute(sql, *values) == "UPDATE 1"
        return await driver.fetchrow(sql, *values)

    async def on_cursor(conn: AsyncConnection, kind: str, goods_id: int) -> Any:
        driver = (await conn.get_raw_connection()).driver_connection
        sql, values = args(conn, kind, goods_id)
        if db.dialect == "mysql":
            cursor = driver.cursor()
            await cursor.execute(sql, values)
        else:
            cursor = await driver.execute(sql, values)
        try:
            return cursor.rowcount == 1 if kind == "update" else await cursor.fetchone()
        finally:
            await cursor.close()

    return on_asyncpg if db.dialect == "postgresql" else on_cursor


async def seed(db: Database, count: int) -> None:
    """A seller, a buyer and ``count`` goods on sale (ids 1..count)."""
    async with db.write() as conn:
        await conn.execute(
            insert(users),
            [
                {
                    "id": 1,
                    "name": "seller",
                    "token_hash": "s",
                    "is_admin": False,
                    "created_at": NOW,
                },
                {"id": 2, "name": "buyer", "token_hash": "b", "is_admin": False, "created_at": NOW},
            ],
        )
        rows = [
            {
                "id": i,
                "seller_id": 1,
                "title": f"item {i}",
                "price": PRICE,
                "status": "on_sale",
                "created_at": NOW,
                "updated_at": NOW,
            }
            for i in range(1, count + 1)
        ]
        await conn.execute(insert(goods), rows)


async def measure(db: Database, n: int, rounds: int) -> dict[tuple[str, str], tuple[float, float]]:
    """(kind, way) -> (median µs CPU, median µs wall) per statement."""
    ways = {
        "core": core,
        "core-prebuilt": core_prebuilt,
        "driver-sql": driver_sql,
        "hot": hot_way,
        "bare": bare_for(db),
    }
    await seed(db, n * len(WAYS))
    try:
        async with db.write() as conn:  # the hot plans learn their result types
            for kind in KINDS:
                await hot_way(conn, kind, 1)
            raise Rollback
    except Rollback:
        pass
    samples: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for number in range(rounds + 1):  # round 0 warms every cache up and is not counted
        order = WAYS[number % len(WAYS) :] + WAYS[: number % len(WAYS)]
        try:
            async with db.write() as conn:
                for kind in KINDS:
                    for way in order:
                        base = WAYS.index(way) * n
                        run = ways[way]
                        cpu, wall = time.process_time(), time.perf_counter()
                        for goods_id in range(base + 1, base + n + 1):
                            await run(conn, kind, goods_id)
                        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                        if number:
                            samples[(kind, way)].append((cpu * 1e6 / n, wall * 1e6 / n))
                await check(conn, n)
                raise Rollback
        except Rollback:
            pass
    return {
        key: (statistics.median(c for c, _ in got), statistics.median(w for _, w in got))
        for key, got in samples.items()
    }


async def check(conn: AsyncConnection, n: int) -> None:
    """Every way held its own n goods and inserted n orders, and the hot row is typed."""
    held = await conn.execute(select(goods.c.id).where(goods.c.reserved_order_id.is_not(None)))
    assert len(held.all()) == n * len(WAYS), "a guarded update missed"
    row = await HOT["select"].first(conn, goods_id=1)
    assert row is not None and row.price == PRICE and row.created_at == NOW, row


async def backend(name: str, url: str, n: int, rounds: int) -> dict[Any, tuple[float, float]]:
    db = await _backends.fresh(url)
    try:
        return await measure(db, n, rounds)
    finally:
        await db.dispose()


def table(results: dict[str, dict[Any, tuple[float, float]]]) -> str:
    lines = ["| backend | statement | " + " | ".join(WAYS) + " | hot saves |"]
    lines.append("|" + "---|" * (len(WAYS) + 3))
    for name, got in results.items():
        for kind in KINDS:
            cells = [f"{got[(kind, w)][0]:.0f} / {got[(kind, w)][1]:.0f}" for w in WAYS]
            saved = 1 - got[(kind, "hot")][0] / got[(kind, "core")][0]
            lines.append(f"| {name} | {kind} | " + " | ".join(cells) + f" | {saved:.0%} |")
    lines.append("(µs per statement: CPU of this process / wall; medians over the rounds)")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> None:
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        targets = {"sqlite": f"sqlite:///{tmp}/cost.db"}
        if args.postgres:
            targets["postgresql"] = args.postgres
        if args.mysql:
            targets["mariadb"] = args.mysql
        for name, url in targets.items():
            if name in args.only or not args.only:
                results[name] = await backend(name, url, args.n, args.rounds)
    print(table(results))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=300, help="statements per (kind, way) a round")
    parser.add_argument("--rounds", type=int, default=5, help="counted rounds")
    parser.add_argument("--postgres", help="a PostgreSQL URL (its tables are dropped)")
    parser.add_argument("--mysql", help="a MySQL/MariaDB URL (its tables are dropped)")
    parser.add_argument("--only", nargs="*", default=[], help="sqlite, postgresql, mariadb")
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop")
    args = parser.parse_args()
    if args.uvloop:
        import uvloop

        uvloop.run(main_async(args))
    else:
        asyncio.run(main_async(args))


if __name__ == "__main__":
    main()

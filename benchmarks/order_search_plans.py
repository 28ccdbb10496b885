"""The plans of the operators' order list (store/order_search.py) on PostgreSQL over a big
table: seeds ``--orders`` orders (1,000 users; statuses as a busy marketplace has them, 70 %
completed, 0.2 % cancelled by the seller; 30 s apart from 2026-01-01; a paid attempt for each
paid order, a refund for each cancelled after payment), then prints, for a first page of each
filter and search, the scan that reads ``orders`` and the time ``EXPLAIN ANALYZE`` measured
(figures in docs/admin.md, "Orders to find: the reads").

    .venv/bin/python benchmarks/order_search_plans.py \
        --database-url postgresql://postgres@127.0.0.1/order_plans

The database is emptied and migrated first (so use one of its own); ``--reuse`` keeps one
seeded by an earlier run.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from sqlalchemy import text
from sqlalchemy.dialects import postgresql

import _backends
from dueflow.store import order_search
from dueflow.store.db import Database
from dueflow.store.order_search import OrderFilter

SEED = [
    """INSERT INTO users (name, token_hash, is_admin, created_at)
    SELECT 'user' || g, md5(g::text) || md5((g + 1)::text), false, now()
    FROM generate_series(1, 1000) g""",
    """INSERT INTO orders (flow, order_type, buyer_id, seller_id, amount, status, created_at,
                           pay_deadline, updated_at)
    SELECT (ARRAY['marketplace', 'marketplace', 'marketplace', 'tickets', 'shop'])[1 + g % 5],
           'normal', 1 + (hashint4(g) & 1023) % 1000, 1 + (hashint4(g + 7) & 127) % 100, 12.50,
           CASE WHEN g % 1000 < 700 THEN 'completed' WHEN g % 1000 < 850 THEN 'cancelled_unpaid'
                WHEN g % 1000 < 860 THEN 'pending_payment'
                WHEN g % 1000 < 890 THEN 'pending_shipment'
                WHEN g % 1000 < 940 THEN 'shipped' WHEN g % 1000 < 960 THEN 'received'
                WHEN g % 1000 < 990 THEN 'cancelled_by_buyer'
                WHEN g % 1000 < 998 THEN 'cancelled_unshipped'
                ELSE 'cancelled_by_seller' END,
           timestamp '2026-01-01' + g * interval '30 seconds',
           timestamp '2026-01-01' + g * interval '30 seconds' + interval '30 minutes',
           timestamp '2026-01-01' + g * interval '30 seconds'
    FROM generate_series(1, :orders) g""",
    """INSERT INTO payments (pay_no, order_id, provider, amount, expires_at, state, created_at)
    SELECT '20260101' || lpad(to_hex(id), 16, '0'), id, 'alipay', 12.50, created_at, 'paid',
           created_at
    FROM orders WHERE status NOT IN ('cancelled_unpaid', 'pending_payment')""",
    """INSERT INTO refunds (refund_no, order_id, payment_id, provider, amount, reason, state,
                            created_at, updated_at)
    SELECT 'R' || p.pay_no, p.order_id, p.id, 'alipay', 12.50, 'seller_cancel', 'succeeded',
           p.created_at, p.created_at
    FROM payments p JOIN orders o ON o.id = p.order_id
    WHERE o.status IN ('cancelled_unshipped', 'cancelled_by_seller')""",
]


def _at(year: int, month: int, day: int) -> datetime:
    return datetime(year, month, day, tzinfo=UTC)


CASES = {
    "nothing": OrderFilter(),
    "a common status": OrderFilter(status="completed"),
    "a rare status": OrderFilter(status="cancelled_by_seller"),
    "pending_payment": OrderFilter(status="pending_payment"),
    "a flow": OrderFilter(flow="tickets"),
    "a buyer (id)": OrderFilter(buyer=17),
    "a buyer (name)": OrderFilter(buyer="user17"),
    "a seller and a status": OrderFilter(seller=5, status="shipped"),
    "one old day": OrderFilter(placed_from=_at(2026, 2, 1), placed_before=_at(2026, 2, 2)),
    "an old week, pending_payment": OrderFilter(
        status="pending_payment", placed_from=_at(2026, 2, 1), placed_before=_at(2026, 2, 8)
    ),
    "months ending long ago": OrderFilter(
        placed_from=_at(2026, 1, 2), placed_before=_at(2026, 6, 1)
    ),
    "months ending long ago, page 2": OrderFilter(
        placed_from=_at(2026, 1, 2), placed_before=_at(2026, 6, 1)
    ),
    "months, a buyer": OrderFilter(
        buyer=17, placed_from=_at(2026, 1, 2), placed_before=_at(2026, 6, 1)
    ),
    "months, a rare status": OrderFilter(
        status="cancelled_by_seller", placed_from=_at(2026, 1, 2), placed_before=_at(2026, 6, 1)
    ),
    "a recent week, pending_payment": OrderFilter(
        status="pending_payment", placed_from=_at(2026, 11, 1), placed_before=_at(2026, 11, 8)
    ),
    "search: an order id": OrderFilter(search="123456"),
    "search: a pay_no": OrderFilter(search="20260101" + format(500001, "016x")),
    "search: a refund_no": OrderFilter(search="R20260101" + format(1999, "016x")),
    "search: a ticket code": OrderFilter(search="abcdefghijklmnopqrstuv"),
}


async def seed(db: Database, count: int) -> None:
    async with db.engine.begin() as conn:
        for statement in SEED:
            await conn.execute(text(statement), {"orders": count} if ":orders" in statement else {})
    async with db.engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.execute(text("ANALYZE"))


async def plans(db: Database) -> None:
    for name, kept in CASES.items():
        # A later page starts below an order of the span (the cursor names one).
        after = 200_000 if name.endswith("page 2") else None
        query = order_search.page_query(kept, after=after, limit=50)
        sql = str(
            query.compile(dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True})
        )
        async with db.engine.connect() as conn:
            await conn.execute(text("EXPLAIN (ANALYZE, COSTS OFF) " + sql))  # warm the pages
            lines = [
                row[0] for row in await conn.execute(text("EXPLAIN (ANALYZE, COSTS OFF) " + sql))
            ]
        scans = [
            re.sub(r"\s*\(actual.*", "", line).strip(" ->")
            for line in lines
            if re.search(r"Scan.* on orders\b|Scan.* on orders_1\b", line)
        ]
        total = next(line for line in lines if line.startswith("Execution Time"))
        print(f"{name:32} {total.split(': ')[1]:>12}  {'; '.join(scans)}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--orders", type=int, default=1_000_000)
    parser.add_argument("--reuse", action="store_true", help="keep the seeded database")
    args = parser.parse_args()
    if args.reuse:
        db = Database.from_url(args.database_url)
    else:
        db = await _backends.fresh(args.database_url)
        await seed(db, args.orders)
    try:
        if db.dialect != "postgresql":
            raise SystemExit("the plans are PostgreSQL's: give a postgresql:// URL")
        await plans(db)
    finally:
        await db.dispose()


if __name__ == "__main__":
    asyncio.run(main())

"""Seed a PostgreSQL database with a million orders in every status, for the dashboard's figures.

Every row is written by ``INSERT ... SELECT generate_series`` on the server (no row crosses the
wire), consistent enough for every invariant of ``dueflow status --full`` to hold:

- marketplace orders (95 in every 100 ids), each holding its own goods: pending_payment (2),
  pending_shipment (2), shipped (2), received (2), completed (52), cancelled_unpaid (30),
  cancelled_unshipped (5); tickets orders (5 in 100), one seat each: paid (3, their seats sold
  and a valid ticket) and cancelled_paid (2, in cancelled shows, a void ticket, no seat held);
- a live order waits on its deadline (in the future: a day at least, so the database stays
  consistent that long with no worker running) with the scheduled timer of that deadline;
  every cancelled order has one order_closed timer (done; a few parked: needs attention), a
  completed one its done auto_review timer, some of them done within the last hour (lateness);
- a payment per paid order; a refund per cancelled paid order (succeeded, some pending review,
  processing since long ago, failed), a few discrepancies;
- two events per order (placed, then the move that left it where it is), numbered.

The database ``dueflow_bench_million`` is dropped and made again (never a test database)::

    .venv/bin/python benchmarks/seed_orders.py                # 1,000,000 orders
    .venv/bin/python benchmarks/seed_orders.py --orders 100000 \\
        --url postgresql://postgres@127.0.0.1:5432/dueflow_bench_million

Then ``DUEFLOW_DATABASE_URL=<url> dueflow status`` and the admin pages read it (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import time

import asyncpg

from dueflow.store import migrate
from dueflow.store.db import Database

URL = "postgresql://postgres@127.0.0.1:5432/dueflow_bench_million"
SELLERS = 100
BUYERS = 10_000
#: Order ids per pair of shows (one on sale, one cancelled): 300 paid and 200 cancelled_paid
#: tickets orders each.
SHOW_SPAN = 10_000

#: The status of order ``i`` from ``i % 100`` (SQL).
STATUS = """CASE
  WHEN i % 100 < 2 THEN 'pending_payment' WHEN i % 100 < 4 THEN 'pending_shipment'
  WHEN i % 100 < 6 THEN 'shipped' WHEN i % 100 < 8 THEN 'received'
  WHEN i % 100 < 60 THEN 'completed' WHEN i % 100 < 90 THEN 'cancelled_unpaid'
  WHEN i % 100 < 95 THEN 'cancelled_unshipped' WHEN i % 100 < 98 THEN 'paid'
  ELSE 'cancelled_paid' END"""

#: Every order: id, m, its status, flow, buyer, seller, when placed (newest ids latest, one
#: order a minute back from now), when it last moved.
ORDERS = f"""
CREATE UNLOGGED TABLE seed AS
SELECT i AS id, {STATUS} AS status,
       CASE WHEN i % 100 < 95 THEN 'marketplace' ELSE 'tickets' END AS flow,
       {SELLERS + 1} + (i % {BUYERS}) AS buyer_id, 1 + (i % {SELLERS}) AS seller_id,
       now() AT TIME ZONE 'UTC' - make_interval(mins => (:n - i)) AS placed,
       CASE WHEN i % 100 >= 95 THEN 2 * ((i - 1) / {SHOW_SPAN})
            + CASE WHEN i % 100 < 98 THEN 1 ELSE 2 END END AS show_id
FROM generate_series(1, :n) AS i;
ALTER TABLE seed ADD COLUMN moved timestamp;
UPDATE seed SET moved = CASE
  WHEN status IN ('pending_payment', 'pending_shipment', 'shipped', 'received')
  THEN now() AT TIME ZONE 'UTC' - make_interval(secs => (id % 600))
  ELSE placed + interval '10 minutes' END;
"""

STEPS: list[tuple[str, str]] = [
    ("seed rows", ORDERS),
    (
        "users",
        f"""INSERT INTO users (id, name, token_hash, is_admin, created_at)
        SELECT u, 'user' || u, md5(u::text), u = 1, now() AT TIME ZONE 'UTC'
        FROM generate_series(1, {SELLERS + BUYERS}) AS u""",
    ),
    (
        "shows, seats",
        f"""INSERT INTO shows (id, organizer_id, title, venue, starts_at, sales_close_at,
            seat_limit, status, cancelled_at, created_at, updated_at)
        SELECT s, 1 + s % {SELLERS}, 'show ' || s, 'hall', now() AT TIME ZONE 'UTC' + interval '30 days',
            now() AT TIME ZONE 'UTC' + interval '29 days', 6,
            CASE WHEN s % 2 = 0 THEN 'cancelled' ELSE 'on_sale' END,
            CASE WHEN s % 2 = 0 THEN now() AT TIME ZONE 'UTC' END,
            now() AT TIME ZONE 'UTC', now() AT TIME ZONE 'UTC'
        FROM generate_series(1, 2 * ((:n - 1) / {SHOW_SPAN} + 1)) AS s;
        INSERT INTO seats (id, show_id, label, section, row, number, tier, price)
        SELECT id, show_id, 'A-' || id, 'A', 'A', id, 'A', 80.00 FROM seed WHERE flow = 'tickets'""",
    ),
    (
        "goods",
        """INSERT INTO goods (id, seller_id, title, price, status, reserved_order_id, created_at,
            updated_at)
        SELECT id, seller_id, 'goods ' || id, 12.50,
            CASE WHEN status LIKE 'cancelled%' OR status = 'pending_payment' THEN 'on_sale'
                 ELSE 'sold' END,
            CASE WHEN status LIKE 'cancelled%' THEN NULL ELSE id END, placed, moved
        FROM seed WHERE flow = 'marketplace'""",
    ),
    (
        "orders",
        """INSERT INTO orders (id, flow, order_type, buyer_id, seller_id, goods_id, show_id, amount,
            status, created_at, pay_deadline, paid_at, ship_deadline, shipped_at, carrier,
            tracking_no, receive_deadline, received_at, review_deadline, completed_at,
            cancelled_at, cancel_reason, updated_at)
        SELECT id, flow, 'normal', buyer_id, seller_id,
            CASE WHEN flow = 'marketplace' THEN id END, show_id,
            CASE WHEN flow = 'marketplace' THEN 12.50 ELSE 80.00 END, status, placed,
            CASE WHEN status = 'pending_payment' THEN moved + interval '1 day'
                 ELSE placed + interval '15 minutes' END,
            CASE WHEN status NOT IN ('pending_payment', 'cancelled_unpaid') THEN placed + interval '1 minute' END,
            CASE WHEN status = 'pending_shipment' THEN moved + interval '2 days'
                 WHEN flow = 'marketplace' AND status NOT IN ('pending_payment', 'cancelled_unpaid')
                 THEN placed + interval '2 days' END,
            CASE WHEN status IN ('shipped', 'received', 'completed') THEN placed + interval '2 minutes' END,
            CASE WHEN status IN ('shipped', 'received', 'completed') THEN 'SF' END,
            CASE WHEN status IN ('shipped', 'received', 'completed') THEN 'T' || id END,
            CASE WHEN status = 'shipped' THEN moved + interval '7 days'
                 WHEN status IN ('received', 'completed') THEN placed + interval '7 days' END,
            CASE WHEN status IN ('received', 'completed') THEN placed + interval '3 minutes' END,
            CASE WHEN status = 'received' THEN moved + interval '7 days'
                 WHEN status = 'completed' THEN placed + interval '7 days' END,
            CASE WHEN status = 'completed' THEN moved END,
            CASE WHEN status LIKE 'cancelled%' THEN moved END,
            CASE WHEN status = 'cancelled_unpaid' THEN 'pay_timeout'
                 WHEN status = 'cancelled_unshipped' THEN 'ship_timeout'
                 WHEN status = 'cancelled_paid' THEN 'show_cancel' END,
            moved
        FROM seed""",
    ),
    (
        "order lines",
        """INSERT INTO order_lines (id, order_id, kind, item_id, label, quantity, price)
        SELECT id, id, CASE WHEN flow = 'marketplace' THEN 'goods' ELSE 'seat' END, id,
            CASE WHEN flow = 'marketplace' THEN 'goods ' || id ELSE 'A-' || id END, 1,
            CASE WHEN flow = 'marketplace' THEN 12.50 ELSE 80.00 END
        FROM seed""",
    ),
    (
        "seat holds, buyers, tickets",
        """INSERT INTO seat_holds (id, show_id, seat_id, order_id, buyer_id, state, created_at,
            updated_at)
        SELECT id, show_id, id, id, buyer_id, 'sold', placed, moved FROM seed WHERE status = 'paid';
        INSERT INTO show_buyers (show_id, buyer_id, seats)
        SELECT show_id, buyer_id, count(*) FROM seat_holds GROUP BY show_id, buyer_id;
        INSERT INTO tickets (id, code, order_id, show_id, seat_id, state, created_at)
        SELECT id, md5('ticket' || id), id, show_id, id,
            CASE WHEN status = 'paid' THEN 'valid' ELSE 'void' END, placed
        FROM seed WHERE flow = 'tickets'""",
    ),
    (
        "payments",
        """INSERT INTO payments (id, pay_no, order_id, provider, amount, expires_at, state,
            provider_trade_no, created_at, handled_at, start_answer)
        SELECT id, 'P' || id, id, 'alipay', CASE WHEN flow = 'marketplace' THEN 12.50 ELSE 80.00 END,
            placed + interval '15 minutes', 'paid', 'T' || id, placed, placed + interval '1 minute',
            'created'
        FROM seed WHERE status NOT IN ('pending_payment', 'cancelled_unpaid')""",
    ),
    (
        "refunds, discrepancies",
        """INSERT INTO refunds (id, refund_no, order_id, payment_id, provider, amount, reason,
            state, last_error, created_at, updated_at)
        SELECT id, 'R' || id, id, id, 'alipay', CASE WHEN flow = 'marketplace' THEN 12.50 ELSE 80.00 END,
            CASE WHEN status = 'cancelled_paid' THEN 'show_cancel' ELSE 'ship_timeout' END,
            CASE WHEN id % 20000 = 91 THEN 'failed' WHEN id % 20000 = 92 THEN 'processing'
                 WHEN id % 20000 = 99 THEN 'pending_review' ELSE 'succeeded' END,
            CASE WHEN id % 20000 = 91 THEN 'ACQ.TRADE_HAS_CLOSE' END, moved, moved
        FROM seed WHERE status IN ('cancelled_unshipped', 'cancelled_paid');
        INSERT INTO discrepancies (kind, order_id, payment_id, detail, created_at)
        SELECT 'paid_after_cancel', id, id, 'paid after the cancel', moved
        FROM seed WHERE status = 'cancelled_unshipped' AND id % 100000 = 90""",
    ),
    (
        "timers",
        """INSERT INTO timers (order_id, kind, deadline_at, due_at, state, attempts, failures,
            stuck, last_error, created_at, done_at)
        SELECT id, kind, due, due, 'scheduled', 0, 0, false, NULL, moved, NULL FROM (
            SELECT id, moved, CASE status WHEN 'pending_payment' THEN 'cancel_unpaid'
                WHEN 'pending_shipment' THEN 'cancel_unshipped' WHEN 'shipped' THEN 'confirm_receipt'
                ELSE 'auto_review' END AS kind,
                CASE status WHEN 'pending_payment' THEN moved + interval '1 day'
                WHEN 'pending_shipment' THEN moved + interval '2 days' ELSE moved + interval '7 days'
                END AS due
            FROM seed WHERE status IN ('pending_payment', 'pending_shipment', 'shipped', 'received')
        ) AS live;
        INSERT INTO timers (order_id, kind, deadline_at, due_at, state, attempts, failures,
            stuck, last_error, created_at, done_at)
        SELECT id, 'order_closed', moved, moved,
            CASE WHEN id % 100000 = 61 THEN 'parked' ELSE 'done' END,
            CASE WHEN id % 100000 = 61 THEN 5 ELSE 1 END,
            CASE WHEN id % 100000 = 61 THEN 5 ELSE 0 END, false,
            CASE WHEN id % 100000 = 61 THEN 'notifier unreachable' END, moved,
            CASE WHEN id % 100000 = 61 THEN NULL ELSE moved END
        FROM seed WHERE status LIKE 'cancelled%';
        INSERT INTO timers (order_id, kind, deadline_at, due_at, state, attempts, failures,
            stuck, created_at, done_at)
        SELECT id, 'auto_review', moved - interval '1 second', moved - interval '1 second', 'done',
            1, 0, false, placed, CASE WHEN id > :n - 3000 THEN now() AT TIME ZONE 'UTC'
            - make_interval(secs => (:n - id)) ELSE moved END
        FROM seed WHERE status = 'completed'""",
    ),
    (
        "events",
        """INSERT INTO order_events (order_id, at, event, actor, from_status, to_status, detail,
            seq)
        SELECT id, placed, 'placed', 'buyer:' || buyer_id, NULL, 'pending_payment', NULL, 2 * id - 1
        FROM seed;
        INSERT INTO order_events (order_id, at, event, actor, from_status, to_status, detail, seq)
        SELECT id, moved, CASE status WHEN 'pending_shipment' THEN 'pay' WHEN 'paid' THEN 'pay'
                WHEN 'shipped' THEN 'ship' WHEN 'received' THEN 'confirm_receipt'
                WHEN 'completed' THEN 'review_timeout' WHEN 'cancelled_unpaid' THEN 'pay_timeout'
                WHEN 'cancelled_unshipped' THEN 'ship_timeout' ELSE 'show_cancel' END,
            'system', CASE WHEN status IN ('pending_shipment', 'paid', 'cancelled_unpaid')
                THEN 'pending_payment' WHEN status = 'shipped' THEN 'pending_shipment'
                WHEN status = 'received' THEN 'shipped' WHEN status = 'completed' THEN 'received'
                WHEN status = 'cancelled_unshipped' THEN 'pending_shipment' ELSE 'paid' END,
            status, NULL, 2 * id
        FROM seed WHERE status <> 'pending_payment';
        UPDATE event_sequence SET last_seq = (SELECT max(seq) FROM order_events)""",
    ),
]

SEQUENCES = [
    "users",
    "shows",
    "seats",
    "goods",
    "orders",
    "order_lines",
    "seat_holds",
    "tickets",
    "payments",
    "refunds",
    "discrepancies",
    "timers",
    "order_events",
]


async def seed(url: str, n: int) -> dict[str, float]:
    """Drop and make the database at ``url``, migrate it, seed ``n`` orders; seconds per step."""
    base, _, name = url.rpartition("/")
    if not name.startswith("dueflow_bench"):
        raise SystemExit(f"refusing to drop {name!r}: the benchmark's database is dueflow_bench_*")
    admin = await asyncpg.connect(f"{base}/postgres")
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    db = Database.from_url(url)
    try:
        await migrate.upgrade(db)
    finally:
        await db.dispose()
    took: dict[str, float] = {}
    conn = await asyncpg.connect(url)
    try:
        for label, sql in STEPS:
            started = time.perf_counter()
            async with conn.transaction():
                await conn.execute(sql.replace(":n", str(n)))
            took[label] = time.perf_counter() - started
            print(f"{label:30} {took[label]:7.1f} s", flush=True)
        started = time.perf_counter()
        await conn.execute("DROP TABLE seed")
        for table in SEQUENCES:
            await conn.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'),"
                f" (SELECT coalesce(max(id), 1) FROM {table}))"
            )
        await conn.execute("VACUUM ANALYZE")
        took["vacuum analyze"] = time.perf_counter() - started
        print(f"{'vacuum analyze':30} {took['vacuum analyze']:7.1f} s", flush=True)
    finally:
        await conn.close()
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=URL)
    parser.add_argument("--orders", type=int, default=1_000_000)
    args = parser.parse_args()
    started = time.perf_counter()
    asyncio.run(seed(args.url, args.orders))
    print(f"{'total':30} {time.perf_counter() - started:7.1f} s")


if __name__ == "__main__":
    main()

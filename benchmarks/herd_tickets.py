"""The tickets herd: N unpaid tickets orders of one show, two seats each, whose pay deadline
falls in the same second.

The seed writes what placing each order writes: the order, its two seat lines, the seats' holds,
the buyer's count of seats for the show, its ``cancel_unpaid`` and ``pay_reminder`` timers, its
``place`` event (already numbered). Run and measured as the shop herd (``herd_shop.py``): the
workers start idle, every pay deadline and ``cancel_unpaid`` timer moves to the same second;
cancellations and ``order_closed`` notices per second, their lateness, the workers' peak RSS.
Then checked, failing the run (exit 1) otherwise: every order cancelled_unpaid by pay_timeout,
every seat free (no hold left), every buyer's count back to 0, one ``pay_timeout`` and one
``released`` event per order, one sent ``order_closed`` notice (one delivery) per order, every
timer finished as it should.

    .venv/bin/python benchmarks/herd_tickets.py --orders 10000            # SQLite
    .venv/bin/python benchmarks/herd_tickets.py --database-url postgresql://postgres@127.0.0.1/bench \\
        --workers 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from sqlalchemy import text

from dueflow.store.db import Database

sys.path.insert(0, str(Path(__file__).parent))
import _seed
import herd_shop

PRICE = Decimal("180.00")
SEATS = 2  # each order's
LIMIT = 4  # seats a buyer may hold

EVERY_ORDER = {
    "orders cancelled_unpaid by pay_timeout": (
        "SELECT count(*) FROM orders WHERE status = 'cancelled_unpaid' "
        "AND cancel_reason = 'pay_timeout'"
    ),
    "pay_timeout events": "SELECT count(*) FROM order_events WHERE event = 'pay_timeout'",
    "orders with a pay_timeout event": (
        "SELECT count(DISTINCT order_id) FROM order_events WHERE event = 'pay_timeout'"
    ),
    "released events naming the seats": (
        "SELECT count(*) FROM order_events WHERE event = 'released' "
        "AND detail LIKE 'seats %, % back on sale'"
    ),
    "orders with a released event": (
        "SELECT count(DISTINCT order_id) FROM order_events WHERE event = 'released'"
    ),
    **herd_shop.NOTICES_AND_TIMERS,
}
NONE_LEFT = {
    "seats still held": "SELECT count(*) FROM seat_holds",
    "seats still counted against buyers": "SELECT coalesce(sum(seats), 0) FROM show_buyers",
    "timers of other kinds": (
        "SELECT count(*) FROM timers WHERE kind NOT IN "
        "('cancel_unpaid', 'order_closed', 'pay_reminder')"
    ),
}

_COLUMNS = {
    "users": "id name token_hash is_admin created_at",
    "shows": (
        "id organizer_id title venue starts_at sales_close_at seat_limit status created_at "
        "updated_at"
    ),
    "seats": "id show_id label section row number tier price",
    "orders": (
        "id flow order_type buyer_id seller_id show_id amount status created_at pay_deadline "
        "updated_at"
    ),
    "order_lines": "id order_id kind item_id label quantity price",
    "seat_holds": "id show_id seat_id order_id buyer_id state created_at updated_at",
    "show_buyers": "show_id buyer_id seats",
    "timers": "id order_id kind deadline_at due_at state attempts stuck created_at",
    "order_events": "id order_id at event actor from_status to_status detail seq",
}
COLUMNS = {name: tuple(columns.split()) for name, columns in _COLUMNS.items()}


def tickets_rows(
    count: int, *, buyers: int, now: datetime, due: datetime
) -> dict[str, tuple[tuple[str, ...], list[tuple[Any, ...]]]]:
    """Every row placing ``count`` tickets orders of one show writes (and the show, its seats
    and the users), pay deadlines at ``due``; order i is buyer ``2 + (i - 1) % buyers``'s,
    holding seats A-(2i-1) and A-2i."""
    if count > buyers * (LIMIT // SEATS):
        raise ValueError(f"{count} orders of {SEATS} seats need {count * SEATS // LIMIT} buyers")
    seats, orders, lines, holds, timers, events = [], [], [], [], [], []
    counted: dict[int, int] = {}
    remind = due - timedelta(minutes=10)
    for i in range(1, count + 1):
        buyer = 2 + (i - 1) % buyers
        labels = []
        for seat_id in (2 * i - 1, 2 * i):
            label = f"A-{seat_id}"
            labels.append(label)
            seats.append((seat_id, 1, label, "A", None, seat_id, "A", PRICE))
            lines.append((seat_id, i, "seat", seat_id, label, 1, PRICE))
            holds.append((seat_id, 1, seat_id, i, buyer, "held", now, now))
        counted[buyer] = counted.get(buyer, 0) + SEATS
        amount = PRICE * SEATS
        orders.append(
            (i, "tickets", "ticket", buyer, 1, 1, amount, "pending_payment", now, due, now)
        )
        timers.append((2 * i - 1, i, "cancel_unpaid", due, due, "scheduled", 0, False, now))
        timers.append((2 * i, i, "pay_reminder", remind, remind, "scheduled", 0, False, now))
        events.append(
            (i, i, now, "place", f"user:{buyer}", None, "pending_payment",
             f"show 1 seats {', '.join(labels)} for {amount}", i)
        )  # fmt: skip
    users = [(1, "organizer", "h1", False, now)] + [
        (b, f"buyer{b}", f"h{b}", False, now) for b in range(2, buyers + 2)
    ]
    show = (
        1, 1, "Herd concert", "Hall 1", now + timedelta(days=30), now + timedelta(days=29),
        LIMIT, "on_sale", now, now,
    )  # fmt: skip
    rows = {
        "users": users,
        "shows": [show],
        "seats": seats,
        "orders": orders,
        "order_lines": lines,
        "seat_holds": holds,
        "show_buyers": [(1, buyer, n) for buyer, n in sorted(counted.items())],
        "timers": timers,
        "order_events": events,
    }
    return {name: (COLUMNS[name], rows[name]) for name in COLUMNS}


async def seed(db: Database, url: str, path: Path, args: argparse.Namespace) -> None:
    """The herd's rows, written in bulk, and the event counter past their numbered events."""
    now = datetime.now(UTC)
    tables = tickets_rows(args.orders, buyers=args.buyers, now=now, due=now + timedelta(days=7))
    if db.dialect == "sqlite":
        _seed.write_sqlite(path, tables)
    elif db.dialect == "postgresql":
        await _seed.copy_postgres(url, tables)
    else:
        raise SystemExit("herd_tickets runs on SQLite and PostgreSQL")
    async with db.engine.begin() as conn:
        await conn.execute(
            text("UPDATE event_sequence SET last_seq = :n WHERE id = 1"), {"n": args.orders}
        )


TICKETS = herd_shop.Flow(
    name="tickets",
    seed=seed,
    every_order=EVERY_ORDER,
    none_left=NONE_LEFT,
    figures={},
    more_failures=lambda args, found: [],
    parameters=lambda args: {"buyers": args.buyers},
)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--orders", type=int, default=100_000)
    parser.add_argument("--buyers", type=int, default=50_000, help="orders go round them")
    parser.add_argument("--database-url", default=None, help="default: a fresh SQLite file")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--lead", type=float, default=3.0, help="seconds from arming to due")
    parser.add_argument("--timeout", type=float, default=1800.0)
    herd_shop.add_reminders_flag(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dueflow-herd-tickets-") as tmp:
        result = asyncio.run(herd_shop.run(args, Path(tmp), TICKETS))
    failed = herd_shop.failures(args, result, TICKETS)
    result["ok"] = not failed
    result["failed"] = failed
    print(json.dumps(result), flush=True)
    if failed:
        print(f"TICKETS HERD CHECK FAILED: {'; '.join(failed)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

"""The shop herd: N unpaid shop orders, each of two SKU lines and a coupon, whose pay deadline
falls in the same second.

The seed writes what placing each order writes (tests/e2e/test_shop_benchmarks.py compares
it with a real placement): the order, its two SKU lines and its coupon line, the SKUs' units held, the coupon
locked to it, its ``cancel_unpaid`` and ``pay_reminder`` timers, its ``place`` event (already
numbered). Workers (``dueflow worker --no-scanner``, log notifier) start idle; then every pay
deadline and ``cancel_unpaid`` timer moves to the same second (the reminders stay ahead: they
are cancelled with their orders). Measured from that second: cancellations per second until
every order is cancelled, and notices per second until every ``order_closed`` notice the
cancels wrote is sent; lateness of both; the workers' peak RSS. Then checked, failing the run
(exit 1) otherwise: every order cancelled_unpaid by pay_timeout, every SKU back to its units
(stock = stocked, nothing held or sold), every coupon available and free, one ``pay_timeout``
and one ``released`` event per order, one sent ``order_closed`` notice (one delivery) per order,
every timer finished as it should.

    .venv/bin/python benchmarks/herd_shop.py --orders 10000            # SQLite
    .venv/bin/python benchmarks/herd_shop.py --database-url postgresql://postgres@127.0.0.1/bench \\
        --workers 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from sqlalchemy import text

from dueflow.service.operations import percentile
from dueflow.store.db import Database

sys.path.insert(0, str(Path(__file__).parent))
import _backends
import _seed

#: Units each SKU has left on sale beside what the herd holds.
SPARE = 10
OFF = Decimal("5.00")
MINIMUM = Decimal("20.00")
COUPON_TITLE = "5.00 off"

REMINDERS_CANCELLED = "pay_reminder timers cancelled"
#: What every flow's herd leaves for each order: its notice sent once, its timers settled.
NOTICES_AND_TIMERS = {
    "order_closed notices sent once": (
        "SELECT count(*) FROM reminders WHERE kind = 'order_closed' AND state = 'sent' "
        "AND deliveries = 1"
    ),
    "cancel_unpaid timers done": (
        "SELECT count(*) FROM timers WHERE kind = 'cancel_unpaid' AND state = 'done'"
    ),
    "order_closed timers done (sent)": (
        "SELECT count(*) FROM timers WHERE kind = 'order_closed' AND state = 'done' "
        "AND outcome = 'sent'"
    ),
    REMINDERS_CANCELLED: (
        "SELECT count(*) FROM timers WHERE kind = 'pay_reminder' AND state = 'cancelled'"
    ),
}

#: The checks after the run: name -> SQL answering one number that must equal the orders.
EVERY_ORDER = {
    "orders cancelled_unpaid by pay_timeout": (
        "SELECT count(*) FROM orders WHERE status = 'cancelled_unpaid' "
        "AND cancel_reason = 'pay_timeout'"
    ),
    "coupons available and free": (
        "SELECT count(*) FROM coupons WHERE state = 'available' AND order_id IS NULL"
    ),
    "pay_timeout events": "SELECT count(*) FROM order_events WHERE event = 'pay_timeout'",
    "orders with a pay_timeout event": (
        "SELECT count(DISTINCT order_id) FROM order_events WHERE event = 'pay_timeout'"
    ),
    "released events": "SELECT count(*) FROM order_events WHERE event = 'released'",
    "orders with a released event": (
        "SELECT count(DISTINCT order_id) FROM order_events WHERE event = 'released'"
    ),
    "released events naming sku and coupon": (
        "SELECT count(*) FROM order_events WHERE event = 'released' "
        "AND detail LIKE 'sku % back in stock; coupon % back to the buyer'"
    ),
    "order_closed notices": "SELECT count(*) FROM reminders WHERE kind = 'order_closed'",
    **NOTICES_AND_TIMERS,
}
#: name -> SQL answering one number that must be 0.
NONE_LEFT = {
    "skus not back to their units": (
        "SELECT count(*) FROM skus WHERE stock <> stocked OR held <> 0 OR sold <> 0"
    ),
    "timers of other kinds or states": (
        "SELECT count(*) FROM timers WHERE kind NOT IN "
        "('cancel_unpaid', 'order_closed', 'pay_reminder')"
    ),
}


#: The columns the seed writes, per table, parents first (the rest keep their defaults: NULL).
_COLUMNS = {
    "users": "id name token_hash is_admin created_at",
    "skus": "id seller_id title price stock held sold stocked created_at updated_at",
    "coupon_templates": (
        "id seller_id title amount_off min_amount valid_from valid_until total issued created_at"
    ),
    "orders": (
        "id flow order_type buyer_id seller_id amount status created_at pay_deadline updated_at"
    ),
    "order_lines": "id order_id kind item_id label quantity price",
    "coupons": "id template_id user_id state order_id valid_until issued_at updated_at",
    "timers": "id order_id kind deadline_at due_at state attempts stuck created_at",
    "order_events": "id order_id at event actor from_status to_status detail seq",
}
COLUMNS = {name: tuple(columns.split()) for name, columns in _COLUMNS.items()}


def price_of(sku_id: int) -> Decimal:
    """Each SKU's price: 10.50 to 29.50."""
    return Decimal(f"{10 + sku_id % 20}.50")


def lines_of(order_id: int, skus: int) -> list[tuple[int, int]]:
    """(SKU id, units) of an order: two SKUs half the range apart, one unit and two, in id
    order as a placement writes them."""
    first = (order_id - 1) % skus + 1
    second = (order_id - 1 + max(skus // 2, 1)) % skus + 1
    return sorted([(first, 1), (second, 2)])


def shop_rows(
    count: int, *, skus: int, buyers: int, now: datetime, due: datetime
) -> dict[str, tuple[Sequence[str], list[tuple[Any, ...]]]]:
    """Every row placing ``count`` shop orders writes (and what they need: users, SKUs, one
    coupon template with a coupon per order), pay deadlines at ``due``; order i is buyer
    ``2 + (i - 1) % buyers``'s, with coupon i."""
    if skus < 2:
        raise ValueError("two lines need two SKUs")
    held = dict.fromkeys(range(1, skus + 1), 0)
    orders, lines, coupons, timers, events = [], [], [], [], []
    remind = due - timedelta(minutes=10)
    for i in range(1, count + 1):
        buyer = 2 + (i - 1) % buyers
        bought = lines_of(i, skus)
        total = sum((price_of(sku) * units for sku, units in bought), start=Decimal(0))
        amount = max(total - OFF, Decimal("0.01"))
        orders.append((i, "shop", "shop", buyer, 1, amount, "pending_payment", now, due, now))
        for sku, units in bought:
            held[sku] += units
            lines.append((len(lines) + 1, i, "sku", sku, f"sku {sku}", units, price_of(sku)))
        lines.append((len(lines) + 1, i, "coupon", i, COUPON_TITLE, 1, OFF))
        coupons.append((i, 1, buyer, "locked", i, now + timedelta(days=30), now, now))
        timers.append((2 * i - 1, i, "cancel_unpaid", due, due, "scheduled", 0, False, now))
        timers.append((2 * i, i, "pay_reminder", remind, remind, "scheduled", 0, False, now))
        detail = ", ".join(f"sku {sku} x{units}" for sku, units in bought)
        events.append(
            (i, i, now, "place", f"user:{buyer}", None, "pending_payment",
             f"{detail}, coupon {i} for {amount}", i)
        )  # fmt: skip
    users = [(1, "seller", "h1", False, now)] + [
        (b, f"buyer{b}", f"h{b}", False, now) for b in range(2, buyers + 2)
    ]
    sku_rows = [
        (k, 1, f"sku {k}", price_of(k), SPARE, held[k], 0, SPARE + held[k], now, now)
        for k in range(1, skus + 1)
    ]
    template = (
        1, 1, COUPON_TITLE, OFF, MINIMUM, now - timedelta(days=1), now + timedelta(days=30),
        count, count, now,
    )  # fmt: skip
    rows = {
        "users": users,
        "skus": sku_rows,
        "coupon_templates": [template],
        "orders": orders,
        "order_lines": lines,
        "coupons": coupons,
        "timers": timers,
        "order_events": events,
    }
    return {name: (COLUMNS[name], rows[name]) for name in COLUMNS}


async def seed(db: Database, url: str, path: Path, args: argparse.Namespace) -> None:
    """The herd's rows, written in bulk, and the event counter past their numbered events."""
    now = datetime.now(UTC)
    tables = shop_rows(
        args.orders, skus=args.skus, buyers=args.buyers, now=now, due=now + timedelta(days=7)
    )
    if db.dialect == "sqlite":
        _seed.write_sqlite(path, tables)
    elif db.dialect == "postgresql":
        await _seed.copy_postgres(url, tables)
    else:
        raise SystemExit("herd_shop runs on SQLite and PostgreSQL")
    async with db.engine.begin() as conn:
        await conn.execute(
            text("UPDATE event_sequence SET last_seq = :n WHERE id = 1"), {"n": args.orders}
        )


def _stamp(db: Database, at: datetime) -> Any:
    return _seed.stamp(at) if db.dialect == "sqlite" else at.astimezone(UTC).replace(tzinfo=None)


async def set_due(db: Database, due: datetime, *, reminders: bool = False) -> None:
    """Every pay deadline and cancel_unpaid timer at ``due``; the reminders stay ahead, or with
    ``reminders`` fall due a second before (a wall of messages ahead of the cancels)."""
    value = _stamp(db, due)
    async with db.engine.begin() as conn:
        await conn.execute(text("UPDATE orders SET pay_deadline = :due"), {"due": value})
        await conn.execute(
            text(
                "UPDATE timers SET due_at = :due, deadline_at = :due WHERE kind = 'cancel_unpaid'"
            ),
            {"due": value},
        )
        if reminders:
            await conn.execute(
                text(
                    "UPDATE timers SET due_at = :due, deadline_at = :due "
                    "WHERE kind = 'pay_reminder'"
                ),
                {"due": _stamp(db, due - timedelta(seconds=1))},
            )


PROGRESS = (
    "SELECT (SELECT count(*) FROM orders WHERE status = 'cancelled_unpaid'), "
    "(SELECT count(*) FROM reminders WHERE kind = 'order_closed' AND state = 'sent')"
)


async def progress(db: Database) -> tuple[int, int]:
    """(orders cancelled, notices sent) so far."""
    async with db.engine.connect() as conn:
        cancelled, sent = (await conn.execute(text(PROGRESS))).one()
    return int(cancelled), int(sent)


def _at(value: Any) -> datetime:
    parsed = datetime.fromisoformat(value) if isinstance(value, str) else value
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed


async def outcome(db: Database, due: datetime, flow: Flow) -> dict[str, Any]:
    """The checks' figures, and the lateness of cancels and notices (seconds after ``due``)."""
    async with db.engine.connect() as conn:
        found: dict[str, Any] = {}
        for name, sql in {**flow.every_order, **flow.none_left, **flow.figures}.items():
            found[name] = int(await conn.scalar(text(sql)) or 0)
        cancels = (
            await conn.execute(
                text("SELECT done_at FROM timers WHERE kind = 'cancel_unpaid' AND state = 'done'")
            )
        ).scalars()
        notices = (
            await conn.execute(
                text(
                    "SELECT sent_at FROM reminders WHERE kind = 'order_closed' AND sent_at IS NOT NULL"
                )
            )
        ).scalars()
        found["pay_reminder timers done"] = int(
            await conn.scalar(
                text("SELECT count(*) FROM timers WHERE kind = 'pay_reminder' AND state = 'done'")
            )
            or 0
        )
        found["cancel_late"] = sorted((_at(v) - due).total_seconds() for v in cancels)
        found["notice_late"] = sorted((_at(v) - due).total_seconds() for v in notices)
    return found


def _spread(late: list[float]) -> dict[str, float | None]:
    if not late:
        return {"p50_s": None, "p99_s": None, "max_s": None}
    return {
        "p50_s": round(percentile(late, 50), 3),
        "p99_s": round(percentile(late, 99), 3),
        "max_s": round(late[-1], 3),
    }


@dataclass(frozen=True)
class Flow:
    """What a herd of one flow seeds and checks: the seed, SQL answering one number that must
    equal the orders (``every_order``) or be 0 (``none_left``), further figures, the failures
    those figures show (beside the two kinds of checks), and the run's own parameters."""

    name: str
    seed: Callable[[Database, str, Path, argparse.Namespace], Awaitable[None]]
    every_order: Mapping[str, str]
    none_left: Mapping[str, str]
    figures: Mapping[str, str]
    more_failures: Callable[[argparse.Namespace, Mapping[str, Any]], list[str]]
    parameters: Callable[[argparse.Namespace], dict[str, Any]]


def _stock_failures(args: argparse.Namespace, found: Mapping[str, Any]) -> list[str]:
    held = sum(units for i in range(1, args.orders + 1) for _, units in lines_of(i, args.skus))
    if found["skus stocked"] != SPARE * args.skus + held:
        return [f"skus stocked {found['skus stocked']}, seeded {SPARE * args.skus + held}"]
    return []


SHOP = Flow(
    name="shop",
    seed=seed,
    every_order=EVERY_ORDER,
    none_left=NONE_LEFT,
    figures={"skus stocked": "SELECT sum(stocked) FROM skus"},
    more_failures=_stock_failures,
    parameters=lambda args: {"skus": args.skus, "buyers": args.buyers},
)


async def run(args: argparse.Namespace, tmp: Path, flow: Flow = SHOP) -> dict[str, Any]:
    path = tmp / f"herd_{flow.name}.db"
    url = args.database_url or f"sqlite:///{path}"
    db = await _backends.fresh(url)
    started = time.perf_counter()
    await flow.seed(db, url, path, args)
    seed_s = time.perf_counter() - started
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUEFLOW_")}
    env.update(
        {
            "DUEFLOW_DATABASE_URL": url,
            "DUEFLOW_TRIGGER_URL": "db",
            "DUEFLOW_BATCH_SIZE": str(args.batch_size),
            "DUEFLOW_LEASE": "5m",
            "DUEFLOW_NOTIFIER": "log",
            "DUEFLOW_PROFILE": "prod",
        }
    )
    log = open(tmp / "workers.log", "wb")  # noqa: SIM115 - closed after the workers
    workers = [
        subprocess.Popen(
            [str(_seed.DUEFLOW), "worker", "--no-scanner", "-v"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        for _ in range(args.workers)
    ]
    try:
        await asyncio.sleep(3.0)  # let the workers start and go idle
        due = datetime.now(UTC) + timedelta(seconds=args.lead)
        await set_due(db, due, reminders=args.reminders)
        peak = 0
        cancelled_at = sent_at = None
        limit = time.monotonic() + args.timeout
        while time.monotonic() < limit:
            if any(w.poll() is not None for w in workers):
                tail = (tmp / "workers.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"a worker exited: {tail}")
            peak = max(peak, sum(_seed.rss_kib(w.pid)[1] for w in workers))
            cancelled, sent = await progress(db)
            if cancelled_at is None and cancelled == args.orders:
                cancelled_at = datetime.now(UTC)
            if sent == args.orders:
                sent_at = datetime.now(UTC)
                break
            await asyncio.sleep(0.2)
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait(timeout=30)
        log.close()
    found = await outcome(db, due, flow)
    await db.dispose()
    cancel_late, notice_late = found.pop("cancel_late"), found.pop("notice_late")
    cancel_drain = cancel_late[-1] if cancel_late else float("nan")
    notice_drain = notice_late[-1] if notice_late else float("nan")
    logged = (tmp / "workers.log").read_bytes().count(b"notice order_closed")
    return {
        "database": db.dialect,
        "workers": args.workers,
        "flow": flow.name,
        "orders": args.orders,
        **flow.parameters(args),
        "batch_size": args.batch_size,
        "seed_seconds": round(seed_s, 1),
        "cancel_drain_s": round(cancel_drain, 3),
        "cancels_per_s": round(args.orders / cancel_drain) if cancel_drain > 0 else None,
        "cancel_lateness": _spread(cancel_late),
        "notice_drain_s": round(notice_drain, 3),
        "notices_per_s": round(args.orders / notice_drain) if notice_drain > 0 else None,
        "notice_lateness": _spread(notice_late),
        "observed_cancel_s": round((cancelled_at - due).total_seconds(), 1)
        if cancelled_at
        else None,
        "observed_notice_s": round((sent_at - due).total_seconds(), 1) if sent_at else None,
        "notices_logged": logged,
        "workers_peak_rss_mib": round(peak / 1024, 1),
        "db": found,
    }


def failures(args: argparse.Namespace, result: dict[str, Any], flow: Flow = SHOP) -> list[str]:
    """What is not as it must be after the herd (empty: all well)."""
    found = result["db"]
    every_order = dict(flow.every_order)
    if args.reminders:  # due first, a reminder is cancelled with its order or done (skipped)
        cancelled = found[REMINDERS_CANCELLED]
        found["pay_reminder timers cancelled or done"] = (
            cancelled + found["pay_reminder timers done"]
        )
        every_order.pop(REMINDERS_CANCELLED)
        every_order["pay_reminder timers cancelled or done"] = ""
    failed = [f"{name}: {found[name]}" for name in every_order if found[name] != args.orders]
    failed += [f"{name}: {found[name]}" for name in flow.none_left if found[name] != 0]
    failed += flow.more_failures(args, found)
    if result["notices_logged"] != args.orders:
        failed.append(f"{result['notices_logged']} notices logged")
    return failed


def add_reminders_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--reminders",
        action="store_true",
        help="each order's pay reminder due a second before the herd: messages ahead of it",
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--orders", type=int, default=100_000)
    parser.add_argument("--skus", type=int, default=100, help="SKUs the orders spread over")
    parser.add_argument("--buyers", type=int, default=1_000, help="orders go round them")
    parser.add_argument("--database-url", default=None, help="default: a fresh SQLite file")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--lead", type=float, default=3.0, help="seconds from arming to due")
    parser.add_argument("--timeout", type=float, default=1800.0)
    add_reminders_flag(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dueflow-herd-shop-") as tmp:
        result = asyncio.run(run(args, Path(tmp)))
    failed = failures(args, result)
    result["ok"] = not failed
    result["failed"] = failed
    print(json.dumps(result), flush=True)
    if failed:
        print(f"SHOP HERD CHECK FAILED: {'; '.join(failed)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

"""The ticket rush over real HTTP: ``POST /api/orders {"show_id", "seats"}`` against a
``dueflow serve`` process, driven by wrk (``apt-get install wrk``) with ``http_tickets.lua``.

One show of --seats seats (sections of 200, the last one shorter) and --buyers buyers, seeded
through the service layer before the server starts (not timed); then wrk sends --attempts
orders from --connections keep-alive connections, each order a random buyer asking for 1-4
distinct random seats (per-thread random seeds), every thread stopping after its share. The
server is on the ``prod`` profile (pay within 15 minutes), so no hold ends during the run.

Reported: orders placed per second (201s over wrk's duration, and the database's orders over
the time from the first order to the last: the rate while seats were left), attempts per second, wrk's
latency p50 / p90 / p99 / max over every answer, refusals by reason (the error code in each
409), and afterwards the database's word (its order count may exceed the 201s by the answers
still in flight when a wrk thread stopped): no seat held twice, ``count(seat_holds)`` equals the
seat lines of live orders, every live order's lines are exactly its holds, no hold of a dead
order, the per-buyer counts equal the holds and stay within the limit, one order per 201.

    .venv/bin/python benchmarks/http_tickets.py                        # SQLite
    .venv/bin/python benchmarks/http_tickets.py --database-url postgresql://postgres@127.0.0.1/bench
    .venv/bin/python benchmarks/http_tickets.py --database-url postgresql://postgres@127.0.0.1/bench \\
        --seat-cache-url redis://127.0.0.1:6379/13
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).parent))
import _backends
import _seed

LUA = Path(__file__).with_suffix(".lua")
SECTION = 200
LIVE = "('pending_payment', 'paid')"

#: The checks after the run: name -> SQL answering one number that must be 0.
CHECKS = {
    "seats held twice": "SELECT count(*) - count(DISTINCT seat_id) FROM seat_holds",
    "holds minus seat lines of live orders": (
        "SELECT (SELECT count(*) FROM seat_holds) - (SELECT count(*) FROM order_lines l "
        f"JOIN orders o ON o.id = l.order_id WHERE l.kind = 'seat' AND o.status IN {LIVE})"
    ),
    "live order lines without their hold": (
        "SELECT count(*) FROM order_lines l JOIN orders o ON o.id = l.order_id "
        "LEFT JOIN seat_holds h ON h.order_id = l.order_id AND h.seat_id = l.item_id "
        f"WHERE l.kind = 'seat' AND o.status IN {LIVE} AND h.id IS NULL"
    ),
    "holds without their order's line": (
        "SELECT count(*) FROM seat_holds h LEFT JOIN order_lines l "
        "ON l.order_id = h.order_id AND l.item_id = h.seat_id AND l.kind = 'seat' "
        "WHERE l.id IS NULL"
    ),
    "holds of orders not live": (
        "SELECT count(*) FROM seat_holds h JOIN orders o ON o.id = h.order_id "
        f"WHERE o.status NOT IN {LIVE}"
    ),
    "buyer counts minus holds": (
        "SELECT coalesce(sum(seats), 0) - (SELECT count(*) FROM seat_holds) FROM show_buyers"
    ),
    "buyers past the limit": (
        "SELECT count(*) FROM show_buyers b JOIN shows s ON s.id = b.show_id "
        "WHERE b.seats > s.seat_limit"
    ),
}


#: The first and the last order placed: the sale while seats were left.
WINDOW = "SELECT min(created_at), max(created_at) FROM orders"


def as_utc(value: datetime | str) -> datetime:
    """A time read by plain SQL (SQLite gives text) as an aware UTC datetime."""
    parsed = datetime.fromisoformat(value) if isinstance(value, str) else value
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def section_spec(seats: int) -> str:
    """``A:1-200,B:1-200,...``: ``seats`` seats in sections of :data:`SECTION`."""
    parts, left, letter = [], seats, ord("A")
    while left > 0:
        size = min(SECTION, left)
        parts.append(f"{chr(letter)}:1-{size}")
        left, letter = left - size, letter + 1
    return ",".join(parts)


async def seed(url: str, seats: int, buyers: int, limit: int) -> tuple[int, list[str], list[str]]:
    """A fresh database with one show and its buyers: (show id, seat labels, buyer tokens)."""
    from dueflow import bootstrap
    from dueflow.config import load_settings
    from dueflow.domain import seating
    from dueflow.service import accounts, tickets

    db = await _backends.fresh(url)
    await db.dispose()
    settings = load_settings(database_url=url, profile="prod")
    async with bootstrap.running(settings) as deps:
        organizer, _ = await accounts.add_user(deps, "organizer")
        sections = section_spec(seats)
        specs = seating.parse_ranges(
            sections, {part[0]: Decimal("380") for part in sections.split(",")}
        )
        now = datetime.now(UTC)
        show_id = await tickets.create_show(
            deps,
            organizer_id=organizer.id,
            title="Ticket rush",
            venue="Bench hall",
            starts_at=now + timedelta(days=2),
            sales_close_at=now + timedelta(days=1),
            seat_limit=limit,
            seats=specs,
        )
        tokens = [(await accounts.add_user(deps, f"buyer{n}"))[1] for n in range(buyers)]
    return show_id, [s.label for s in specs], tokens


def wait_for_cache(url: str, show_id: int, seconds: float = 20) -> bool:
    """The seat cache has the show (the reconciler's first pass loaded it)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        limit = time.monotonic() + seconds
        while time.monotonic() < limit:
            if any(str(show_id) in key.decode() for key in client.scan_iter(count=1000)):
                return True
            time.sleep(0.2)
        return False
    finally:
        client.close()


def flush_cache(url: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        client.flushdb()
    finally:
        client.close()


def rush(args: argparse.Namespace, port: int, tmp: Path, show_id: int) -> dict[str, Any]:
    """Run wrk; its RUSH line as a dict (plus any unexpected answers)."""
    per_thread = args.attempts // args.threads
    command = _seed.wrk_command(
        args,
        port,
        LUA,
        args.max_seconds,
        tmp / "tokens.txt",
        tmp / "labels.txt",
        show_id,
        per_thread,
    )
    return _seed.run_wrk(command, tmp, args.threads, "RUSH")


async def check(url: str) -> dict[str, int]:
    """Every :data:`CHECKS` figure (each must be 0), and the counts they were taken over."""
    from dueflow.store.db import Database

    db = Database.from_url(url)
    try:
        async with db.engine.connect() as conn:
            found = {name: int(await conn.scalar(text(sql)) or 0) for name, sql in CHECKS.items()}
            for name, sql in {
                "orders": "SELECT count(*) FROM orders",
                "pending_payment": "SELECT count(*) FROM orders WHERE status = 'pending_payment'",
                "seat_holds": "SELECT count(*) FROM seat_holds",
            }.items():
                found[name] = int(await conn.scalar(text(sql)) or 0)
            first, last = (await conn.execute(text(WINDOW))).one()
        found["placing_ms"] = int((as_utc(last) - as_utc(first)).total_seconds() * 1000)
        return found
    finally:
        await db.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default=None, help="default: a fresh SQLite file")
    parser.add_argument("--seat-cache-url", default=None, help="DUEFLOW_SEAT_CACHE_URL (flushed)")
    parser.add_argument("--seats", type=int, default=2_000)
    parser.add_argument("--buyers", type=int, default=20_000, help="random per attempt")
    parser.add_argument("--limit", type=int, default=4, help="seats a buyer")
    parser.add_argument("--attempts", type=int, default=20_000)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2, help="wrk threads")
    parser.add_argument("--max-seconds", type=int, default=600, help="wrk's bound")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (apt-get install wrk)")
    with tempfile.TemporaryDirectory(prefix="dueflow-http-tickets-") as name:
        tmp = Path(name)
        url = args.database_url or f"sqlite:///{tmp / 'rush.db'}"
        started = time.perf_counter()
        show_id, labels, tokens = asyncio.run(seed(url, args.seats, args.buyers, args.limit))
        print(f"seeded in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        (tmp / "tokens.txt").write_text("\n".join(tokens) + "\n")
        (tmp / "labels.txt").write_text("\n".join(labels) + "\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("DUEFLOW_")}
        env.update({"DUEFLOW_DATABASE_URL": url, "DUEFLOW_PROFILE": "prod"})
        if args.seat_cache_url:
            flush_cache(args.seat_cache_url)
            env["DUEFLOW_SEAT_CACHE_URL"] = args.seat_cache_url
            env["DUEFLOW_SEAT_RECONCILE_INTERVAL"] = "5s"
        port = free_port()
        with _seed.serving(env, port, tmp / "serve.log"):
            if args.seat_cache_url and not wait_for_cache(args.seat_cache_url, show_id):
                sys.exit("the seat cache never loaded the show")
            result = rush(args, port, tmp, show_id)
        state = asyncio.run(check(url))
    seconds = result["duration_us"] / 1e6
    report = {
        "database": url.split(":", 1)[0],
        "seat_cache": bool(args.seat_cache_url),
        **{k: v for k, v in result.items() if not k.endswith("_us")},
        "seconds": round(seconds, 2),
        "orders_per_s": round(result["placed"] / seconds, 1),
        "attempts_per_s": round(result["answered"] / seconds, 1),
        # From the first order to the last: the rate while seats were left to sell.
        "orders_per_s_while_seats_left": round(
            state["orders"] / max(state["placing_ms"] / 1000, 0.001), 1
        ),
        "p50_ms": round(result["p50_us"] / 1000, 1),
        "p90_ms": round(result["p90_us"] / 1000, 1),
        "p99_ms": round(result["p99_us"] / 1000, 1),
        "max_ms": round(result["max_us"] / 1000, 1),
        "db": state,
    }
    ok = (
        all(state[name] == 0 for name in CHECKS)
        # Answers still in flight when a wrk thread stopped were placed but never counted.
        and result["placed"] <= state["orders"] <= result["placed"] + args.connections
        and state["orders"] == state["pending_payment"]
        and result["other"] == 0
    )
    report["ok"] = ok
    print(json.dumps(report), flush=True)
    if not ok:
        print("TICKET RUSH CHECK FAILED: see db and other_answers above", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

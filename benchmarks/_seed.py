"""Bulk seeding for benchmarks: stdlib sqlite3 writing rows exactly as dueflow stores them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx

from dueflow.store import migrate
from dueflow.store.db import Database

FMT = "%Y-%m-%d %H:%M:%S.%f"


def stamp(when: datetime) -> str:
    """A datetime as dueflow's SQLite columns hold it (naive UTC text)."""
    return when.astimezone(UTC).replace(tzinfo=None).strftime(FMT)


def parse(text: str) -> datetime:
    """The inverse of :func:`stamp`."""
    return datetime.strptime(text, FMT).replace(tzinfo=UTC)


def migrated(path: Path) -> None:
    """Create the schema with dueflow's own migrations."""

    async def go() -> None:
        db = Database.from_url(f"sqlite:///{path}")
        try:
            await migrate.upgrade(db)
        finally:
            await db.dispose()

    asyncio.run(go())


def seed_unpaid(path: Path, count: int, due: datetime, *, chunk: int = 50_000) -> None:
    """``count`` unpaid orders, each holding its own goods, with a cancel_unpaid timer at ``due``."""
    now = stamp(datetime.now(UTC))
    due_s = stamp(due)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    with conn:
        conn.execute(
            "INSERT INTO users (id, name, token_hash, is_admin, created_at) VALUES "
            "(1, 'seller', 'h1', 0, ?), (2, 'buyer', 'h2', 0, ?)",
            (now, now),
        )
    for start in range(1, count + 1, chunk):
        ids = range(start, min(start + chunk, count + 1))
        with conn:
            conn.executemany(
                "INSERT INTO goods (id, seller_id, title, price, status, reserved_order_id, "
                "created_at, updated_at) VALUES (?, 1, 'item', '12.50', 'on_sale', ?, ?, ?)",
                ((i, i, now, now) for i in ids),
            )
            conn.executemany(
                "INSERT INTO orders (id, flow, order_type, buyer_id, seller_id, goods_id, amount,"
                " status, created_at, pay_deadline, updated_at) VALUES "
                "(?, 'marketplace', 'normal', 2, 1, ?, '12.50', 'pending_payment', ?, ?, ?)",
                ((i, i, now, due_s, now) for i in ids),
            )
            conn.executemany(
                "INSERT INTO order_lines (order_id, kind, item_id, label, quantity, price) VALUES"
                " (?, 'goods', ?, 'item', 1, '12.50')",
                ((i, i) for i in ids),
            )
            conn.executemany(
                "INSERT INTO timers (order_id, kind, deadline_at, due_at, state, attempts, stuck,"
                " created_at) VALUES (?, 'cancel_unpaid', ?, ?, 'scheduled', 0, 0, ?)",
                ((i, due_s, due_s, now) for i in ids),
            )
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


#: Rows to write, per table (parents first): its column names and its rows of Python values.
Tables = Mapping[str, tuple[Sequence[str], Iterable[Sequence[object]]]]


def sqlite_value(value: object) -> object:
    """A Python value as dueflow's SQLite columns hold it: times as naive UTC text, money as
    text, booleans as 0/1."""
    if isinstance(value, datetime):
        return stamp(value)
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bool):
        return int(value)
    return value


def write_sqlite(path: Path, tables: Tables) -> None:
    """Insert every table's rows in one transaction (executemany, WAL, no fsync)."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    with conn:
        for table, (columns, rows) in tables.items():
            marks = ", ".join("?" * len(columns))
            conn.executemany(
                f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})",
                ([sqlite_value(v) for v in row] for row in rows),
            )
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


async def copy_postgres(url: str, tables: Tables) -> None:
    """COPY every table's rows (times as naive UTC), move each id sequence past them, ANALYZE."""
    import asyncpg

    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        async with conn.transaction():
            for table, (columns, rows) in tables.items():
                records = [
                    [
                        v.astimezone(UTC).replace(tzinfo=None) if isinstance(v, datetime) else v
                        for v in row
                    ]
                    for row in rows
                ]
                await conn.copy_records_to_table(table, records=records, columns=list(columns))
                if "id" in columns:
                    await conn.execute(
                        f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                        f"(SELECT max(id) FROM {table}))"
                    )
        await conn.execute("ANALYZE")
    finally:
        await conn.close()


def set_due(path: Path, due: datetime) -> None:
    """Move every order's pay deadline and its timer to ``due`` in one transaction."""
    due_s = stamp(due)
    conn = sqlite3.connect(path, timeout=30)
    with conn:
        conn.execute("UPDATE orders SET pay_deadline = ?", (due_s,))
        conn.execute("UPDATE timers SET due_at = ?, deadline_at = ?", (due_s, due_s))
    conn.close()


def rss_kib(pid: int) -> tuple[int, int]:
    """(current RSS, peak RSS) of a process in KiB, from /proc."""
    values = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":", 1)
                values[key] = int(value.split()[0])
    return values.get("VmRSS", 0), values.get("VmHWM", 0)


#: The dueflow program of this virtualenv.
DUEFLOW = Path(sys.executable).parent / "dueflow"


@contextlib.contextmanager
def serving(
    env: dict[str, str], port: int, log: Path, *, worker: bool = True, workers: int = 1
) -> Iterator[subprocess.Popen[bytes]]:
    """``dueflow serve`` (the worker on unless ``worker`` is False; ``--workers`` when
    ``workers`` > 1) until the block ends; ready when /healthz answers."""
    command = [str(DUEFLOW), "serve", "--host", "127.0.0.1", "--port", str(port)]
    if not worker:
        command.append("--no-worker")
    if workers > 1:
        command += ["--workers", str(workers)]
    with started(command, env, port, log) as proc:
        yield proc


@contextlib.contextmanager
def started(
    command: Sequence[str], env: dict[str, str], port: int, log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """Any HTTP server ``command`` (its output in ``log``) until the block ends, then SIGTERM;
    ready when /healthz on ``port`` answers 200."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(list(command), env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        limit = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited {proc.returncode}: {log.read_text()[-2000:]}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            if time.monotonic() > limit:
                raise RuntimeError(f"server not healthy after 30 s: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wrk_command(
    args: Any, port: int, script: Path, bound_seconds: int, *script_args: object
) -> list[str]:
    """wrk with ``args.threads`` threads and ``args.connections`` connections, running ``script``
    against 127.0.0.1:``port`` for at most ``bound_seconds`` (the scripts stop on their own),
    30 s a request, with ``script_args`` after ``--``."""
    return [
        "wrk",
        f"-t{args.threads}",
        f"-c{args.connections}",
        f"-d{bound_seconds}s",
        "--timeout",
        "30s",
        "-s",
        str(script),
        f"http://127.0.0.1:{port}",
        "--",
        *map(str, script_args),
    ]


def run_wrk(command: Sequence[str], work: Path, threads: int, tag: str) -> dict[str, Any]:
    """Run a wrk ``command`` whose Lua script writes ``done-*`` files into ``work`` as each of
    its ``threads`` stops and prints one ``<tag> {json}`` line (and ``OTHER ...`` lines for
    unexpected answers); the parsed result with the first ten others as ``other_answers``."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=work)
    # wrk runs its whole -d even when every thread has stopped; SIGINT ends it early and it
    # then reports the time taken (this poll adds at most ~10 ms to it).
    while proc.poll() is None and len(list(work.glob("done-*"))) < threads:
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = (part.decode() for part in proc.communicate(timeout=60))
    result: dict[str, Any] = {}
    others: list[str] = []
    for line in stdout.splitlines():
        if line.startswith(f"{tag} "):
            result = json.loads(line[len(tag) + 1 :])
        elif line.startswith("OTHER "):
            others.append(line[6:])
    if not result:
        raise RuntimeError(f"wrk printed no result:\n{stdout}\n{stderr}")
    result["other_answers"] = others[:10]
    return result

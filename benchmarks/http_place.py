"""Place order over real HTTP, driven by wrk, against ``dueflow serve`` and a lean reference.

Two servers place the same orders one after the other, on the same machine, from the same
seeded database and at the same concurrency: ``benchmarks/reference_server.py`` (a bare ASGI app
on uvicorn + uvloop + httptools, the driver alone, dueflow's place statements in one transaction,
orjson) and ``dueflow serve`` (profile prod, so no deadline fires during the run; the worker on
unless --no-worker; ``--workers N`` with --processes N). Every run prints dueflow's ratio to the
reference: orders a second and server CPU an order.

With ``--credentials token,key`` dueflow runs twice in the sitting: each buyer by its personal
token, then one service key (scope orders) acting for each buyer by its host id
(``Dueflow-Act-As: host-<n>``; the users exist, as after their first use).

Setup, not timed: a seller, --buyers buyers with their tokens and --orders + --warmup goods,
seeded through dueflow's own schema and service layer (``bootstrap.running``); on SQLite into a
template file copied for each run, on PostgreSQL and MySQL seeded afresh for each run (the same
tokens, the same goods ids). The goods ids and the tokens go to files that ``http_place.lua``
reads. wrk (Debian's package, installed here when missing) runs ``-t --threads -c
--connections``: --warmup orders first (not recorded), then the timed phase, each request
``POST /api/orders {"goods_id": N}`` for goods no other request asks for, by a buyer taken in
turn, until the goods run out or --seconds pass; nothing is left in flight at the end.

Reported per run: orders/s (201s over wrk's duration), wrk's latency p50 / p90 / p99 / max, the
answers other than 201 by status, the server's CPU an order (user + system of the server
process and every process under it, from /proc, over the timed phase), SQL statements an order
(``dueflow_db_statements_total`` or the reference's counter on /metrics, read before and after
the timed phase; one process only, as each process counts its own), peak RSS (VmHWM summed over
the server's processes). Then the database: orders equal the 201s, no goods ordered twice by
live orders, each held goods held by the order of those goods, one line, two timers and one
``place`` event an order. Before the runs one place goes through dueflow in process with its
statements captured (``--show-statements`` prints them): their count is printed beside the
reference's.

    .venv/bin/python benchmarks/http_place.py                           # SQLite, 10 s a run
    .venv/bin/python benchmarks/http_place.py --backend postgres --processes 2
    .venv/bin/python benchmarks/http_place.py --backend mysql --mysql-url mysql://root@127.0.0.1/bench
    .venv/bin/python benchmarks/http_place.py --no-reference --py-spy /tmp/spy
    .venv/bin/python benchmarks/http_place.py --credentials token,key   # and by a service key
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import event, insert, select, text

sys.path.insert(0, str(Path(__file__).parent))
import _backends
import _seed
import reference_server
from http_tickets import free_port

LUA = Path(__file__).with_suffix(".lua")
REFERENCE = Path(__file__).with_name("reference_server.py")
PY_SPY = Path(sys.executable).parent / "py-spy"
CLK_TCK = os.sysconf("SC_CLK_TCK")
#: Where --backend postgres / mysql run by default: a database of the benchmark's own, emptied and
#: seeded again for each run (create it first: `createdb bench`, `CREATE DATABASE bench`).
URLS = {
    "postgres": "postgresql://postgres@127.0.0.1/bench",
    "mysql": "mysql://root@127.0.0.1/bench",
}

#: The checks after a run: name -> SQL answering one number that must be 0.
CHECKS = {
    "goods with two live orders": (
        "SELECT count(*) FROM (SELECT goods_id FROM orders WHERE status = 'pending_payment' "
        "GROUP BY goods_id HAVING count(*) > 1) twice"
    ),
    "goods held by no order of theirs": (
        "SELECT count(*) FROM goods g LEFT JOIN orders o ON o.id = g.reserved_order_id "
        "AND o.goods_id = g.id WHERE g.reserved_order_id IS NOT NULL AND o.id IS NULL"
    ),
    "orders not pending payment": "SELECT count(*) FROM orders WHERE status <> 'pending_payment'",
    "goods held minus orders": (
        "SELECT (SELECT count(*) FROM goods WHERE reserved_order_id IS NOT NULL) "
        "- (SELECT count(*) FROM orders)"
    ),
    "lines minus orders": (
        "SELECT (SELECT count(*) FROM order_lines WHERE kind = 'goods') "
        "- (SELECT count(*) FROM orders)"
    ),
    "scheduled timers minus two an order": (
        "SELECT (SELECT count(*) FROM timers WHERE state = 'scheduled' "
        "AND kind IN ('cancel_unpaid', 'pay_reminder')) - 2 * (SELECT count(*) FROM orders)"
    ),
    "place events minus orders": (
        "SELECT (SELECT count(*) FROM order_events WHERE event = 'place') "
        "- (SELECT count(*) FROM orders)"
    ),
}


def ensure_wrk() -> None:
    """Debian's wrk, installed when missing (as .ci/run does)."""
    if shutil.which("wrk"):
        return
    print("installing Debian's wrk", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "wrk"]):
        if subprocess.run(command, env=env, check=False).returncode != 0:
            sys.exit(f"could not install wrk ({' '.join(command)} failed)")


# --- seeding ---------------------------------------------------------------------------------


async def seed(url: str, tokens: list[str], count: int, key: str | None = None) -> list[int]:
    """A fresh database: the seller (through the service layer), the buyers holding ``tokens``
    (buyer n known to the host as ``host-<n>``), the service key ``key`` (scope orders; none
    when None) and
    ``count`` goods on sale (dueflow's rows, in one transaction each); the goods ids."""
    from dueflow import bootstrap
    from dueflow.config import load_settings
    from dueflow.service import accounts
    from dueflow.store import schema

    if not url.startswith("sqlite"):
        await (await _backends.fresh(url)).dispose()
    settings = load_settings(database_url=url, profile="prod")
    async with bootstrap.running(settings) as deps:
        seller, _ = await accounts.add_user(deps, "seller")
        now = datetime.now(UTC)
        async with deps.db.write() as conn:
            await conn.execute(
                insert(schema.users),
                [
                    {
                        "name": f"buyer{n}",
                        "token_hash": accounts.hash_token(token),
                        "is_admin": False,
                        "created_at": now,
                        "external_id": host_id(n),
                    }
                    for n, token in enumerate(tokens)
                ],
            )
        if key is not None:
            async with deps.db.write() as conn:
                await conn.execute(
                    insert(schema.api_keys).values(
                        name="bench",
                        prefix=key[:15],
                        secret_hash=accounts.hash_token(key),
                        scopes="orders",
                        created_at=now,
                        created_by="cli",
                    )
                )
        async with deps.db.write() as conn:
            await conn.execute(
                insert(schema.goods),
                [
                    {
                        "seller_id": seller.id,
                        "title": f"item {i}",
                        "price": Decimal("12.50"),
                        "status": "on_sale",
                        "created_at": now,
                        "updated_at": now,
                    }
                    for i in range(count)
                ],
            )
        async with deps.db.read() as conn:
            ids = (await conn.scalars(select(schema.goods.c.id).order_by(schema.goods.c.id))).all()
        if deps.db.dialect == "postgresql":
            async with deps.db.engine.connect() as conn:
                await (await conn.execution_options(isolation_level="AUTOCOMMIT")).execute(
                    text("ANALYZE")
                )
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.split(":///", 1)[1])
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
    return [int(i) for i in ids]


def host_id(n: int) -> str:
    """The host's id of buyer ``n``, which a service key acts for."""
    return f"host-{n}"


def credential_lines(credential: str, tokens: list[str], key: str) -> str:
    """The file http_place.lua takes buyers from: a personal token a line, or the key's secret,
    a tab and a host user's id (the same buyers either way)."""
    if credential == "token":
        return "\n".join(tokens) + "\n"
    return "".join(f"{key}\t{host_id(n)}\n" for n in range(len(tokens)))


def fresh_copy(template: Path, target: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        source = Path(f"{template}{suffix}")
        if source.exists():
            shutil.copyfile(source, f"{target}{suffix}")


async def captured(url: str, token: str, goods: list[int]) -> list[str]:
    """The statements dueflow sends for one ``POST /api/orders`` (the second of two, so
    nothing is a first time), through the app in this process."""
    from dueflow import bootstrap
    from dueflow.api.app import create_app
    from dueflow.config import load_settings

    seen: list[str] = []

    def sent(_conn: object, _cursor: object, statement: str, *_rest: object) -> None:
        seen.append(" ".join(statement.split()))

    settings = load_settings(database_url=url, profile="prod")
    async with bootstrap.running(settings) as deps:
        transport = httpx.ASGITransport(app=create_app(deps))
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(transport=transport, base_url="http://capture") as client:
            for n, goods_id in enumerate(goods[:2]):
                if n == 1:
                    for engine in {deps.db.engine, deps.db.report_engine}:
                        event.listen(engine.sync_engine, "before_cursor_execute", sent)
                answer = await client.post(
                    "/api/orders", json={"goods_id": goods_id}, headers=headers
                )
                if answer.status_code != 201:
                    raise RuntimeError(f"the captured place answered {answer.status_code}")
    return seen


# --- one run ---------------------------------------------------------------------------------


def tree(root: int) -> list[int]:
    """``root`` and every process under it, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def cpu_seconds(root: int) -> float:
    """User + system CPU seconds of ``root`` and every live process under it."""
    total = 0
    for pid in tree(root):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


def peak_rss_mib(root: int) -> float:
    return sum(_seed.rss_kib(pid)[1] for pid in tree(root)) / 1024


def statements(port: int, name: str) -> int:
    """The counter ``name`` on the server's /metrics, summed over its labels."""
    body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    return int(
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in body.splitlines()
            if line.startswith(name) and not line.startswith("#")
        )
    )


def wrk(
    args: argparse.Namespace, port: int, tmp: Path, goods: list[int], seconds: float
) -> dict[str, Any]:
    # tmp / "tokens.txt" holds the credentials of the run under way (credential_lines).
    """wrk with http_place.lua over ``goods``; its PLACE line as a dict."""
    work = Path(tempfile.mkdtemp(dir=tmp))
    (work / "goods.txt").write_text("\n".join(map(str, goods)) + "\n")
    # The bound; the script stops on its own at --seconds.
    command = _seed.wrk_command(
        args,
        port,
        LUA,
        int(seconds) + 120,
        work / "goods.txt",
        tmp / "tokens.txt",
        args.threads,
        max(1, round(seconds)),
    )
    return _seed.run_wrk(command, work, args.threads, "PLACE")


def server(
    kind: str, args: argparse.Namespace, url: str, port: int, log: Path
) -> AbstractContextManager[subprocess.Popen[bytes]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUEFLOW_")}
    if kind == "reference":
        command = [sys.executable, str(REFERENCE), "--database-url", url, "--port", str(port)]
        command += ["--workers", str(args.processes)]
        return _seed.started(command, env, port, log)
    env.update({"DUEFLOW_DATABASE_URL": url, "DUEFLOW_PROFILE": "prod"})
    return _seed.serving(env, port, log, worker=args.worker, workers=args.processes)


def measured(
    kind: str, args: argparse.Namespace, port: int, pid: int, tmp: Path, goods: list[int]
) -> dict[str, Any]:
    """Warm up, then the timed phase with the server's CPU, statements and peak RSS."""
    counter = f"{kind}_db_statements_total"
    warm = wrk(args, port, tmp, goods[: args.warmup], args.seconds)
    spy = None
    if kind == "dueflow" and args.py_spy:
        out = Path(args.py_spy) / f"{args.backend}-p{args.processes}.txt"
        out.parent.mkdir(parents=True, exist_ok=True)
        command = [str(PY_SPY), "record", "--pid", str(pid), "--subprocesses"]
        command += ["--format", "raw", "--rate", "100", "--output", str(out)]
        spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # A scrape of dueflow's /metrics runs statements of its own: two in a row say how many.
    s0 = statements(port, counter)
    s1 = statements(port, counter)
    cpu0 = cpu_seconds(pid)
    timed = wrk(args, port, tmp, goods[args.warmup :], args.seconds)
    cpu = cpu_seconds(pid) - cpu0
    s2 = statements(port, counter)
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=60)
    return {
        "warm": warm,
        "timed": timed,
        "cpu": cpu,
        "statements": s2 - s1 - (s1 - s0),
        "peak": peak_rss_mib(pid),
    }


def one_run(
    kind: str, args: argparse.Namespace, url: str, tmp: Path, goods: list[int], credential: str
) -> dict[str, Any]:
    """Serve ``url`` with ``kind``, warm up, place for the timed phase (by ``credential``'s
    lines in tokens.txt), check the database."""
    port = free_port()
    try:
        with server(kind, args, url, port, tmp / f"{kind}.log") as proc:
            m = measured(kind, args, port, proc.pid, tmp, goods)
    except RuntimeError as exc:
        if args.processes > 1 and kind == "dueflow" and "server exited" in str(exc):
            sys.exit(f"dueflow serve refused --workers {args.processes}: {exc}")
        raise
    state = asyncio.run(check(url))
    warm, timed = m["warm"], m["timed"]
    placed = timed["placed"]
    seconds = timed["duration_us"] / 1e6
    failed = [name for name in CHECKS if state[name] != 0]
    if state["orders"] != warm["placed"] + placed:
        failed.append(f"{state['orders']} orders but {warm['placed'] + placed} answers 201")
    for phase, result in (("warm-up", warm), ("timed", timed)):
        if result["sent"] != result["answered"]:
            failed.append(f"{phase}: sent {result['sent']}, answered {result['answered']}")
        if result["non_201"]:
            failed.append(f"{phase}: answers other than 201: {result['non_201']}")
    return {
        "server": kind if credential == "token" else f"{kind} (service key)",
        "credential": credential,
        "database": url.split(":", 1)[0],
        "processes": args.processes,
        "worker": args.worker if kind == "dueflow" else None,
        "connections": args.connections,
        "placed": placed,
        "non_201": timed["non_201"],
        "seconds": round(seconds, 2),
        "orders_per_s": round(placed / seconds, 1) if seconds else None,
        "p50_ms": round(timed["p50_us"] / 1000, 2),
        "p90_ms": round(timed["p90_us"] / 1000, 2),
        "p99_ms": round(timed["p99_us"] / 1000, 2),
        "max_ms": round(timed["max_us"] / 1000, 2),
        "server_cpu_ms_per_order": round(m["cpu"] * 1000 / placed, 3) if placed else None,
        # Each process counts its own statements: over several, one scrape sees one of them.
        "statements_per_order": (
            round(m["statements"] / placed, 2) if placed and args.processes == 1 else None
        ),
        "server_peak_rss_mib": round(m["peak"], 1),
        "transport_errors": {
            k: timed[k] for k in ("connect_errors", "read_errors", "write_errors", "timeouts")
        },
        "other_answers": timed["other_answers"],
        "db": state,
        "failed": failed,
        "ok": not failed,
    }


async def check(url: str) -> dict[str, int]:
    """Every :data:`CHECKS` figure (each must be 0) and the orders."""
    from dueflow.store.db import Database

    db = Database.from_url(url)
    try:
        async with db.engine.connect() as conn:
            found = {name: int(await conn.scalar(text(sql)) or 0) for name, sql in CHECKS.items()}
            found["orders"] = int(await conn.scalar(text("SELECT count(*) FROM orders")) or 0)
        return found
    finally:
        await db.dispose()


# --- the whole benchmark ---------------------------------------------------------------------


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| server | database | processes | placed | non-201 | orders/s | p50 / p90 / p99 / max (ms) "
        "| server CPU ms/order | statements/order | peak RSS (MiB) | checks |",
        "|" + "---|" * 11,
    ]
    for r in results:
        bad = ", ".join(f"{k}: {v}" for k, v in r["non_201"].items()) or "0"
        lines.append(
            f"| {r['server']} | {r['database']} | {r['processes']} | {r['placed']:,} | {bad} "
            f"| {r['orders_per_s']} | {r['p50_ms']} / {r['p90_ms']} / {r['p99_ms']} / "
            f"{r['max_ms']} | {r['server_cpu_ms_per_order']} | {r['statements_per_order']} "
            f"| {r['server_peak_rss_mib']} | {'ok' if r['ok'] else 'FAILED'} |"
        )
    return "\n".join(lines)


def ratio(results: list[dict[str, Any]], server: str = "dueflow") -> dict[str, float | None]:
    by = {r["server"]: r for r in results}
    ref, due = by.get("reference"), by.get(server)
    if ref is None or due is None:
        return {}

    def over(key: str) -> float | None:
        a, b = due[key], ref[key]
        return round(a / b, 3) if a and b else None

    return {"orders_per_s": over("orders_per_s"), "cpu_per_order": over("server_cpu_ms_per_order")}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", choices=("sqlite", "postgres", "mysql"), default="sqlite")
    parser.add_argument("--postgres-url", default=URLS["postgres"])
    parser.add_argument("--mysql-url", default=URLS["mysql"])
    parser.add_argument("--orders", type=int, default=20_000, help="goods for the timed phase")
    parser.add_argument("--seconds", type=float, default=10.0, help="at most this long a run")
    parser.add_argument("--warmup", type=int, default=200, help="orders placed first, not timed")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2, help="wrk threads")
    parser.add_argument("--buyers", type=int, default=50)
    parser.add_argument("--processes", type=int, default=1, help="server processes (--workers)")
    parser.add_argument(
        "--worker",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run dueflow's worker, scanner and feeder beside the API (dueflow serve's default)",
    )
    parser.add_argument(
        "--reference",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the reference server first and print dueflow's ratio to it",
    )
    parser.add_argument(
        "--credentials",
        default="token",
        help="dueflow's runs, in order: token (each buyer's personal token), key (one service "
        "key acting for each buyer by its host id: Dueflow-Act-As), or token,key for both",
    )
    parser.add_argument("--show-statements", action="store_true", help="print dueflow's place")
    parser.add_argument("--py-spy", default=None, help="directory for py-spy raw stacks")
    args = parser.parse_args()
    if args.processes > 1 and args.backend == "sqlite":
        sys.exit("SQLite has one writer: --processes stays 1 on it")
    ensure_wrk()
    credentials = args.credentials.split(",")
    if not credentials or set(credentials) - {"token", "key"}:
        sys.exit("--credentials: token, key or token,key")
    tokens = [secrets.token_urlsafe(24) for _ in range(args.buyers)]
    key = "dfk_live_" + secrets.token_urlsafe(32)
    with tempfile.TemporaryDirectory(prefix="dueflow-http-place-") as name:
        tmp = Path(name)
        (tmp / "tokens.txt").write_text(credential_lines("token", tokens, key))
        count = args.orders + args.warmup
        if args.backend == "sqlite":
            template = tmp / "template.db"
            url = f"sqlite:///{template}"
        else:
            url = args.postgres_url if args.backend == "postgres" else args.mysql_url
        started = time.perf_counter()
        goods = asyncio.run(seed(url, tokens, count, key))
        print(
            f"seeded {len(goods):,} goods in {time.perf_counter() - started:.1f} s", file=sys.stderr
        )
        capture_url = url
        if args.backend == "sqlite":
            fresh_copy(template, tmp / "capture.db")
            capture_url = f"sqlite:///{tmp / 'capture.db'}"
        dueflow_statements = asyncio.run(captured(capture_url, tokens[0], goods))
        results = []
        runs = [("dueflow", credential) for credential in credentials]
        for kind, credential in [("reference", "token"), *runs] if args.reference else runs:
            (tmp / "tokens.txt").write_text(credential_lines(credential, tokens, key))
            if args.backend == "sqlite":
                run_url = f"sqlite:///{tmp / f'{kind}-{credential}.db'}"
                fresh_copy(template, tmp / f"{kind}-{credential}.db")
            else:
                run_url = url  # seeded afresh: the same tokens, the same goods ids
                goods = asyncio.run(seed(url, tokens, count, key))
            results.append(one_run(kind, args, run_url, tmp, goods, credential))
            print(json.dumps(results[-1]), flush=True)
    control = [s for s in dueflow_statements if s.split(" ", 1)[0] in ("BEGIN", "COMMIT")]
    if args.show_statements:
        for statement in dueflow_statements:
            print(f"  {statement}")
    print(table(results))
    counts = {
        "dueflow": len(dueflow_statements) - len(control),
        "dueflow_begin": len(control),
        "reference": len(reference_server.PLACE),
    }
    print(
        f"statements a place: dueflow {counts['dueflow']} (+{counts['dueflow_begin']} BEGIN), "
        f"reference {counts['reference']}"
    )
    ratios = ratio(results)
    if ratios:
        print(
            f"dueflow / reference: orders/s {ratios['orders_per_s']}, "
            f"server CPU an order {ratios['cpu_per_order']}"
        )
    keyed = ratio(results, "dueflow (service key)")
    if keyed:
        print(
            f"dueflow by a service key / reference: orders/s {keyed['orders_per_s']}, "
            f"server CPU an order {keyed['cpu_per_order']}"
        )
    ok = all(r["ok"] for r in results)
    print(
        json.dumps(
            {"runs": results, "statements": counts, "ratio": ratios, "key_ratio": keyed, "ok": ok}
        ),
        flush=True,
    )
    if not ok:
        print("HTTP PLACE CHECK FAILED: see failed in the runs above", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

"""Place order over real HTTP: ``POST /api/orders`` against a ``dueflow serve`` process on SQLite.

The server is a subprocess (``dueflow serve`` on 127.0.0.1, profile prod, so no deadline fires
during the run); this script is the load generator: C concurrent clients on one
``httpx.AsyncClient`` with HTTP keep-alive (pool sized to C), each placing orders for distinct
goods of one seller, bought in turn by many buyers. Every sweep point gets a fresh database
(copied from one seeded template) and a fresh server. Bounded by --orders and --seconds.

Setup, not timed: the template is migrated and seeded through the service layer
(``bootstrap.running`` + ``accounts.add_user`` / ``accounts.add_goods``) before any server
starts: an admin, the seller, and --orders + --warmup goods. On each fresh server the buyers are
created through ``POST /api/admin/users`` and --warmup orders are placed at the same concurrency
(not recorded). Then the timed phase.

Per point: orders placed, non-201 answers by status, throughput, latency p50/p95/p99/max
(``time.perf_counter`` around each request), the server's peak RSS (VmHWM) and the CPU time
the server and this load generator spent per order (both share the same cores).

    .venv/bin/python benchmarks/http_place.py                          # 5,000 orders at 1,8,32,64
    .venv/bin/python benchmarks/http_place.py --concurrency 32 --no-worker --orders 2000
    .venv/bin/python benchmarks/http_place.py --py-spy /tmp/spy        # sample the server too
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from dueflow.service.operations import percentile

sys.path.insert(0, str(Path(__file__).parent))
import _seed

PY_SPY = Path(sys.executable).parent / "py-spy"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def env_for(path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "DUEFLOW_DATABASE_URL": f"sqlite:///{path}",
        "DUEFLOW_PROFILE": "prod",
    }


@dataclass
class Template:
    path: Path
    admin_token: str
    goods: list[int]


def seed_template(path: Path, goods: int) -> Template:
    """Migrate and seed through the service layer, before any server runs."""
    from dueflow import bootstrap
    from dueflow.config import load_settings
    from dueflow.service import accounts

    async def go() -> Template:
        settings = load_settings(database_url=f"sqlite:///{path}", profile="prod")
        async with bootstrap.running(settings) as deps:
            _, admin_token = await accounts.add_user(deps, "admin", admin=True)
            seller, _ = await accounts.add_user(deps, "seller")
            ids = [
                await accounts.add_goods(
                    deps, seller_id=seller.id, title=f"item {i}", price="12.50"
                )
                for i in range(goods)
            ]
        return Template(path, admin_token, ids)

    template = asyncio.run(go())
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return template


def fresh_copy(template: Path, target: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        source = Path(f"{template}{suffix}")
        if source.exists():
            shutil.copyfile(source, f"{target}{suffix}")


@dataclass
class Phase:
    latencies: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0


async def place_all(
    client: httpx.AsyncClient,
    goods: list[int],
    buyers: list[str],
    concurrency: int,
    seconds: float,
) -> Phase:
    """C clients take the next goods id and place an order for it until the goods run out or
    the time does."""
    phase = Phase()
    next_index = iter(range(len(goods)))
    started = time.perf_counter()
    deadline = started + seconds

    async def one_client() -> None:
        for i in next_index:
            if time.perf_counter() >= deadline:
                return
            headers = {"Authorization": f"Bearer {buyers[i % len(buyers)]}"}
            t0 = time.perf_counter()
            try:
                answer = await client.post(
                    "/api/orders", json={"goods_id": goods[i]}, headers=headers
                )
            except httpx.HTTPError as exc:
                phase.errors[type(exc).__name__] += 1
                continue
            phase.latencies.append(time.perf_counter() - t0)
            phase.statuses[answer.status_code] += 1

    await asyncio.gather(*(one_client() for _ in range(concurrency)))
    phase.seconds = time.perf_counter() - started
    return phase


async def drive(
    port: int, admin_token: str, goods: list[int], args: argparse.Namespace, concurrency: int
) -> tuple[Phase, list[str]]:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", limits=limits, timeout=60
    ) as client:
        buyers = []
        for n in range(args.buyers):
            answer = await client.post(
                "/api/admin/users",
                json={"name": f"buyer{n}", "admin": False},
                headers={"Authorization": f"Bearer {admin_token}"},
            )
            answer.raise_for_status()
            buyers.append(answer.json()["token"])
        warm = goods[: args.warmup]
        await place_all(client, warm, buyers, concurrency, args.seconds)
        phase = await place_all(client, goods[args.warmup :], buyers, concurrency, args.seconds)
    return phase, buyers


def check(db: Path, expected: int) -> dict[str, int]:
    """What the database holds after the run: orders, distinct goods held, live timers."""
    conn = sqlite3.connect(db)
    try:
        one = conn.execute
        return {
            "orders": one("SELECT count(*) FROM orders").fetchone()[0],
            "goods_held": one(
                "SELECT count(*) FROM goods WHERE reserved_order_id IS NOT NULL"
            ).fetchone()[0],
            "pending_payment": one(
                "SELECT count(*) FROM orders WHERE status = 'pending_payment'"
            ).fetchone()[0],
            "place_events": one(
                "SELECT count(*) FROM order_events WHERE event = 'place'"
            ).fetchone()[0],
            "expected": expected,
        }
    finally:
        conn.close()


def point(
    args: argparse.Namespace, template: Template, tmp: Path, concurrency: int
) -> dict[str, object]:
    db = tmp / f"c{concurrency}.db"
    fresh_copy(template.path, db)
    port = free_port()
    spy = None
    with _seed.serving(env_for(db), port, tmp / f"c{concurrency}.log", worker=args.worker) as proc:
        if args.py_spy:
            # Attach before the run; the buyers and the warm-up give it time to start.
            out = Path(args.py_spy) / f"c{concurrency}{'' if args.worker else '-noworker'}.txt"
            out.parent.mkdir(parents=True, exist_ok=True)
            spy = subprocess.Popen(
                [
                    str(PY_SPY),
                    "record",
                    "--pid",
                    str(proc.pid),
                    "--format",
                    "raw",
                    "--rate",
                    "100",
                    "--output",
                    str(out),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        cpu0 = cpu_seconds(proc.pid)
        client0 = time.process_time()
        phase, _ = asyncio.run(drive(port, template.admin_token, template.goods, args, concurrency))
        client_cpu = time.process_time() - client0
        server_cpu = cpu_seconds(proc.pid) - cpu0  # includes buyers + warm-up: a few %
        _, peak_kib = _seed.rss_kib(proc.pid)
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(timeout=60)
    placed = phase.statuses.get(201, 0)
    lat = sorted(phase.latencies)
    ms = [x * 1000 for x in lat]
    state = check(db, args.warmup + placed)
    return {
        "concurrency": concurrency,
        "worker": args.worker,
        "requests": len(lat) + sum(phase.errors.values()),
        "placed": placed,
        "non_201": {str(k): v for k, v in sorted(phase.statuses.items()) if k != 201},
        "transport_errors": dict(phase.errors),
        "seconds": round(phase.seconds, 2),
        "orders_per_s": round(placed / phase.seconds, 1) if phase.seconds else None,
        "p50_ms": round(percentile(ms, 50), 1) if ms else None,
        "p95_ms": round(percentile(ms, 95), 1) if ms else None,
        "p99_ms": round(percentile(ms, 99), 1) if ms else None,
        "max_ms": round(ms[-1], 1) if ms else None,
        "server_cpu_ms_per_order": round(server_cpu * 1000 / placed, 2) if placed else None,
        "client_cpu_ms_per_order": round(client_cpu * 1000 / placed, 2) if placed else None,
        "server_peak_rss_mib": round(peak_kib / 1024, 1),
        "db": state,
        "ok": not phase.errors
        and placed == len(lat)
        and state["orders"]
        == state["goods_held"]
        == state["pending_payment"]
        == state["place_events"]
        == state["expected"],
    }


def table(results: list[dict[str, object]]) -> str:
    head = (
        "| C | worker | placed | non-201 | orders/s | p50 / p95 / p99 / max (ms) "
        "| server CPU ms/order | client CPU ms/order | server peak RSS (MiB) |"
    )
    lines = [head, "|" + "---|" * 9]
    for r in results:
        bad = ", ".join(f"{k}: {v}" for k, v in r["non_201"].items()) or "0"  # type: ignore[attr-defined]
        lines.append(
            f"| {r['concurrency']} | {'on' if r['worker'] else 'off'} | {r['placed']:,} | {bad} "
            f"| {r['orders_per_s']} | {r['p50_ms']} / {r['p95_ms']} / {r['p99_ms']} / "
            f"{r['max_ms']} | {r['server_cpu_ms_per_order']} | {r['client_cpu_ms_per_order']} "
            f"| {r['server_peak_rss_mib']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--orders", type=int, default=5_000, help="at most this many per point")
    parser.add_argument("--seconds", type=float, default=60.0, help="at most this long per point")
    parser.add_argument(
        "--concurrency", default="1,8,32,64", help="comma-separated client counts to sweep"
    )
    parser.add_argument("--buyers", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=100, help="orders placed first, not timed")
    parser.add_argument(
        "--worker",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the worker, scanner and feeder beside the API (dueflow serve's default)",
    )
    parser.add_argument("--py-spy", default=None, help="directory for py-spy raw stacks")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    results = []
    with tempfile.TemporaryDirectory(prefix="dueflow-http-place-") as tmp:
        started = time.perf_counter()
        template = seed_template(Path(tmp) / "template.db", args.orders + args.warmup)
        print(
            f"seeded {len(template.goods):,} goods in {time.perf_counter() - started:.1f} s",
            file=sys.stderr,
        )
        for concurrency in levels:
            results.append(point(args, template, Path(tmp), concurrency))
            print(json.dumps(results[-1]), flush=True)
    print(table(results), flush=True)
    if not all(r["ok"] for r in results):
        print("HTTP PLACE INCOMPLETE: errors or a database mismatch, see above", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

"""How long each admin page and ``dueflow status`` take over a large database (the one
``benchmarks/seed_orders.py`` seeds): median and max of ``--rounds`` requests per page, in
process (the app over an ASGI transport, a signed-in admin), and the status command's reads.

    .venv/bin/python benchmarks/seed_orders.py
    .venv/bin/python benchmarks/dashboard_pages.py \\
        --url postgresql://postgres@127.0.0.1:5432/dueflow_bench_million --rounds 7

An admin user ``bench-admin`` is added to that database (a fresh token each run). The code
before this benchmark (no bounded check, no ``/admin/invariants``) is timed the same way with its
tree first on the path: ``mkdir /tmp/before && git archive 7730f27 src | tar -x -C /tmp/before``
then ``PYTHONPATH=/tmp/before/src .venv/bin/python benchmarks/dashboard_pages.py`` (it times
``check_invariants`` for both checks there, and skips the pages it does not have). ``dueflow status``
and ``status --full`` are timed as commands too (their wall time includes starting Python).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx

from dueflow import bootstrap
from dueflow.api.app import create_app
from dueflow.config import load_settings
from dueflow.service import accounts, report

URL = "postgresql://postgres@127.0.0.1:5432/dueflow_bench_million"
PAGES = (
    "/admin",
    "/admin/refunds",
    "/admin/refunds?state=failed",
    "/admin/timers?state=stuck",
    "/admin/timers?state=parked",
    "/admin/timers?state=scheduled",
    "/admin/timers?state=done",
    "/admin/orders/500000",
    "/admin/shows",
    "/admin/shows/1",
    "/admin/skus",
    "/admin/flash-sales",
    "/admin/coupons",
    "/admin/webhooks",
    "/admin/keys",
)


async def timed(rounds: int, call: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    """Median and max milliseconds of ``rounds`` calls (after one unmeasured warm-up)."""
    await call()
    took = []
    for _ in range(rounds):
        started = time.perf_counter()
        await call()
        took.append((time.perf_counter() - started) * 1000)
    return statistics.median(took), max(took)


async def pages(url: str, rounds: int, full_rounds: int) -> None:
    settings = load_settings(database_url=url)
    async with bootstrap.running(settings) as deps:
        _, token = await accounts.issue_token(deps, "bench-admin", admin=True)
        app = create_app(deps, session_secret="s" * 32, session_ttl=timedelta(hours=1))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://admin.test") as client:
            answer = await client.post("/admin/login", data={"token": token, "next": "/admin"})
            assert answer.status_code == 303, answer.text
            print(f"{'what':42} {'median ms':>10} {'max ms':>10}")
            for path in PAGES:
                if (await client.get(path)).status_code == 404:
                    print(f"GET {path:38} {'-':>10} {'-':>10} (not in this tree)")
                    continue

                async def get(path: str = path) -> None:
                    answer = await client.get(path)
                    assert answer.status_code == 200, (path, answer.status_code)

                median, worst = await timed(rounds, get)
                print(f"GET {path:38} {median:10.1f} {worst:10.1f}", flush=True)
            recent = getattr(report, "check_recent", report.check_invariants)
            full = getattr(report, "check_full", report.check_invariants)

            async def status_reads() -> Any:
                """What ``dueflow status`` reads: side by side where the tree can."""
                if hasattr(report, "snapshot_and_check"):
                    return await report.snapshot_and_check(deps)
                return await recent(deps), await report.snapshot(deps)

            reads: dict[str, Callable[[], Awaitable[Any]]] = {
                "report.snapshot (status, /metrics)": lambda: report.snapshot(deps),
                "invariants.check_recent (status)": lambda: recent(deps),
                "the two together (status' reads)": status_reads,
            }
            for label, read in reads.items():
                median, worst = await timed(rounds, read)
                print(f"{label:42} {median:10.1f} {worst:10.1f}", flush=True)
            median, worst = await timed(full_rounds, lambda: full(deps))
            print(f"{'invariants.check_full (status --full)':42} {median:10.1f} {worst:10.1f}")
            if (await client.get("/admin/invariants")).status_code != 404:
                median, worst = await timed(full_rounds, lambda: client.get("/admin/invariants"))
                print(f"{'GET /admin/invariants (the full check)':42} {median:10.1f} {worst:10.1f}")


def commands(url: str) -> None:
    """``dueflow status`` and ``status --full``, as an operator runs them (wall time)."""
    dueflow = str(Path(sys.executable).with_name("dueflow"))
    env = {**os.environ, "DUEFLOW_DATABASE_URL": url, "COLUMNS": "120"}
    for args in ([], ["--full"]):
        started = time.perf_counter()
        done = subprocess.run([dueflow, "status", *args], env=env, capture_output=True)
        took = (time.perf_counter() - started) * 1000
        if done.returncode == 2:  # a usage error: no --full in this tree
            print(f"{'$ dueflow status ' + ' '.join(args):42} {'-':>10} (not in this tree)")
            continue
        done.check_returncode()
        print(f"{'$ dueflow status ' + ' '.join(args):42} {took:10.1f} (wall, with start-up)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=URL)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--full-rounds", type=int, default=2)
    args = parser.parse_args()
    asyncio.run(pages(args.url, args.rounds, args.full_rounds))
    commands(args.url)


if __name__ == "__main__":
    main()

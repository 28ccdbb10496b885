"""The empty scan: 1,000,000 live orders with pending timers, none of them due.

Measures one scanner pass and one worker claim when nothing is due (both must stay one index
seek however large the tables grow), and the worker's RSS against that database compared with an
empty one (memory must not grow with pending timers). Run: ``.venv/bin/python benchmarks/empty_scan.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import _seed
from dueflow import bootstrap
from dueflow.config import load_settings
from dueflow.store import timers
from dueflow.worker.runner import Worker
from dueflow.worker.scanner import scan_once

DUEFLOW = Path(sys.executable).parent / "dueflow"


async def timings(path: Path, repeats: int) -> dict[str, float]:
    settings = load_settings(database_url=f"sqlite:///{path}")
    async with bootstrap.running(settings, migrate_sqlite=False) as deps:
        worker = Worker(deps)
        await scan_once(worker)  # warm the cache and the statement cache
        scans, claims = [], []
        for _ in range(repeats):
            report = await scan_once(worker)
            assert report.claimed == 0
            scans.append(report.seconds * 1000)
            started = time.perf_counter()
            async with deps.db.write() as conn:
                claimed = await timers.claim_due(
                    conn, now=deps.clock.now(), limit=deps.batch_size, lease=deps.lease
                )
            assert not claimed
            claims.append((time.perf_counter() - started) * 1000)
    return {
        "scan_ms_median": round(statistics.median(scans), 2),
        "scan_ms_max": round(max(scans), 2),
        "claim_ms_median": round(statistics.median(claims), 2),
    }


def worker_rss(path: Path, settle: float = 4.0) -> float:
    env = {**os.environ, "DUEFLOW_DATABASE_URL": f"sqlite:///{path}"}
    proc = subprocess.Popen(
        [str(DUEFLOW), "worker"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        time.sleep(settle)
        _, peak = _seed.rss_kib(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return round(peak / 1024, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--orders", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dueflow-scan-") as tmp:
        empty = Path(tmp) / "empty.db"
        full = Path(tmp) / "full.db"
        _seed.migrated(empty)
        _seed.migrated(full)
        started = time.perf_counter()
        _seed.seed_unpaid(full, args.orders, datetime.now(UTC) + timedelta(days=7))
        seed_s = time.perf_counter() - started
        result = {
            "orders": args.orders,
            "seed_seconds": round(seed_s, 1),
            "db_mib": round(full.stat().st_size / 2**20, 1),
            **asyncio.run(timings(full, args.repeats)),
            "worker_peak_rss_mib_empty_db": worker_rss(empty),
            "worker_peak_rss_mib_full_db": worker_rss(full),
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""The herd: N unpaid orders whose pay deadline falls in the same second, one worker process.

Measures, from the due second until every order is cancelled with its goods released:
throughput, lateness p50/p99/max (timer deadline to the start of the batch that cancelled it),
and the worker's peak RSS. Run: ``make bench`` or ``.venv/bin/python benchmarks/herd.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import _seed

DUEFLOW = Path(sys.executable).parent / "dueflow"


def percentile(values: list[float], pct: float) -> float:
    index = min(len(values) - 1, max(0, round(pct / 100 * (len(values) - 1))))
    return values[index]


def run(orders: int, batch_size: int, lead: float, timeout: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="dueflow-herd-") as tmp:
        path = Path(tmp) / "herd.db"
        _seed.migrated(path)
        t = time.perf_counter()
        _seed.seed_unpaid(path, orders, datetime.now(UTC) + timedelta(days=7))
        seed_s = time.perf_counter() - t
        env = {
            **os.environ,
            "DUEFLOW_DATABASE_URL": f"sqlite:///{path}",
            "DUEFLOW_BATCH_SIZE": str(batch_size),
            "DUEFLOW_LEASE": "5m",
        }
        worker = subprocess.Popen(
            [str(DUEFLOW), "worker", "--no-scanner"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            time.sleep(2.0)  # let the worker start and go idle
            idle_rss, _ = _seed.rss_kib(worker.pid)
            due = datetime.now(UTC) + timedelta(seconds=lead)
            _seed.set_due(path, due)
            conn = sqlite3.connect(path, timeout=30)
            peak = 0
            finished_seen = None
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                cancelled = conn.execute(
                    "SELECT count(*) FROM orders WHERE status = 'cancelled_unpaid'"
                ).fetchone()[0]
                peak = max(peak, _seed.rss_kib(worker.pid)[1])
                if cancelled == orders:
                    finished_seen = datetime.now(UTC)
                    break
                time.sleep(0.05)
            peak = max(peak, _seed.rss_kib(worker.pid)[1])
        finally:
            worker.terminate()
            worker.wait(timeout=30)
        rows = conn.execute(
            "SELECT deadline_at, done_at FROM timers WHERE state = 'done'"
        ).fetchall()
        released = conn.execute(
            "SELECT count(*) FROM goods WHERE reserved_order_id IS NULL AND status = 'on_sale'"
        ).fetchone()[0]
        events = conn.execute(
            "SELECT count(*) FROM order_events WHERE event = 'pay_timeout'"
        ).fetchone()[0]
        conn.close()
    late = sorted((_seed.parse(d) - _seed.parse(a)).total_seconds() for a, d in rows)
    last = max(_seed.parse(d) for _, d in rows) if rows else due
    drain = (last - due).total_seconds()
    return {
        "orders": orders,
        "batch_size": batch_size,
        "seed_seconds": round(seed_s, 1),
        "done": len(rows),
        "goods_released": released,
        "cancel_events": events,
        "drain_seconds": round(drain, 3),
        "observed_seconds": round((finished_seen - due).total_seconds(), 3)
        if finished_seen
        else None,
        "throughput_per_s": round(orders / drain) if drain > 0 else None,
        "lateness_p50_s": round(percentile(late, 50), 3) if late else None,
        "lateness_p99_s": round(percentile(late, 99), 3) if late else None,
        "lateness_max_s": round(late[-1], 3) if late else None,
        "worker_idle_rss_mib": round(idle_rss / 1024, 1),
        "worker_peak_rss_mib": round(peak / 1024, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--orders", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, action="append")
    parser.add_argument("--lead", type=float, default=2.0, help="seconds from arming to due")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    for batch_size in args.batch_size or [200]:
        result = run(args.orders, batch_size, args.lead, args.timeout)
        print(json.dumps(result), flush=True)
        ok = result["done"] == result["goods_released"] == result["cancel_events"] == args.orders
        if not ok:
            print("HERD INCOMPLETE: not every order was cancelled exactly once", file=sys.stderr)
            sys.exit(1)


if __name__ == "__main__":
    main()

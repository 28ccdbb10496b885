"""The herd: N unpaid orders whose pay deadline falls in the same second.

With ``--reminders`` every order's ``pay_reminder`` falls due a second before the herd (a wall
of messages due ahead of the cancels, as when the worker is behind).

Measures, from the due second until every order is cancelled with its goods released:
throughput, lateness p50/p99/max (deadline to the start of the batch that cancelled it), and the
workers' peak RSS. With ``--notices`` it waits for every cancel's ``order_closed`` notice too and
gives their drain (the due second to the last notice sent) and rate. Any store and trigger:

    .venv/bin/python benchmarks/herd.py                       # SQLite + db, 100,000 orders
    .venv/bin/python benchmarks/herd.py --database-url postgresql://postgres@127.0.0.1/test \\
        --trigger-url redis://127.0.0.1:6379/0 --workers 2
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
from datetime import UTC, datetime, timedelta
from pathlib import Path

from dueflow.service.operations import percentile

sys.path.insert(0, str(Path(__file__).parent))
import _backends
import _seed

DUEFLOW = Path(sys.executable).parent / "dueflow"


async def run(args: argparse.Namespace, tmp: Path) -> dict[str, object]:
    path = tmp / "herd.db"
    url = args.database_url or f"sqlite:///{path}"
    db = await _backends.fresh(url)
    started = time.perf_counter()
    await _backends.seed_unpaid(db, url, path, args.orders, datetime.now(UTC) + timedelta(days=7))
    seed_s = time.perf_counter() - started
    env = {
        **os.environ,
        "DUEFLOW_DATABASE_URL": url,
        "DUEFLOW_TRIGGER_URL": args.trigger_url,
        "DUEFLOW_BATCH_SIZE": str(args.batch_size),
        "DUEFLOW_LEASE": "5m",
    }
    workers = [
        subprocess.Popen(
            [str(DUEFLOW), "worker", "--no-scanner"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(args.workers)
    ]
    try:
        await asyncio.sleep(3.0)  # let the workers start and go idle
        idle_cpu = [_cpu_seconds(w.pid) for w in workers]
        due = datetime.now(UTC) + timedelta(seconds=args.lead)
        await _backends.set_due(db, due)
        if args.reminders:
            await _backends.add_reminders(db, due - timedelta(seconds=1))
        if args.trigger_url != "db":
            await _arm_trigger(args.trigger_url, db)
        peak = 0
        finished = None
        notices_last = None
        limit = time.monotonic() + args.timeout
        while time.monotonic() < limit:
            peak = max(peak, sum(_seed.rss_kib(w.pid)[1] for w in workers))
            if finished is None and await _backends.cancelled(db) == args.orders:
                finished = datetime.now(UTC)
                if not args.notices:
                    break
            if finished is not None:
                sent, notices_last = await _backends.notices_sent(db)
                if sent == args.orders:
                    break
            await asyncio.sleep(0.1)
        cpu_s = sum(_cpu_seconds(w.pid) for w in workers) - sum(idle_cpu)
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait(timeout=30)
    result = await _backends.outcome(db)
    reminders = await _backends.reminders_settled(db) if args.reminders else None
    await db.dispose()
    late = result["late"]
    drain = (result["last"] - due).total_seconds() if result["last"] else float("nan")
    notices = (notices_last - due).total_seconds() if notices_last else None
    return {
        "database": db.dialect,
        "trigger": args.trigger_url.split("://")[0],
        "workers": args.workers,
        "orders": args.orders,
        "batch_size": args.batch_size,
        "seed_seconds": round(seed_s, 1),
        "done": result["done"],
        "goods_released": result["released"],
        "cancel_events": result["events"],
        "drain_seconds": round(drain, 3),
        "observed_seconds": round((finished - due).total_seconds(), 3) if finished else None,
        "throughput_per_s": round(args.orders / drain) if drain > 0 else None,
        "lateness_p50_s": round(percentile(late, 50), 3) if late else None,
        "lateness_p99_s": round(percentile(late, 99), 3) if late else None,
        "lateness_max_s": round(late[-1], 3) if late else None,
        "workers_peak_rss_mib": round(peak / 1024, 1),
        # The workers' CPU from the arming to the end (the cancels, and the notices with
        # --notices), per order: steadier than the rates on a shared machine.
        "cpu_ms_each": round(1000 * cpu_s / args.orders, 3),
        "notices_drain_seconds": round(notices, 3) if notices else None,
        "notices_per_s": round(args.orders / notices) if notices else None,
        "reminders": reminders,
    }


def _cpu_seconds(pid: int) -> float:
    """User and system CPU a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _arm_trigger(trigger_url: str, db) -> None:
    """The deadlines were moved behind the trigger's back: hand it the timers as the feeder would."""
    from dueflow.store import timers
    from dueflow.timers import registry

    trigger = registry.from_url(trigger_url)
    try:
        after = None
        while True:
            async with db.read() as conn:
                page = await timers.scheduled_between(
                    conn,
                    since=None,
                    until=datetime.now(UTC) + timedelta(hours=1),
                    after=after,
                    limit=5000,
                )
            if not page:
                return
            await trigger.feed(page)
            after = (page[-1].due_at, page[-1].id)
    finally:
        await trigger.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--orders", type=int, default=100_000)
    parser.add_argument("--database-url", default=None, help="default: a fresh SQLite file")
    parser.add_argument("--trigger-url", default="db")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--lead", type=float, default=3.0, help="seconds from arming to due")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument(
        "--notices",
        action="store_true",
        help="also wait for every order_closed notice to be sent (their drain from the due second)",
    )
    parser.add_argument(
        "--reminders",
        action="store_true",
        help="each order's pay reminder due a second before the herd: messages ahead of it",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dueflow-herd-") as tmp:
        result = asyncio.run(run(args, Path(tmp)))
    print(json.dumps(result), flush=True)
    if not result["done"] == result["goods_released"] == result["cancel_events"] == args.orders:
        print("HERD INCOMPLETE: not every order was cancelled exactly once", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

"""What this machine can do, measured before the soak's legs (issue 28, item 3).

A leg's load used to be a fixed rate (8.5 orders a second), which a machine three times slower
could not carry: it measured the overload, not dueflow. Now the soak first measures, on the
machine as it is:

- the **place rate** of each database the legs use: ``benchmarks/http_place.py`` (wrk against
  ``dueflow serve``, as many API processes as the leg runs, the worker on), its orders a second
  and its server CPU an order;
- the **herd rate** of each leg's database and trigger: ``benchmarks/herd.py`` (N unpaid orders
  due in one second, as many workers as the leg runs, at most two), its cancels a second.

A leg then runs at a stated share of what the machine carries of the soak's load:
``share x min(place rate / PERSON_COST, herd rate / TIMERS_PER_PERSON)`` people a second. A
soak person is far more than one place (its views while it waits, payments through the simulator,
notifications, ships, refunds, the worker's timers, notices and webhooks):
:data:`PERSON_COST` is what one costs the fleet in places, measured on this machine (the
overload leg, which runs no faults, measures it again: its fleet's CPU a person against the
place benchmark's CPU an order, in the leg's results), and :data:`TIMERS_PER_PERSON` is the
timers one arms. A slow machine and a fast one are so loaded alike: the same share of each.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
#: What one soak person costs the fleet, in places of ``benchmarks/http_place.py`` (server CPU).
#: Measured: the overload leg of 2026-12-07 (run with 50, docs/reliability.md) used 34.7
#: places' CPU a person; its "150 %" then kept the fleet at about one core of two.
PERSON_COST = 35.0
#: Timers a soak person arms, all kinds (reminder, cancel or receipt and review, notices, closes).
TIMERS_PER_PERSON = 6.0


@dataclass(frozen=True)
class Target:
    """What one leg runs on, as the calibration needs it."""

    leg: str
    database: str  # "sqlite" or "postgres"
    database_url: str  # for the herd: a scratch database of its own (a fresh file on SQLite)
    trigger_url: str  # the leg's trigger ("db", redis://, amqp://), with a prefix of its own
    api: int  # API processes
    workers: int  # worker processes (0: the worker runs inside the one API process)


#: A benchmark that fails (its server not healthy in time on a machine this busy) is run again
#: this many times in all before the soak gives up.
TRIES = 3


async def _json_of(args: list[str], limit: float) -> dict[str, Any]:
    """Run a benchmark (again, up to :data:`TRIES` times, when it fails); the JSON object on
    its last line that starts with ``{``."""
    for attempt in range(1, TRIES + 1):
        done = await asyncio.to_thread(
            subprocess.run, args, cwd=ROOT, capture_output=True, text=True, timeout=limit
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode == 0 and lines:
            result: dict[str, Any] = json.loads(lines[-1])
            return result
        print(f"soak: calibrating: {' '.join(args[1:3])} failed, try {attempt}", flush=True)
    raise RuntimeError(
        f"calibration: {' '.join(args[1:3])} failed {TRIES} times ({done.returncode}):"
        f" {done.stdout[-2000:]}{done.stderr[-2000:]}"
    )


async def place_rate(target: Target, seconds: float) -> dict[str, Any]:
    """The place rate on the leg's database with its API processes (one run of the
    benchmark, no reference): orders a second, server CPU an order, p99."""
    args = [sys.executable, "benchmarks/http_place.py", "--no-reference"]
    args += ["--seconds", f"{seconds:g}", "--warmup", "200", "--orders", str(int(seconds * 1500))]
    args += ["--processes", str(target.api)]
    if target.database == "postgres":
        args += ["--backend", "postgres", "--postgres-url", target.database_url]
    out = await _json_of(args, limit=300)
    (run,) = out["runs"]
    if not run["ok"]:
        raise RuntimeError(f"calibration: the place benchmark's checks failed: {run}")
    return {
        "orders_per_s": run["orders_per_s"],
        "server_cpu_ms_per_order": run["server_cpu_ms_per_order"],
        "p99_ms": run["p99_ms"],
        "processes": target.api,
        "database": target.database,
    }


async def herd_rate(target: Target, orders: int) -> dict[str, Any]:
    """The herd rate of the leg's database and trigger: ``orders`` unpaid orders due in one
    second, drained by the leg's workers (two at most: the herd's own processes)."""
    workers = max(1, min(target.workers, 2))
    args = [sys.executable, "benchmarks/herd.py", "--orders", str(orders)]
    args += ["--workers", str(workers), "--trigger-url", target.trigger_url]
    if target.database != "sqlite":
        args += ["--database-url", target.database_url]
    out = await _json_of(args, limit=300)
    if out["done"] != orders or out["goods_released"] != orders:
        raise RuntimeError(f"calibration: the herd did not drain: {out}")
    return {
        "cancels_per_s": out["throughput_per_s"],
        "lateness_p99_s": out["lateness_p99_s"],
        "orders": orders,
        "workers": workers,
        "trigger": target.trigger_url.split(":", 1)[0],
    }


async def measure(
    targets: list[Target], *, place_seconds: float, herd_orders: int
) -> dict[str, Any]:
    """Measure every database's place rate once (the first leg on it, with its API
    processes) and every leg's herd rate, one after the other (each alone on the machine)."""
    began = time.monotonic()
    place: dict[str, dict[str, Any]] = {}
    herd: dict[str, dict[str, Any]] = {}
    for target in targets:
        key = f"{target.database}x{target.api}"
        if key not in place:
            print(
                f"soak: calibrating: place rate on {target.database}, {target.api} API", flush=True
            )
            place[key] = await place_rate(target, place_seconds)
        if target.leg not in herd:
            print(f"soak: calibrating: herd rate of leg {target.leg}", flush=True)
            herd[target.leg] = await herd_rate(target, herd_orders)
    return {"place": place, "herd": herd, "seconds": round(time.monotonic() - began, 1)}


def leg_rate(machine: dict[str, Any], target: Target, share: float) -> dict[str, Any]:
    """The people a second a leg runs at: ``share`` of what the machine carries of the soak's
    load on the leg's database and trigger, and the figures it came from."""
    place = machine["place"][f"{target.database}x{target.api}"]["orders_per_s"]
    herd = machine["herd"][target.leg]["cancels_per_s"]
    by_place, by_herd = place / PERSON_COST, herd / TIMERS_PER_PERSON
    return {
        "rate": round(share * min(by_place, by_herd), 2),
        "share": share,
        "place_rate": place,
        "herd_rate": herd,
        "person_cost": PERSON_COST,
        "timers_per_person": TIMERS_PER_PERSON,
        "bound_by": "place" if by_place <= by_herd else "herd",
    }

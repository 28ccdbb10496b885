"""The chaos soak (issues 14 and 28): the real system as a fleet, under load and faults, then
checked.

``python -m tests.soak`` (``make soak``, about 35 minutes) first measures what the machine can do
(:mod:`tests.soak.calibrate`: the place rate of each database, the herd rate of each leg's
database and trigger), then runs four legs one after the other, each at a stated share of what
the machine carries (:data:`SHARE`), so that a slow machine and a fast one are loaded alike:

1. PostgreSQL + Redis (trigger, locks, seat cache): 2 API processes, 3 workers, one of them with
   its clock 30 s fast; 16 minutes at 40 % with 44 faults of every kind that applies.
2. PostgreSQL + RabbitMQ (the trigger) with Redis for the locks and the seat cache: the same
   fleet for 4 minutes, with each kind of fault at least once (RabbitMQ's queues purged among
   them).
3. SQLite: one ``dueflow serve`` with its worker inside, restarted and frozen, for 90 s.
4. **Overload**: the fleet of leg 1, no faults, placing at 150 % of what the machine carries for
   3 minutes, then no more. Its promises are every other leg's, but the lateness bounds are the
   overload's (:data:`OVERLOAD_MUST_LATE` more for must-happen deadlines,
   :data:`OVERLOAD_MESSAGE_LATE` for messages), and its backlog (timers due and not done) drained
   within :data:`OVERLOAD_DRAIN` of the last order placed.

``python -m tests.soak --short`` (the test suite's version, about three minutes) calibrates the
same way, briefly, and runs leg 2 for one minute. Each leg: fresh database, the fleet started,
the load generator and the chaos driver at once (faults at random moments, each at least a lease
and a scan interval after the one before, so the lateness each causes is its own), then the
fleet is healed (frozen processes resumed, dead ones started) and left to settle (every order
final, every timer done, every event delivered), the simulator's records are read, the fleet
stopped and the invariant checker run. Any violation fails the run with its evidence; the full
run writes docs/reliability.md and its plot.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import secrets
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import func, select

from dueflow.store.db import Database
from dueflow.store.schema import event_deliveries, order_events, orders, refunds, timers
from tests.soak import calibrate, checker, report
from tests.soak.chaos import FAULTS as FAULT_KINDS
from tests.soak.chaos import Chaos
from tests.soak.fleet import Fleet, LegConfig
from tests.soak.load import Plan, Target, run_load
from tests.soak.receiver import receiving

PG = "postgresql://postgres@127.0.0.1:5432"
REDIS = "redis://127.0.0.1:6379"
RABBIT = "amqp://guest:guest@127.0.0.1:5672/"
ROOT = Path(__file__).resolve().parents[2]

#: Short deadlines: an order's whole life (pay, ship, receive, review) in under a minute.
SETTINGS = {
    "DUEFLOW_PROFILE": "prod",
    "DUEFLOW_REMINDER_AFTER": "4s",
    "DUEFLOW_PAY_TIMEOUT": "10s",
    "DUEFLOW_SHIP_TIMEOUT": "12s",
    "DUEFLOW_RECEIVE_TIMEOUT": "10s",
    "DUEFLOW_REVIEW_TIMEOUT": "8s",
    "DUEFLOW_ORDER_TYPES": json.dumps(
        {
            "ticket": {"pay": "10s", "reminder": "4s"},
            "shop": {"pay": "10s", "reminder": "4s"},
            "flash": {"pay": "8s", "reminder": "3s"},
        }
    ),
    "DUEFLOW_LEASE": "8s",
    "DUEFLOW_SCAN_INTERVAL": "4s",
    "DUEFLOW_SCAN_GRACE": "1s",
    "DUEFLOW_SEAT_RECONCILE_INTERVAL": "10s",
}
LEASE, SCAN_INTERVAL, GRACE = 8.0, 4.0, 1.0
#: A frozen worker stays frozen this long: past its lease.
FREEZE = LEASE + 3
#: From a freeze's start to a moment after its resume.
FREEZE_SPAN = timedelta(seconds=FREEZE + 1)
#: The longest the chaos plan may go on after the load has ended.
CHAOS_AFTER_LOAD = 120.0
#: The longest a leg waits, after the load, for every order to end and every timer to be done.
SETTLE = 240.0
#: The share of what the machine carries (tests.soak.calibrate) a leg runs at, and the
#: overload leg's.
SHARE, OVERLOAD_SHARE = 0.4, 1.5
#: How much later than the quiet bound a must-happen deadline may be acted on in the overload
#: leg, and a message (a pay reminder) sent: the overload's own bounds (seconds).
OVERLOAD_MUST_LATE, OVERLOAD_MESSAGE_LATE = 15.0, 60.0
#: The overload leg's backlog (timers due more than a scan's grace ago and not done) is gone
#: within this long of the last order placed (seconds).
OVERLOAD_DRAIN = 60.0


@dataclass(frozen=True)
class Leg:
    """One leg: what it runs on, how long it places orders, at what share of what the machine
    carries (:mod:`tests.soak.calibrate`), how many faults; an overload leg is judged by the
    overload's bounds."""

    config: LegConfig
    seconds: float
    share: float
    faults: int
    overload: bool = False
    #: The leg whose herd rate this one's pace is made of (its own by default).
    calibrated_as: str = ""

    def target(self, database: str, tag: str) -> calibrate.Target:
        """What the calibration measures for this leg: a scratch database and trigger prefix
        of its own."""
        config = self.config
        trigger = config.trigger_url.replace(f"soak-{tag}", f"soakcal-{tag}")
        if config.own_redis and trigger.startswith("redis"):
            trigger = f"{REDIS}/13?prefix=soakcal-{tag}"
        return calibrate.Target(
            leg=self.calibrated_as or config.name,
            database="sqlite" if config.sqlite else "postgres",
            database_url="" if config.sqlite else f"{PG}/{database}_calib",
            trigger_url=trigger,
            api=1 if config.sqlite else config.api,
            workers=config.workers,
        )


def legs(short: bool, tag: str, database: str) -> list[Leg]:
    """The legs of a run; ``tag`` keeps this run's Redis keys and RabbitMQ queues apart. Every
    leg that uses Redis runs a ``redis-server`` of its own (``own_redis``): the chaos FLUSHALLs
    and restarts it, never the machine's shared one, which other test runs may be using."""
    redis = f"{REDIS}/13?prefix=soak-{tag}"
    rabbit = f"{RABBIT}?prefix=soak-{tag}"
    on_rabbitmq = LegConfig(
        "postgresql-rabbitmq",
        "PostgreSQL + RabbitMQ trigger + Redis locks (a redis-server of its own), 2 API "
        "processes, 3 workers",
        f"{PG}/{database}",
        trigger_url=rabbit,
        redis_url=f"{REDIS}/13",
        settings=SETTINGS,
        own_redis=True,
    )
    if short:
        return [Leg(on_rabbitmq, seconds=60, share=SHARE, faults=6)]
    on_redis = LegConfig(
        "postgresql-redis",
        "PostgreSQL + Redis (a redis-server of its own, restarted by the chaos), 2 API "
        "processes, 3 workers (one 30 s fast)",
        f"{PG}/{database}",
        trigger_url=redis,
        redis_url=f"{REDIS}/13",
        settings=SETTINGS,
        own_redis=True,
    )
    overloaded = LegConfig(
        **{
            **vars(on_redis),
            "name": "overload",
            "title": f"the fleet of postgresql-redis, no faults, at {OVERLOAD_SHARE:.0%} of what "
            "the machine carries, then no more orders",
        }
    )
    return [
        Leg(on_redis, seconds=960, share=SHARE, faults=44),
        Leg(on_rabbitmq, seconds=240, share=SHARE, faults=8),
        Leg(
            LegConfig(
                "sqlite",
                "SQLite, one process (API and worker)",
                "sqlite:///",  # a fresh file in the leg's directory
                api=1,
                workers=0,
                fast_clock=0,
                settings=SETTINGS,
            ),
            seconds=90,
            share=SHARE,
            faults=4,
        ),
        Leg(
            overloaded,
            seconds=180,
            share=OVERLOAD_SHARE,
            faults=0,
            overload=True,
            calibrated_as=on_redis.name,
        ),
    ]


async def fresh_postgres(url: str) -> None:
    """Drop and create the leg's PostgreSQL database."""
    import asyncpg

    base, name = url.rsplit("/", 1)
    conn = await asyncpg.connect(f"{base}/postgres")
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()


async def settle(database_url: str, seconds: float) -> dict[str, Any]:
    """Wait (bounded) until no order is live, no timer is scheduled or claimed, no refund is
    processing and every order event is numbered and delivered; what was left at the end. A
    parked timer is left too: no worker takes it again, and the soak fails on it."""
    live = ("pending_payment", "pending_shipment", "shipped", "received")
    db = Database.from_url(database_url)
    left: dict[str, Any] = {}
    try:
        end = time.monotonic() + seconds
        while True:
            async with db.report() as conn:
                left = {
                    "live_orders": await conn.scalar(
                        select(func.count()).where(orders.c.status.in_(live))
                    ),
                    "open_timers": await conn.scalar(
                        select(func.count()).where(timers.c.state.in_(("scheduled", "claimed")))
                    ),
                    "parked_timers": await conn.scalar(
                        select(func.count()).where(timers.c.state == "parked")
                    ),
                    "processing_refunds": await conn.scalar(
                        select(func.count()).where(refunds.c.state == "processing")
                    ),
                    "unnumbered_events": await conn.scalar(
                        select(func.count()).where(order_events.c.seq.is_(None))
                    ),
                    "undelivered_events": (
                        (await conn.scalar(select(func.max(order_events.c.seq))) or 0)
                        - (
                            await conn.scalar(
                                select(event_deliveries.c.delivered_seq).where(
                                    event_deliveries.c.name == "live"
                                )
                            )
                            or 0
                        )
                    ),
                }
            # Parked timers are not waited for (no worker takes them again), only reported.
            waiting = any(v for k, v in left.items() if k != "parked_timers")
            if not waiting or time.monotonic() > end:
                break
            await asyncio.sleep(1)
    finally:
        await db.dispose()
    left["settled"] = not any(v for k, v in left.items() if k != "settled")
    return left


async def watch_backlog(
    database_url: str, samples: list[tuple[datetime, int]], stop: asyncio.Event
) -> None:
    """Every second until ``stop``: how many timers are due more than a scan's grace ago and
    not done (scheduled or claimed), with when it was read."""
    db = Database.from_url(database_url)
    try:
        while not stop.is_set():
            with contextlib.suppress(Exception):  # a read that fails is a sample missed
                async with db.report() as conn:
                    now = datetime.now(UTC)
                    overdue = now - timedelta(seconds=GRACE)
                    count = await conn.scalar(
                        select(func.count()).where(
                            timers.c.state.in_(("scheduled", "claimed")),
                            timers.c.due_at < overdue,
                        )
                    )
                samples.append((now, int(count or 0)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
    finally:
        await db.dispose()


def drained(samples: list[tuple[datetime, int]], placing_ended: datetime) -> dict[str, Any]:
    """The backlog's figures: its peak, and how long after the last order placed it was last
    seen above zero (0 when it never was after)."""
    last = max((at for at, count in samples if count > 0), default=None)
    after = 0.0 if last is None else max(0.0, (last - placing_ended).total_seconds())
    return {
        "samples": len(samples),
        "peak": max((count for _, count in samples), default=0),
        "drained_after_s": round(after, 1),
        "limit_s": OVERLOAD_DRAIN,
    }


def cpu_figures(
    fleet: Fleet, began: float, ended: float, persons: int, place: dict[str, Any] | None
) -> dict[str, Any]:
    """The fleet's CPU over the load, a person's share of it, and that share in places of the
    place benchmark (what :data:`calibrate.PERSON_COST` stands for); only where no process
    was restarted (a restart loses what the dead process used)."""
    restarted = any(p.starts > 1 for p in fleet.processes())
    if restarted or not persons:
        return {"measured": False, "why": "processes restarted" if restarted else "no orders"}
    used = ended - began
    per_person_ms = 1000 * used / persons
    figures: dict[str, Any] = {
        "measured": True,
        "cpu_s": round(used, 1),
        "persons": persons,
        "cpu_ms_per_person": round(per_person_ms, 1),
    }
    if place:
        figures["places_per_person"] = round(per_person_ms / place["server_cpu_ms_per_order"], 1)
    return figures


async def run_leg(
    leg: Leg, pace: dict[str, Any], workdir: Path, seed: int, place: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One leg from a fresh database to its checked result, at ``pace['rate']`` people a second
    (:func:`calibrate.leg_rate`); ``place``: the calibration's place run on its database."""
    config = leg.config
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    if config.sqlite:
        config = LegConfig(**{**vars(config), "database_url": f"sqlite:///{workdir / 'soak.db'}"})
    else:
        await fresh_postgres(config.database_url)
    rng = random.Random(seed)
    started = datetime.now(UTC)
    with receiving() as (receiver, notify_base):
        fleet = Fleet(config, workdir, notify_base)
        try:
            await asyncio.to_thread(fleet.start)
            chaos = Chaos(fleet, rng, freeze_seconds=FREEZE)
            bounds = checker.Bounds(
                scan_interval=SCAN_INTERVAL,
                lease=LEASE,
                grace=GRACE,
                overload=OVERLOAD_MUST_LATE if leg.overload else 0.0,
                message_overload=OVERLOAD_MESSAGE_LATE if leg.overload else 0.0,
            )
            # A fault's lateness is over once a lost timer was found by a scan (grace and a scan
            # interval) and a dead claimer's lease ran out before the next scan.
            apart = GRACE + 2 * SCAN_INTERVAL + LEASE
            plan = chaos.schedule(leg.faults, leg.seconds, apart=apart) if leg.faults else []
            stop_chaos = asyncio.Event()
            chaos_task = asyncio.create_task(chaos.run(plan, stop_chaos))
            samples: list[tuple[datetime, int]] = []
            stop_watch = asyncio.Event()
            watching = asyncio.create_task(watch_backlog(config.database_url, samples, stop_watch))
            target = Target(fleet.api_urls, fleet.sim_url, fleet.admin_token)
            cpu_began = await asyncio.to_thread(fleet.cpu_seconds)
            load = await run_load(target, Plan(seconds=leg.seconds, rate=pace["rate"], seed=seed))
            cpu = cpu_figures(
                fleet,
                cpu_began,
                await asyncio.to_thread(fleet.cpu_seconds),
                len(load["order_ids"]),
                place,
            )
            # The plan runs to its end (its last faults may fall after the last order placed,
            # while the last people finish), bounded.
            await asyncio.wait([chaos_task], timeout=CHAOS_AFTER_LOAD)
            stop_chaos.set()
            await chaos_task
            await asyncio.to_thread(fleet.heal)
            left = await settle(config.database_url, SETTLE)
            stop_watch.set()
            await watching
            async with httpx.AsyncClient(timeout=30) as client:
                sim_state = (await client.get(f"{fleet.sim_url}/control/state")).json()
            status = await asyncio.to_thread(fleet.status)
        finally:
            exits = await asyncio.to_thread(fleet.stop)
        deliveries = receiver.snapshot()
    ended = datetime.now(UTC)
    frozen = [
        (datetime.fromisoformat(f["at"]), datetime.fromisoformat(f["at"]) + FREEZE_SPAN)
        for f in chaos.faults
        if f["kind"] == "sigstop_worker"
    ]
    checked = await checker.check(config.database_url, sim_state, deliveries, bounds, frozen=frozen)
    checks = list(checked["checks"])
    checks.append(
        {
            "name": "settled",
            "promise": "after the chaos, every order ended, every timer ran, every refund and "
            "event went out",
            "checked": 1,
            "violations": 0 if left["settled"] else 1,
            "evidence": [] if left["settled"] else [f"left after {SETTLE:.0f} s: {left}"],
        }
    )
    if plan:
        checks.append(
            {
                "name": "chaos_injected",
                "promise": "every fault the plan named was injected",
                "checked": len(plan),
                "violations": len(plan) - sum(1 for f in chaos.faults if f["kind"] in FAULT_KINDS),
                "evidence": [],
            }
        )
    backlog = drained(samples, datetime.fromisoformat(load["placing_ended"]))
    if leg.overload:
        late = backlog["drained_after_s"] > OVERLOAD_DRAIN
        checks.append(
            {
                "name": "backlog_drained",
                "promise": f"the timers due and not done were gone within {OVERLOAD_DRAIN:g} s "
                "of the last order placed",
                "checked": backlog["samples"],
                "violations": int(late),
                "evidence": [
                    f"backlog last seen {backlog['drained_after_s']} s after the last "
                    f"order placed (peak {backlog['peak']})"
                ]
                if late
                else [],
            }
        )
    (workdir / "status.txt").write_text(status)
    return {
        "name": config.name,
        "title": config.title,
        "started": started.isoformat(),
        "ended": ended.isoformat(),
        "seconds": (ended - started).total_seconds(),
        "fleet": {
            "api_processes": len(fleet.apis),
            "workers": len(fleet.workers),
            "trigger": config.trigger_url.split(":", 1)[0],
            "database": config.database_url.split(":", 1)[0],
            "fast_clock_worker": f"+{config.fast_clock} s"
            if fleet.workers and config.fast_clock
            else "none",
            "restarts": {p.name: p.starts - 1 for p in fleet.processes()},
            "exit_codes": exits,
        },
        "settings": dict(config.settings),
        "pace": pace,
        "overload": leg.overload,
        "cpu": cpu,
        "backlog": backlog,
        "load": load,
        "faults": chaos.faults,
        "checks": checks,
        "lateness": checked["lateness"],
        "figures": checked["figures"],
        "bounds": {
            "late_limit": bounds.must_limit,
            "message_late_limit": bounds.message_limit,
            "scan_interval": SCAN_INTERVAL,
            "lease": LEASE,
            "grace": GRACE,
        },
        "settle": left,
    }


def violations(result: dict[str, Any]) -> list[str]:
    """Every broken promise of a leg, with its evidence, as lines; a check that looked at
    nothing counts as broken (it proved nothing)."""
    lines = []
    for check in result["checks"]:
        if check["violations"] or not check["checked"]:
            lines.append(
                f"{result['name']}: {check['name']}: {check['violations']} violations"
                f" of {check['checked']} checked"
            )
            lines += [f"    {e}" for e in check["evidence"]]
    return lines


async def main_async(args: argparse.Namespace) -> int:
    """Run the legs; write the results (and the report for a full run); 1 on any violation."""
    tag = secrets.token_hex(3)
    workdir = Path(args.workdir) / f"soak-{tag}"
    chosen = [
        leg
        for leg in legs(args.short, tag, args.database)
        if leg.config.name in args.legs or not args.legs
    ]
    targets = [leg.target(args.database, tag) for leg in chosen]
    if any(t.database == "postgres" for t in targets):
        await fresh_postgres(f"{PG}/{args.database}_calib")
    # The short leg's pace is bound by the place rate (the herd's bound is about 15 times it:
    # docs/reliability.md), so its herd can be small and its place run brief: the suite pays
    # the short calibration, never the full one's.
    machine = await calibrate.measure(
        targets,
        place_seconds=2 if args.short else 10,
        herd_orders=600 if args.short else 20_000,
    )
    print(f"soak: the machine: {json.dumps(machine)}", flush=True)
    results = []
    for i, (leg, target) in enumerate(zip(chosen, targets, strict=True)):
        pace = calibrate.leg_rate(machine, target, leg.share)
        pace["machine"] = machine
        print(
            f"soak: leg {leg.config.name}: {leg.seconds:.0f} s at {pace['rate']}/s"
            f" ({leg.share:.0%} of what the machine carries), {leg.faults} faults",
            flush=True,
        )
        place = machine["place"][f"{target.database}x{target.api}"]
        result = await run_leg(leg, pace, workdir / leg.config.name, args.seed + i, place)
        results.append(result)
        path = workdir / f"{leg.config.name}.json"
        await asyncio.to_thread(path.write_text, json.dumps(result, indent=1, default=str))
        for line in violations(result):
            print(line, flush=True)
        load = result["load"]
        print(
            f"soak: leg {leg.config.name}: {sum(load['orders'].values())} orders, "
            f"{len(result['faults'])} faults, {sum(c['violations'] for c in result['checks'])} violations",
            flush=True,
        )
    (workdir / "results.json").write_text(json.dumps(results, indent=1, default=str))
    if args.report:
        markdown = Path(args.report)
        report.write_report(
            results, markdown, markdown.parent / "img" / "soak-lateness.png", command=args.command
        )
    broken = [line for result in results for line in violations(result)]
    print(f"soak: results in {workdir / 'results.json'}; {'FAIL' if broken else 'PASS'}")
    return 1 if broken else 0


def main() -> None:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.soak", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--short", action="store_true", help="the test suite's one-minute leg")
    parser.add_argument("--legs", nargs="*", default=[], help="run only these legs")
    parser.add_argument("--database", default="soak", help="the PostgreSQL database to use")
    parser.add_argument("--workdir", default="/tmp", help="where logs and results go")
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--report", default="", help="write the report here (docs/reliability.md)")
    parser.add_argument("--command", default="make soak", help="the command the report names")
    sys.exit(asyncio.run(main_async(parser.parse_args())))

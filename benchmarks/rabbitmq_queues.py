"""The RabbitMQ trigger alone, on classic and on quorum queues: no database, no worker.

Each round, for each kind in turn (so that both see the same machine), a trigger on a fresh
prefix publishes N timers and hands them all over and acks them, two ways:

- ``direct``: due now, published to the due queue (publish, confirm, deliver, ack);
- ``via level``: published to the 100 ms level queue, so each one also expires and is
  dead-lettered to the due queue (at least once on quorum queues) before it is handed over.

Prints one JSON line per run and, at the end, the medians and the quorum / classic ratios:

    .venv/bin/python benchmarks/rabbitmq_queues.py --timers 10000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta

import aio_pika

from dueflow.clock import SystemClock
from dueflow.store.timers import Armed
from dueflow.timers.rabbitmq import RabbitTrigger

KINDS = ("classic", "quorum")
CLOCK = SystemClock()


async def hand_over_all(trigger: RabbitTrigger, count: int, timeout: float) -> None:
    """Wait and ack until ``count`` distinct ids came out."""
    seen: set[int] = set()
    limit = time.monotonic() + timeout
    while len(seen) < count and time.monotonic() < limit:
        ids = await trigger.wait(CLOCK, CLOCK.now() + timedelta(milliseconds=200)) or []
        seen.update(ids)
        if ids:
            await trigger.ack(ids)
    if len(seen) < count:
        raise SystemExit(f"only {len(seen)} of {count} timers came out within {timeout} s")


async def one_run(url: str, kind: str, count: int, via_level: bool) -> dict[str, object]:
    prefix = f"bench-{kind}-{uuid.uuid4().hex[:6]}"
    trigger = RabbitTrigger.from_url(f"{url}?prefix={prefix}&queues={kind}")
    try:
        started = time.perf_counter()
        await trigger._channel()  # connect and declare the 16 queues
        declare_s = time.perf_counter() - started
        now = datetime.now(UTC)
        timers = [Armed(i, now) for i in range(1, count + 1)]
        started = time.perf_counter()
        if via_level:
            channel = await trigger._underlay()
            level = trigger.level_queue(100)
            for start in range(0, count, 500):
                await asyncio.gather(
                    *(trigger._publish(channel, t, level) for t in timers[start : start + 500])
                )
        else:
            await trigger.armed(timers)
        publish_s = time.perf_counter() - started
        await hand_over_all(trigger, count, timeout=300)
        total_s = time.perf_counter() - started
    finally:
        await trigger.close()
        connection = await aio_pika.connect(url)
        async with connection:
            channel = await connection.channel()
            for name in trigger.queue_names:
                await channel.queue_delete(name)
    return {
        "kind": kind,
        "path": "via level" if via_level else "direct",
        "timers": count,
        "declare_ms": round(declare_s * 1000, 1),
        "published_per_s": round(count / publish_s),
        "handed_over_per_s": round(count / total_s),
    }


async def main(args: argparse.Namespace) -> None:
    runs: list[dict[str, object]] = []
    for _ in range(args.rounds):
        for via_level in (False, True):
            for kind in KINDS:
                run = await one_run(args.url, kind, args.timers, via_level)
                print(json.dumps(run), flush=True)
                runs.append(run)
    for path in ("direct", "via level"):
        medians = {}
        for kind in KINDS:
            mine = [r for r in runs if r["kind"] == kind and r["path"] == path]
            medians[kind] = {
                key: statistics.median(float(str(r[key])) for r in mine)
                for key in ("declare_ms", "published_per_s", "handed_over_per_s")
            }
        ratios = {
            key: round(medians["quorum"][key] / medians["classic"][key], 2)
            for key in medians["classic"]
        }
        print(json.dumps({"path": path, "medians": medians, "quorum/classic": ratios}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default="amqp://guest:guest@127.0.0.1:5672/")
    parser.add_argument("--timers", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(parser.parse_args()))

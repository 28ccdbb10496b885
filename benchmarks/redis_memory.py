"""Redis memory per pending timer: arm N timers due within the horizon through the Redis
trigger and read ``used_memory`` before and after. Run:
``.venv/bin/python benchmarks/redis_memory.py --timers 1000000``."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from datetime import UTC, datetime, timedelta

import redis.asyncio as aioredis

from dueflow.store.timers import Armed
from dueflow.timers.redis import RedisTrigger

URL = "redis://127.0.0.1:6379/14"


async def main(count: int) -> None:
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    trigger = RedisTrigger.from_url(f"{URL}?prefix={prefix}&horizon=2h")
    client = aioredis.Redis.from_url(URL)
    try:
        before = (await client.info("memory"))["used_memory"]
        due = datetime.now(UTC) + timedelta(minutes=30)
        started = time.perf_counter()
        for start in range(0, count, 10_000):
            page = [
                Armed(id=i, due_at=due + timedelta(milliseconds=i % 60_000))
                for i in range(start + 1, min(start + 10_000, count) + 1)
            ]
            await trigger.feed(page)
        seconds = time.perf_counter() - started
        after = (await client.info("memory"))["used_memory"]
        print(
            json.dumps(
                {
                    "timers": count,
                    "arm_per_s": round(count / seconds),
                    "used_memory_mib": round((after - before) / 2**20, 1),
                    "bytes_per_timer": round((after - before) / count, 1),
                }
            )
        )
    finally:
        keys = [k async for k in client.scan_iter(match=f"{prefix}:*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()
        await trigger.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--timers", type=int, default=1_000_000)
    asyncio.run(main(parser.parse_args().timers))

"""The Redis trigger alone, no database: arm N timers due now, then W claimers (trigger instances,
as W workers would hold) claim and acknowledge until every timer was handed out once.

Measures the arming rate and the claim-and-acknowledge rate, one server against a cluster when
run with both URLs (the runs alternate, ``--rounds`` times):

    .venv/bin/python -m tests.redis_cluster &        # prints the cluster's URL
    .venv/bin/python benchmarks/trigger_claims.py --url redis://127.0.0.1:6379/14 \\
        --url 'redis+cluster://127.0.0.1:PORT,.../' --timers 100000 --claimers 2 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from datetime import UTC, datetime

from dueflow.clock import FakeClock
from dueflow.store.timers import Armed
from dueflow.timers.redis import RedisTrigger

ARM_PAGE = 5000  # the feeder's page


async def run(url: str, timers: int, claimers: int, batch: int) -> dict[str, object]:
    now = datetime.now(UTC).replace(microsecond=0)  # whole ms: due at once, not 1 ms later
    clock = FakeClock(now)
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    options = f"prefix={prefix}&batch={batch}"
    armer = RedisTrigger.from_url(f"{url}{'&' if '?' in url else '?'}{options}", clock=clock)
    workers = [
        RedisTrigger.from_url(f"{url}{'&' if '?' in url else '?'}{options}", clock=clock)
        for _ in range(claimers)
    ]
    try:
        started = time.perf_counter()
        for first in range(1, timers + 1, ARM_PAGE):
            last = min(first + ARM_PAGE, timers + 1)
            await armer.feed([Armed(i, now) for i in range(first, last)])
        arm_s = time.perf_counter() - started

        seen: list[int] = []

        async def drain(trigger: RedisTrigger) -> None:
            while True:
                ids = await trigger.claim(now)
                if not ids:
                    return
                seen.extend(ids)
                await trigger.ack(ids)

        started = time.perf_counter()
        await asyncio.gather(*(drain(t) for t in workers))
        claim_s = time.perf_counter() - started
    finally:
        client = armer._redis()
        async for key in client.scan_iter(match=f"*{prefix}*"):
            await client.delete(key)  # the wake lists left
        for t in [armer, *workers]:
            await t.close()
    assert sorted(seen) == list(range(1, timers + 1)), "a timer handed out twice or never"
    return {
        "trigger": url.split("://")[0],
        "shards": len(armer.shards),
        "timers": timers,
        "claimers": claimers,
        "batch": batch,
        "arm_per_s": round(timers / arm_s),
        "claim_ack_per_s": round(timers / claim_s),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", action="append", required=True, help="repeat to compare")
    parser.add_argument("--timers", type=int, default=100_000)
    parser.add_argument("--claimers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=200, help="as DUEFLOW_BATCH_SIZE")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    for _ in range(args.rounds):
        for url in args.url:
            result = asyncio.run(run(url, args.timers, args.claimers, args.batch))
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

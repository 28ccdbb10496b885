"""The physical limit on this machine: pgbench running the statements of a cancellation batch
(pgbench_cancel.sql) over the same seeded herd, reported as orders cancelled per second.

    .venv/bin/python benchmarks/pg_limit.py --database-url postgresql://postgres@127.0.0.1/test
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from sqlalchemy import text
from sqlalchemy.engine import make_url

import _backends


async def prepare(url: str, orders: int) -> None:
    db = await _backends.fresh(url)
    await _backends.seed_unpaid(db, url, None, orders, datetime.now(UTC) - timedelta(seconds=1))
    async with db.engine.begin() as conn:
        await conn.execute(text("DROP SEQUENCE IF EXISTS bench_block"))
        await conn.execute(text("CREATE SEQUENCE bench_block MINVALUE 0 START 0"))
    await db.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--orders", type=int, default=100_000)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--block", type=int, default=200, help="orders per batch transaction")
    args = parser.parse_args()
    asyncio.run(prepare(args.database_url, args.orders))
    url = make_url(args.database_url)
    per_client = args.orders // args.block // args.clients
    out = subprocess.run(
        [
            "pgbench",
            "-n",
            "-h",
            url.host or "127.0.0.1",
            "-p",
            str(url.port or 5432),
            "-U",
            url.username or "postgres",
            "-c",
            str(args.clients),
            "-j",
            str(args.clients),
            "-D",
            f"block={args.block}",
            "-t",
            str(per_client),
            "-f",
            str(Path(__file__).parent / "pgbench_cancel.sql"),
            url.database or "test",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    tps = float(re.search(r"tps = ([\d.]+)", out).group(1))
    print(
        json.dumps(
            {
                "orders": args.orders,
                "clients": args.clients,
                "batch": args.block,
                "batches_per_s": round(tps, 1),
                "cancellations_per_s": round(tps * args.block),
            }
        )
    )


if __name__ == "__main__":
    main()

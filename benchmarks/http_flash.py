"""The flash sale over real HTTP: ``POST /api/orders {"flash_sale_id", "quantity"}`` against a
``dueflow serve`` process, driven by wrk (``apt-get install wrk``) with ``http_flash.lua``.

One seller's SKU with --sku-stock units, a flash sale of --units of them (limit --limit a buyer,
open from a minute ago for a day) and --buyers buyers, seeded through the service layer before
the server starts (not timed); then wrk sends exactly --attempts orders of --quantity units from
--connections keep-alive connections, each a random buyer (per-thread random seeds), each
thread sending its share and stopping once every one of them is answered (nothing in flight).
The server runs the ``prod`` profile with the flash pay window set to 30 minutes (its reminder
at 20) through ``DUEFLOW_ORDER_TYPES``: a place writes what it always writes, and no hold ends
and no reminder goes out during the run.

Reported: orders placed per second (201s over wrk's duration, and the database's orders over
the time from the first order to the last: the rate while units were left), attempts per
second, wrk's latency p50 / p90 / p99 / max over every answer, the status mix (201, 409 by
reason, other), and afterwards the database's word: the flash sale's and the SKU's units
balance (stock + held + sold = stocked, nothing negative, stocked unchanged), the SKU holds
exactly the flash sale's held units, live orders are exactly the units held (and their flash
and SKU lines agree), each order's amount is its lines', per-buyer counts equal the units held
and stay within the limit, one order per 201. Any failed check fails the run (exit 1).

    .venv/bin/python benchmarks/http_flash.py                        # SQLite
    .venv/bin/python benchmarks/http_flash.py --database-url postgresql://postgres@127.0.0.1/bench
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from sqlalchemy import insert, text

sys.path.insert(0, str(Path(__file__).parent))
import _backends
import _seed
from http_tickets import as_utc, free_port

LUA = Path(__file__).with_suffix(".lua")
PRICE = Decimal("19.90")
FLASH_PRICE = Decimal("9.90")
#: The flash pay window of the run: the one settings source, long enough that nothing expires.
ORDER_TYPES = '{"flash": {"pay": "30m", "reminder": "20m"}}'

#: The checks after the run: name -> SQL answering one number that must be 0.
CHECKS = {
    "flash units unbalanced": "SELECT count(*) FROM flash_sales WHERE stock + held + sold <> stocked",
    "flash counts negative": (
        "SELECT count(*) FROM flash_sales WHERE stock < 0 OR held < 0 OR sold < 0"
    ),
    "sku units unbalanced": "SELECT count(*) FROM skus WHERE stock + held + sold <> stocked",
    "sku counts negative": "SELECT count(*) FROM skus WHERE stock < 0 OR held < 0 OR sold < 0",
    "sku held minus flash held": (
        "SELECT (SELECT sum(held) FROM skus) - (SELECT sum(held) FROM flash_sales)"
    ),
    "live orders minus flash orders": (
        "SELECT (SELECT count(*) FROM orders) - "
        "(SELECT count(*) FROM orders WHERE order_type = 'flash' AND status = 'pending_payment')"
    ),
    "flash held minus flash lines of live orders": (
        "SELECT (SELECT sum(held) FROM flash_sales) - (SELECT coalesce(sum(l.quantity), 0) "
        "FROM order_lines l JOIN orders o ON o.id = l.order_id "
        "WHERE l.kind = 'flash' AND o.status = 'pending_payment')"
    ),
    "sku held minus sku lines of live orders": (
        "SELECT (SELECT sum(held) FROM skus) - (SELECT coalesce(sum(l.quantity), 0) "
        "FROM order_lines l JOIN orders o ON o.id = l.order_id "
        "WHERE l.kind = 'sku' AND o.status = 'pending_payment')"
    ),
    "orders without one sku and one flash line of the same units": (
        "SELECT count(*) FROM orders o WHERE 2 <> (SELECT count(*) FROM order_lines l "
        "WHERE l.order_id = o.id) OR NOT EXISTS (SELECT 1 FROM order_lines s "
        "JOIN order_lines f ON f.order_id = s.order_id AND f.kind = 'flash' "
        "AND f.quantity = s.quantity WHERE s.order_id = o.id AND s.kind = 'sku')"
    ),
    "buyer counts minus flash units held and sold": (
        "SELECT coalesce(sum(units), 0) - (SELECT sum(held + sold) FROM flash_sales) "
        "FROM flash_buyers"
    ),
    "buyers past the limit or negative": (
        "SELECT count(*) FROM flash_buyers b JOIN flash_sales f ON f.id = b.flash_sale_id "
        "WHERE b.units > f.per_buyer_limit OR b.units < 0"
    ),
    "buyer counts minus their orders' units": (
        "SELECT count(*) FROM flash_buyers b WHERE b.units <> (SELECT coalesce(sum(l.quantity), 0)"
        " FROM order_lines l JOIN orders o ON o.id = l.order_id WHERE l.kind = 'flash' "
        "AND l.item_id = b.flash_sale_id AND o.buyer_id = b.buyer_id AND o.status NOT LIKE 'cancelled%')"
    ),
    "live orders without their cancel_unpaid timer": (
        "SELECT count(*) FROM orders o WHERE NOT EXISTS (SELECT 1 FROM timers t "
        "WHERE t.order_id = o.id AND t.kind = 'cancel_unpaid' AND t.state = 'scheduled')"
    ),
}

#: Amount against lines, compared in Python (SQLite keeps money as text).
AMOUNTS = (
    "SELECT o.amount, l.price, l.quantity FROM orders o "
    "JOIN order_lines l ON l.order_id = o.id AND l.kind = 'sku'"
)
WINDOW = "SELECT min(created_at), max(created_at) FROM orders"


async def seed(args: argparse.Namespace, url: str) -> tuple[int, list[str]]:
    """A fresh database with one SKU on a flash sale and the buyers: (sale id, buyer tokens)."""
    from dueflow import bootstrap
    from dueflow.config import load_settings
    from dueflow.service import accounts, shop
    from dueflow.store import schema

    db = await _backends.fresh(url)
    await db.dispose()
    settings = load_settings(database_url=url, profile="prod")
    async with bootstrap.running(settings) as deps:
        seller, _ = await accounts.add_user(deps, "seller")
        sku = await shop.create_sku(
            deps, seller_id=seller.id, title="Flash mug", price=PRICE, stock=args.sku_stock
        )
        now = datetime.now(UTC)
        sale = await shop.create_flash_sale(
            deps,
            seller_id=seller.id,
            sku_id=sku["id"],
            price=FLASH_PRICE,
            stock=args.units,
            starts_at=now - timedelta(minutes=1),
            ends_at=now + timedelta(days=1),
            per_buyer_limit=args.limit,
        )
        tokens = [secrets.token_urlsafe(24) for _ in range(args.buyers)]
        # The buyers in one transaction (accounts.add_user's rows, without a commit each).
        async with deps.db.write() as conn:
            await conn.execute(
                insert(schema.users),
                [
                    {
                        "name": f"buyer{n}",
                        "token_hash": accounts.hash_token(token),
                        "is_admin": False,
                        "created_at": now,
                    }
                    for n, token in enumerate(tokens)
                ],
            )
    return int(sale["id"]), tokens


def sale(args: argparse.Namespace, port: int, tmp: Path, sale_id: int) -> dict[str, Any]:
    """Run wrk; its FLASH line as a dict (plus any unexpected answers)."""
    command = _seed.wrk_command(
        args,
        port,
        LUA,
        args.max_seconds,
        tmp / "tokens.txt",
        sale_id,
        args.quantity,
        args.attempts // args.threads,
    )
    return _seed.run_wrk(command, tmp, args.threads, "FLASH")


async def check(url: str) -> dict[str, Any]:
    """Every :data:`CHECKS` figure (each must be 0), the money check, and the counts."""
    from dueflow.store.db import Database

    db = Database.from_url(url)
    try:
        async with db.engine.connect() as conn:
            found: dict[str, Any] = {
                name: int(await conn.scalar(text(sql)) or 0) for name, sql in CHECKS.items()
            }
            rows = (await conn.execute(text(AMOUNTS))).all()
            found["orders whose amount is not their lines'"] = sum(
                1
                for amount, price, qty in rows
                if Decimal(str(amount)) != Decimal(str(price)) * qty
            )
            counts = (
                await conn.execute(text("SELECT stock, held, sold, stocked FROM flash_sales"))
            ).one()
            found["flash"] = dict(zip(("stock", "held", "sold", "stocked"), counts, strict=True))
            sku = (await conn.execute(text("SELECT stock, held, sold, stocked FROM skus"))).one()
            found["sku"] = dict(zip(("stock", "held", "sold", "stocked"), sku, strict=True))
            found["orders"] = int(await conn.scalar(text("SELECT count(*) FROM orders")) or 0)
            first, last = (await conn.execute(text(WINDOW))).one()
        if first is not None:
            found["placing_ms"] = int((as_utc(last) - as_utc(first)).total_seconds() * 1000)
        return found
    finally:
        await db.dispose()


def verdict(args: argparse.Namespace, result: dict[str, Any], state: dict[str, Any]) -> list[str]:
    """What failed: empty when the run and the database are as they must be."""
    failed = [name for name in CHECKS if state[name] != 0]
    if state["orders whose amount is not their lines'"]:
        failed.append("orders whose amount is not their lines'")
    if state["flash"]["stocked"] != args.units or state["sku"]["stocked"] != args.sku_stock:
        failed.append("stocked changed")
    if state["flash"]["held"] + state["flash"]["sold"] != state["orders"] * args.quantity:
        failed.append("units held and sold differ from the orders' units")
    if not result["sent"] == result["answered"] == args.attempts:
        failed.append(f"sent {result['sent']}, answered {result['answered']}, not {args.attempts}")
    if result["placed"] != state["orders"]:
        failed.append(f"{result['placed']} 201s but {state['orders']} orders")
    if result["other"]:
        failed.append(f"{result['other']} answers neither 201 nor an expected 409")
    return failed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default=None, help="default: a fresh SQLite file")
    parser.add_argument("--units", type=int, default=1_000, help="the flash sale's stock")
    parser.add_argument("--sku-stock", type=int, default=1_500, help="the SKU's (>= units)")
    parser.add_argument("--buyers", type=int, default=20_000, help="random per attempt")
    parser.add_argument("--limit", type=int, default=1, help="units a buyer")
    parser.add_argument("--quantity", type=int, default=1, help="units an attempt")
    parser.add_argument("--attempts", type=int, default=20_000)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2, help="wrk threads")
    parser.add_argument("--max-seconds", type=int, default=900, help="wrk's bound")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (apt-get install wrk)")
    if args.attempts % args.threads or args.attempts // args.threads < 1:
        sys.exit("--attempts must be a multiple of --threads")
    with tempfile.TemporaryDirectory(prefix="dueflow-http-flash-") as name:
        tmp = Path(name)
        url = args.database_url or f"sqlite:///{tmp / 'flash.db'}"
        started = time.perf_counter()
        sale_id, tokens = asyncio.run(seed(args, url))
        print(f"seeded in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        (tmp / "tokens.txt").write_text("\n".join(tokens) + "\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("DUEFLOW_")}
        env.update(
            {
                "DUEFLOW_DATABASE_URL": url,
                "DUEFLOW_PROFILE": "prod",
                "DUEFLOW_ORDER_TYPES": ORDER_TYPES,
            }
        )
        port = free_port()
        with _seed.serving(env, port, tmp / "serve.log"):
            result = sale(args, port, tmp, sale_id)
        state = asyncio.run(check(url))
    seconds = result["duration_us"] / 1e6
    report = {
        "database": url.split(":", 1)[0],
        **{k: v for k, v in result.items() if not k.endswith("_us")},
        "seconds": round(seconds, 2),
        "orders_per_s": round(result["placed"] / seconds, 1),
        "attempts_per_s": round(result["answered"] / seconds, 1),
        # From the first order to the last: the rate while units were left to sell.
        "orders_per_s_while_units_left": round(
            state["orders"] / max(state.get("placing_ms", 0) / 1000, 0.001), 1
        ),
        "p50_ms": round(result["p50_us"] / 1000, 1),
        "p90_ms": round(result["p90_us"] / 1000, 1),
        "p99_ms": round(result["p99_us"] / 1000, 1),
        "max_ms": round(result["max_us"] / 1000, 1),
        "sold_out": state["flash"]["stock"] == 0,
        "db": state,
    }
    failed = verdict(args, result, state)
    report["ok"] = not failed
    report["failed"] = failed
    print(json.dumps(report), flush=True)
    if failed:
        print(f"FLASH SALE CHECK FAILED: {'; '.join(failed)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

"""Statements per request on the hot paths: placing an order of every flow, and the order view.

Each path is driven through the whole HTTP app in process (``create_app`` over
``httpx.ASGITransport``: authentication, the route, the answer) on one backend at a time, with
SQLAlchemy's engine events counting what reaches the driver during each request:

- ``stmts``: statements sent (``before_cursor_execute``; SQLite's own ``BEGIN`` is not one);
- ``tx`` / ``write``: transactions begun, and of those the write transactions committed;
- ``checkouts``: connections taken from the pool (on PostgreSQL and MariaDB each one costs a
  ping round trip while ``pool_pre_ping`` is on);
- ``trips``: round trips on a server database, counted as statements + BEGIN and COMMIT of each
  transaction (PostgreSQL sends both; MySQL's BEGIN is implicit) + a ping per checkout;
- ``miss``: statements compiled afresh (SQLAlchemy's compiled cache missed) after the warm-up.

Every path runs ``--repeat`` times after two warm-up requests; a count that differs between
runs is printed as ``min-max``. ``--show`` prints each path's statements.

    .venv/bin/python benchmarks/statements.py                       # SQLite
    .venv/bin/python benchmarks/statements.py --postgres postgresql://postgres@127.0.0.1/bench \\
        --mysql mysql://root@127.0.0.1/bench                        # and the server databases

The server databases are emptied and migrated first: give each a database of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import event
from sqlalchemy.engine.default import CACHE_MISS

sys.path.insert(0, str(Path(__file__).parent))
import _backends
from dueflow import bootstrap
from dueflow.api.app import create_app
from dueflow.config import load_settings
from dueflow.domain import seating
from dueflow.service import accounts, shop, tickets
from dueflow.service.deps import Deps


@dataclass
class Counts:
    """What one request sent to the database."""

    statements: int = 0
    transactions: int = 0
    writes: int = 0
    checkouts: int = 0
    misses: int = 0
    text: list[str] = field(default_factory=list)

    def trips(self, dialect: str) -> int:
        ends = 2 if dialect == "postgresql" else 1
        return self.statements + ends * self.transactions + self.checkouts


class Counter:
    """Engine events counted into the current :class:`Counts`."""

    def __init__(self, deps: Deps) -> None:
        self.now = Counts()
        engine = deps.db.engine.sync_engine
        event.listen(engine, "before_cursor_execute", self._statement)
        event.listen(engine, "begin", self._begin)
        event.listen(engine, "commit", self._commit)
        event.listen(engine.pool, "checkout", self._checkout)

    def _statement(self, conn: Any, cursor: Any, sql: str, params: Any, context: Any, many: bool):
        if sql.startswith("BEGIN"):
            return
        self.now.statements += 1
        self.now.text.append(" ".join(sql.split())[:150])
        if context is not None and context.cache_hit is CACHE_MISS:
            self.now.misses += 1

    def _begin(self, conn: Any) -> None:
        self.now.transactions += 1

    def _commit(self, conn: Any) -> None:
        if not conn.get_execution_options().get("dueflow_read"):
            self.now.writes += 1

    def _checkout(self, *_: Any) -> None:
        self.now.checkouts += 1

    async def count(self, request: Callable[[], Awaitable[httpx.Response]]) -> Counts:
        self.now = Counts()
        answer = await request()
        if answer.status_code >= 300:
            raise RuntimeError(f"{answer.status_code}: {answer.text}")
        return self.now


@dataclass
class World:
    """The app's client and what the paths buy."""

    deps: Deps
    client: httpx.AsyncClient
    token: dict[str, str]
    seller: int
    buyers: list[int]
    show_id: int = 0
    skus: list[int] = field(default_factory=list)
    sale_id: int = 0
    seats: list[str] = field(default_factory=list)
    coupons: list[int] = field(default_factory=list)
    goods: list[int] = field(default_factory=list)
    orders: list[int] = field(default_factory=list)
    keys: int = 0

    async def post(self, body: dict[str, Any], headers: dict[str, str] | None = None):
        answer = await self.client.post(
            "/api/orders", json=body, headers={**self.token, **(headers or {})}
        )
        if answer.status_code == 201:
            self.orders.append(answer.json()["id"])
        return answer


async def seed(deps: Deps, client: httpx.AsyncClient, runs: int) -> World:
    now = deps.clock.now()
    seller, _ = await accounts.add_user(deps, "seller")
    buyer, token = await accounts.add_user(deps, "buyer")
    world = World(deps, client, {"Authorization": f"Bearer {token}"}, seller.id, [buyer.id])
    world.goods = [
        await accounts.add_goods(deps, seller_id=seller.id, title=f"item {i}", price="12.50")
        for i in range(runs * 2)
    ]
    labels = [f"A-{i}" for i in range(1, runs + 1)]
    world.seats = list(labels)
    world.show_id = await tickets.create_show(
        deps,
        organizer_id=seller.id,
        title="concert",
        venue="hall",
        starts_at=now + timedelta(days=30),
        sales_close_at=now + timedelta(days=29),
        seat_limit=seating.MAX_SEAT_LIMIT,
        seats=seating.parse_ranges(f"A:1-{runs}", {"A": Decimal("380.00")}),
    )
    for title in ("mug", "cup"):
        view = await shop.create_sku(
            deps, seller_id=seller.id, title=title, price="25.00", stock=10_000
        )
        world.skus.append(int(view["id"]))
    tpl = await shop.create_template(
        deps,
        seller_id=seller.id,
        title="5 off",
        amount_off="5.00",
        min_amount="20.00",
        valid_from=now - timedelta(minutes=1),
        valid_until=now + timedelta(days=30),
        total=runs,
    )
    for _ in range(runs):
        issued = await shop.issue_coupon(
            deps, template_id=tpl["id"], issuer_id=seller.id, user_id=buyer.id
        )
        world.coupons.append(int(issued["id"]))
    sale = await shop.create_flash_sale(
        deps,
        seller_id=seller.id,
        sku_id=world.skus[0],
        price="9.90",
        stock=1000,
        starts_at=now - timedelta(minutes=1),
        ends_at=now + timedelta(hours=1),
        per_buyer_limit=1000,
    )
    world.sale_id = int(sale["id"])
    return world


def paths(world: World) -> dict[str, Callable[[], Awaitable[httpx.Response]]]:
    """Each hot path as a request that succeeds every time it is called."""

    def goods() -> Awaitable[httpx.Response]:
        return world.post({"goods_id": world.goods.pop()})

    def goods_keyed() -> Awaitable[httpx.Response]:
        world.keys += 1
        key = {"Idempotency-Key": f"k-{world.keys}"}
        return world.post({"goods_id": world.goods.pop()}, key)

    def seats() -> Awaitable[httpx.Response]:
        return world.post({"show_id": world.show_id, "seats": [world.seats.pop()]})

    def lines() -> Awaitable[httpx.Response]:
        body = [{"sku_id": s, "quantity": 1} for s in world.skus]
        return world.post({"lines": body})

    def coupon() -> Awaitable[httpx.Response]:
        body = [{"sku_id": s, "quantity": 1} for s in world.skus]
        return world.post({"lines": body, "coupon_id": world.coupons.pop()})

    def flash() -> Awaitable[httpx.Response]:
        return world.post({"flash_sale_id": world.sale_id, "quantity": 1})

    def view() -> Awaitable[httpx.Response]:
        return world.client.get(f"/api/orders/{world.orders[0]}", headers=world.token)

    return {
        "place goods": goods,
        "place goods, Idempotency-Key": goods_keyed,
        "place seats (1)": seats,
        "place SKU lines (2)": lines,
        "place SKU lines (2) + coupon": coupon,
        "place flash sale": flash,
        "order view": view,
    }


def spread(values: list[int]) -> str:
    low, high = min(values), max(values)
    return str(low) if low == high else f"{low}-{high}"


async def measure(url: str, repeat: int, show: bool) -> None:
    db = await _backends.fresh(url)
    await db.dispose()
    settings = load_settings(database_url=url, profile="prod")
    async with bootstrap.running(settings, migrate_sqlite=False) as deps:
        app = create_app(deps)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            world = await seed(deps, client, repeat + 2)
            counter = Counter(deps)
            dialect = deps.db.dialect
            print(f"\n{dialect} ({deps.db.engine.dialect.server_version_info or ''})")
            print(f"{'path':<30} {'stmts':>5} {'tx':>3} {'write':>5} {'checkouts':>9}", end="")
            print(f" {'trips':>5} {'miss':>4}")
            for name, request in paths(world).items():
                runs = []
                for i in range(repeat + 2):
                    counts = await counter.count(request)
                    if i >= 2:
                        runs.append(counts)
                trips = "-" if dialect == "sqlite" else spread([c.trips(dialect) for c in runs])
                print(
                    f"{name:<30} {spread([c.statements for c in runs]):>5}"
                    f" {spread([c.transactions for c in runs]):>3}"
                    f" {spread([c.writes for c in runs]):>5}"
                    f" {spread([c.checkouts for c in runs]):>9} {trips:>5}"
                    f" {sum(c.misses for c in runs):>4}"
                )
                if show:
                    for line in runs[-1].text:
                        print(f"    {line}")


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--postgres", help="a PostgreSQL URL (its database is emptied)")
    parser.add_argument("--mysql", help="a MariaDB/MySQL URL (its database is emptied)")
    parser.add_argument("--no-sqlite", action="store_true")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--show", action="store_true", help="print each path's statements")
    args = parser.parse_args()
    urls = [] if args.no_sqlite else [None]
    urls += [u for u in (args.postgres, args.mysql) if u]
    for url in urls:
        if url is None:
            with tempfile.TemporaryDirectory() as tmp:
                await measure(f"sqlite:///{tmp}/statements.db", args.repeat, args.show)
        else:
            await measure(url, args.repeat, args.show)
    print(f"\n(measured {datetime.now(UTC).isoformat(timespec='seconds')})")


if __name__ == "__main__":
    asyncio.run(main())

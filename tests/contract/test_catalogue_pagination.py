"""The catalogue's lists (SKUs, shows, flash sales, coupon templates), a user's coupons, the
refunds and the users, walked by cursor on every database while another process keeps adding
rows of the same list in its own transactions: each walk shows every row that existed when it
began exactly once, newest first, and none of the new ones (as test_list_pagination.py proves
for goods and orders, whose walk this reuses).

On PostgreSQL each list's statement is also EXPLAINed with sorting priced out of reach: its
plan reads the list's index backwards and sorts nothing, so a page costs one range read however
many rows the table holds.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow import bootstrap
from dueflow.clock import FakeClock
from dueflow.config import load_settings
from dueflow.domain import seating
from dueflow.service import accounts, lists, orders, payments, shop, tickets
from dueflow.service.deps import Deps
from dueflow.store import lists as store_lists
from tests.conftest import SERVICE_URLS, START, World, require_service, world_at
from tests.contract.test_list_pagination import walk_while_inserting

#: Adds one row of a list through the services; returns its id.
Add = Callable[[Deps, "Owners"], Awaitable[int]]
PageOf = Callable[[str | None], Awaitable[lists.Page]]
_names = itertools.count()


@dataclass(frozen=True)
class Owners:
    """Who the rows belong to, and the SKU and template the flash sales and coupons are of."""

    seller: int
    buyer: int
    sku: int
    template: int


@dataclass
class RowInserter:
    """Adds rows of one list from another thread (its own loop and engine) until told to stop;
    what :func:`walk_while_inserting` expects of an inserter."""

    url: str
    owners: Owners
    add: Add
    inserted: list[int] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def past(self, count: int) -> bool:
        return len(self.inserted) > count or self.error is not None

    def run(self) -> None:
        try:
            asyncio.run(self._insert())
        except BaseException as exc:  # reported by the test, not lost in the thread
            self.error = exc

    async def _insert(self) -> None:
        settings = load_settings(database_url=self.url, profile="prod")
        async with bootstrap.running(settings, clock=FakeClock(START), migrate_sqlite=False) as d:
            while not self.stop.is_set():
                self.inserted.append(await self.add(d, self.owners))


async def add_sku(deps: Deps, owners: Owners) -> int:
    view = await shop.create_sku(deps, seller_id=owners.seller, title="mug", price="9", stock=5)
    return int(view["id"])


async def add_show(deps: Deps, owners: Owners) -> int:
    now = deps.clock.now()
    return await tickets.create_show(
        deps,
        organizer_id=owners.seller,
        title="concert",
        venue="hall",
        starts_at=now + timedelta(days=30),
        sales_close_at=now + timedelta(days=29),
        seat_limit=1,
        seats=[seating.seat("A-1", Decimal("10.00"))],
    )


async def add_flash_sale(deps: Deps, owners: Owners) -> int:
    now = deps.clock.now()
    view = await shop.create_flash_sale(
        deps,
        seller_id=owners.seller,
        sku_id=owners.sku,
        price="1.00",
        stock=1,
        starts_at=now,
        ends_at=now + timedelta(hours=1),
        per_buyer_limit=1,
    )
    return int(view["id"])


async def add_template(deps: Deps, owners: Owners) -> int:
    now = deps.clock.now()
    view = await shop.create_template(
        deps,
        seller_id=owners.seller,
        title="off",
        amount_off="1.00",
        min_amount="0",
        valid_from=now,
        valid_until=now + timedelta(days=30),
        total=1,
    )
    return int(view["id"])


async def add_coupon(deps: Deps, owners: Owners) -> int:
    view = await shop.issue_coupon(
        deps, template_id=owners.template, issuer_id=owners.seller, user_id=owners.buyer
    )
    return int(view["id"])


async def add_user(deps: Deps, owners: Owners) -> int:
    user, _ = await accounts.add_user(deps, f"host-user-{next(_names)}")
    return user.id


async def add_refund(deps: Deps, owners: Owners) -> int:
    """A refund awaiting review: a paid order its seller cancelled."""
    goods = await accounts.add_goods(deps, seller_id=owners.seller, title="lamp", price="3.00")
    order_id = await orders.place_order(deps, buyer_id=owners.buyer, goods_id=goods)
    await payments.record_manual_payment(deps, order_id=order_id, amount="3.00")
    await orders.cancel_by_seller(deps, order_id=order_id, user_id=owners.seller)
    page = await lists.refunds_list(deps, state="pending_review", after=None, limit=1)
    return int(page.items[0]["id"])


async def owners_of(world: World) -> Owners:
    deps = world.deps
    sku = await shop.create_sku(deps, seller_id=world.seller, title="big", price="9", stock=10**6)
    template = await shop.create_template(
        deps,
        seller_id=world.seller,
        title="many",
        amount_off="1.00",
        min_amount="0",
        valid_from=deps.clock.now(),
        valid_until=deps.clock.now() + timedelta(days=30),
        total=10**6,
    )
    return Owners(world.seller, world.buyer, int(sku["id"]), int(template["id"]))


def walks(deps: Deps, owners: Owners, buyer: accounts.User) -> dict[str, tuple[Add, PageOf]]:
    """Each list with a filter a host would use, and how a row of it is added."""

    def paged(list_of: Callable[..., Awaitable[lists.Page]], *args: Any, **filters: Any) -> PageOf:
        async def page(after: str | None) -> lists.Page:
            return await list_of(deps, *args, after=after, limit=4, **filters)

        return page

    return {
        "skus": (add_sku, paged(lists.skus_list, seller_id=owners.seller)),
        "shows": (add_show, paged(lists.shows_list, organizer_id=None, status="on_sale")),
        "flash sales": (
            add_flash_sale,
            paged(lists.flash_sales_list, seller_id=None, sku_id=owners.sku),
        ),
        "templates": (add_template, paged(lists.templates_list, seller_id=owners.seller)),
        "coupons": (add_coupon, paged(lists.coupons_list, buyer)),
        "users": (add_user, paged(lists.users_list)),
        "refunds": (add_refund, paged(lists.refunds_list, state="pending_review")),
    }


async def test_every_pre_existing_row_once_under_concurrent_inserts(backend_world, backend_url):
    world = backend_world
    owners = await owners_of(world)
    buyer = await accounts.get_user(world.deps, world.buyer)
    for name, (add, page_of) in walks(world.deps, owners, buyer).items():
        existing = [await add(world.deps, owners) for _ in range(9)]
        if name == "skus":
            existing.append(owners.sku)
        if name == "templates":
            existing.append(owners.template)
        if name == "users":
            existing += [world.seller, world.buyer, world.other]
        inserter = RowInserter(backend_url, owners, add)
        seen = await walk_while_inserting(page_of, inserter)  # type: ignore[arg-type]
        assert seen == sorted(existing, reverse=True), name
        assert not set(inserter.inserted) & set(seen), name


# --- the plans on PostgreSQL ----------------------------------------------------------------

#: Each list's store read with a filter, and the index it must read (backwards, sorting nothing).
PLANS: list[tuple[Callable[..., Awaitable[Any]], dict[str, Any], str]] = [
    (
        store_lists.catalogue_page,
        {"kind": "skus", "equal": {"seller_id": 1}},
        "ix_skus_seller_id_id",
    ),
    (store_lists.catalogue_page, {"kind": "skus", "equal": {}}, "skus_pkey"),
    (
        store_lists.catalogue_page,
        {"kind": "shows", "equal": {"status": "on_sale"}},
        "ix_shows_status_id",
    ),
    (
        store_lists.catalogue_page,
        {"kind": "shows", "equal": {"organizer_id": 1}},
        "ix_shows_organizer_id_id",
    ),
    (
        store_lists.catalogue_page,
        {"kind": "flash_sales", "equal": {"sku_id": 1}},
        "ix_flash_sales_sku_id_id",
    ),
    (
        store_lists.catalogue_page,
        {"kind": "flash_sales", "equal": {"seller_id": 1}},
        "ix_flash_sales_seller_id_id",
    ),
    (
        store_lists.catalogue_page,
        {"kind": "coupon_templates", "equal": {"seller_id": 1}},
        "ix_coupon_templates_seller_id_id",
    ),
    (store_lists.coupons_page, {"user_id": 1}, "ix_coupons_user_id_id"),
    (store_lists.users_page, {}, "users_pkey"),
    (store_lists.refunds_page, {"state": "failed"}, "ix_refunds_state_id"),
    (store_lists.refunds_page, {"state": None}, "refunds_pkey"),
]


def nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(n for child in plan.get("Plans", []) for n in nodes(child))]


async def explained(conn: AsyncConnection, statement: str, parameters: Any) -> dict[str, Any]:
    """The plan PostgreSQL makes of ``statement`` when sorting and full scans cost too much
    to choose (so an index that gives the order is taken whatever the table's size)."""
    await conn.exec_driver_sql("SET enable_sort = off")
    await conn.exec_driver_sql("SET enable_seqscan = off")
    found = await conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {statement}", parameters)
    raw = found.scalar_one()
    [plan] = json.loads(raw) if isinstance(raw, str) else raw
    return dict(plan["Plan"])


@pytest.mark.postgres
async def test_each_list_reads_its_index_backwards_and_sorts_nothing_on_postgres():
    url = SERVICE_URLS["postgres"]
    assert url is not None
    require_service("postgres", "127.0.0.1", 5432)
    async for world in world_at(url):
        engine = world.deps.db.engine
        async with engine.connect() as conn:
            for read, filters, index in PLANS:
                statements: list[tuple[str, Any]] = []

                def grab(*args: Any, into: list[tuple[str, Any]] = statements) -> None:
                    into.append((args[2], args[3]))  # (statement, parameters)

                event.listen(engine.sync_engine, "before_cursor_execute", grab)
                try:
                    await read(conn, after=10**6, limit=20, **filters)
                finally:
                    event.remove(engine.sync_engine, "before_cursor_execute", grab)
                [(statement, parameters)] = statements
                every = nodes(await explained(conn, statement, parameters))
                sorts = [n for n in every if n["Node Type"] in ("Sort", "Incremental Sort")]
                assert not sorts, (index, every)
                [scan] = [n for n in every if n.get("Index Name") == index]
                assert scan["Scan Direction"] == "Backward", (index, every)

"""Cursor pagination under concurrent inserts, on every database: a walk through a list, while
another process keeps adding goods and placing orders in its own transactions, shows every row
that existed when it began exactly once, newest first, and none of the new ones.

The inserter runs in its own thread, event loop and engine (as another API process would). The
walker waits between pages until the inserter has committed more rows (waiting in real time for
a thread to get somewhere, never for a deadline), so inserts land between every two pages as
well as during them.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from dueflow import bootstrap
from dueflow.clock import FakeClock
from dueflow.config import load_settings
from dueflow.domain.lifecycle import OrderStatus
from dueflow.service import accounts, lists, orders
from dueflow.service.accounts import User
from tests.conftest import START, eventually

PageOf = Callable[[str | None], Awaitable[lists.Page]]


@dataclass
class Inserter:
    """Adds goods and orders for them from another thread until told to stop."""

    url: str
    seller: int
    buyer: int
    inserted: list[int] = field(default_factory=list)  # goods ids, as committed
    placed: list[int] = field(default_factory=list)  # and the orders for them
    stop: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def past(self, count: int) -> bool:
        """More than ``count`` goods committed (or the thread failed: nothing more will be)."""
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
                goods_id = await accounts.add_goods(
                    d, seller_id=self.seller, title="new", price="1.00"
                )
                order_id = await orders.place_order(d, buyer_id=self.buyer, goods_id=goods_id)
                self.placed.append(order_id)
                self.inserted.append(goods_id)


async def walk_while_inserting(page_of: PageOf, inserter: Inserter) -> list[int]:
    """Every page of one list, the inserter adding rows during and between the pages."""
    thread = threading.Thread(target=inserter.run)
    page = await page_of(None)
    seen = [item["id"] for item in page.items]
    thread.start()
    try:
        while page.next is not None:
            done = len(inserter.inserted)
            assert await eventually(functools.partial(inserter.past, done))
            page = await page_of(page.next)
            seen += [item["id"] for item in page.items]
    finally:
        inserter.stop.set()
        thread.join()
    assert inserter.error is None, inserter.error
    assert inserter.inserted, "nothing was inserted during the walk"
    return seen


async def test_every_pre_existing_row_once_under_concurrent_inserts(backend_world, backend_url):
    world, deps = backend_world, backend_world.deps
    seller = await accounts.get_user(deps, world.seller)
    buyer = await accounts.get_user(deps, world.buyer)
    goods = [await world.goods(title=f"old {n}") for n in range(30)]
    placed = [await orders.place_order(deps, buyer_id=world.buyer, goods_id=g) for g in goods[:18]]

    def goods_pages(caller: User, seller_id: int | None) -> PageOf:
        async def page(after: str | None) -> lists.Page:
            return await lists.goods_list(deps, caller, seller_id=seller_id, after=after, limit=4)

        return page

    def order_pages(caller: User, role: lists.Party) -> PageOf:
        async def page(after: str | None) -> lists.Page:
            return await lists.orders_list(
                deps,
                caller,
                role=role,
                status=OrderStatus.PENDING_PAYMENT,
                flow="marketplace",
                after=after,
                limit=4,
            )

        return page

    walks = [
        (goods_pages(buyer, None), "goods"),  # held goods are still on sale
        (goods_pages(seller, world.seller), "goods"),
        (order_pages(buyer, "buyer"), "orders"),
        (order_pages(seller, "seller"), "orders"),
    ]
    existing = {"goods": goods, "orders": placed}
    for page_of, kind in walks:
        inserter = Inserter(backend_url, world.seller, world.buyer)
        seen = await walk_while_inserting(page_of, inserter)
        assert seen == sorted(existing[kind], reverse=True)
        # What this walk's inserter added exists for the next walk.
        existing = {
            "goods": existing["goods"] + inserter.inserted,
            "orders": existing["orders"] + inserter.placed,
        }

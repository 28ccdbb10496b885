"""What an order holds, behind one small interface per kind of thing held.

Today an order holds one goods item. Seats, stock units and coupons (planned) implement the same
four verbs (and say what they hold), and every cancel calls ``release`` or ``forfeit`` in the
cancel's own transaction.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.store import goods


class Hold(ABC):
    """Holding and letting go of one kind of thing."""

    @abstractmethod
    async def hold(self, conn: AsyncConnection, order_id: int, item_id: int, now: datetime) -> bool:
        """Hold ``item_id`` for ``order_id``; False when someone else holds it or it is not for sale."""

    @abstractmethod
    async def release(self, conn: AsyncConnection, order_ids: Sequence[int], now: datetime) -> int:
        """Put back on sale what these cancelled orders held; returns how many items."""

    @abstractmethod
    async def settle(self, conn: AsyncConnection, order_ids: Sequence[int], now: datetime) -> int:
        """Mark as sold what these paid orders hold."""

    @abstractmethod
    async def forfeit(self, conn: AsyncConnection, order_ids: Sequence[int], now: datetime) -> int:
        """Clear the hold and take the items off sale (the seller failed to deliver)."""

    @abstractmethod
    def held(self, order: Row[Any]) -> str:
        """What ``order`` (a moved order's row) holds, in words: the detail of its ``released``
        event."""


class GoodsHold(Hold):
    """One second-hand goods item per order."""

    async def hold(self, conn: AsyncConnection, order_id: int, item_id: int, now: datetime) -> bool:
        return await goods.hold_goods(conn, item_id, order_id, now)

    async def release(self, conn: AsyncConnection, order_ids: Sequence[int], now: datetime) -> int:
        return await goods.release_goods(conn, order_ids, now)

    async def settle(self, conn: AsyncConnection, order_ids: Sequence[int], now: datetime) -> int:
        return await goods.sell_goods(conn, order_ids, now)

    async def forfeit(self, conn: AsyncConnection, order_ids: Sequence[int], now: datetime) -> int:
        return await goods.take_off_sale(conn, order_ids, now)

    def held(self, order: Row[Any]) -> str:
        return f"goods {order.goods_id}"

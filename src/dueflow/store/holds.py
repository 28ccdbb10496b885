"""What an order holds, behind one small interface per kind of thing held: goods, seats, SKU
units, flash-sale units, coupons.

An order's lines say what it holds (``order_lines``); each kind is held and let go by its own
:class:`Hold`, and every flow names the kinds its orders hold (:func:`for_flows`). Every cancel
calls ``release`` or ``forfeit`` of each kind in the cancel's own transaction; the order code
never branches on kinds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import Row, select
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.exceptions import CouponUnusable, GoodsUnavailable, OutOfStock, PurchaseLimitExceeded
from dueflow.seatcache.base import NoSeatCache, SeatCache
from dueflow.store import goods, hot, shop, shows, tally
from dueflow.store.db import after_commit
from dueflow.store.schema import flash_sales, order_lines, skus


@dataclass(frozen=True)
class Line:
    """One thing an order holds: its kind (a :class:`Hold`'s), the item's id, what the buyer
    saw, how many, and the price of each."""

    kind: str
    item_id: int
    label: str
    price: Decimal
    quantity: int = 1


@dataclass(frozen=True)
class Holder:
    """The order taking the lines, and what a kind may need of it to hold them."""

    order_id: int
    buyer_id: int
    show_id: int | None = None


class Hold(ABC):
    """Holding and letting go of one kind of thing."""

    #: The ``order_lines.kind`` this Hold keeps.
    kind: str

    @abstractmethod
    async def hold(
        self, conn: AsyncConnection, holder: Holder, lines: Sequence[Line], now: datetime
    ) -> None:
        """Hold all of ``lines`` (of this kind) for the order, or raise and hold nothing.

        Raises:
            GoodsUnavailable: (or a subclass) an item is held by another order or not for sale.
        """

    @abstractmethod
    async def release(self, conn: AsyncConnection, order_ids: Sequence[int], now: datetime) -> int:
        """Put back what these cancelled unpaid orders held; returns how many items."""

    @abstractmethod
    async def settle(self, conn: AsyncConnection, order_ids: Sequence[int], now: datetime) -> int:
        """Mark as sold what these paid orders hold."""

    @abstractmethod
    async def forfeit(self, conn: AsyncConnection, order_ids: Sequence[int], now: datetime) -> int:
        """A paid order is cancelled: clear its hold (goods go off sale, tickets are void)."""


class GoodsHold(Hold):
    """One second-hand goods item per order."""

    kind = "goods"

    async def hold(
        self, conn: AsyncConnection, holder: Holder, lines: Sequence[Line], now: datetime
    ) -> None:
        for line in lines:
            if not await goods.hold_goods(conn, line.item_id, holder.order_id, now):
                raise GoodsUnavailable(f"goods {line.item_id} were just taken by another order")

    async def release(self, conn: AsyncConnection, order_ids: Sequence[int], now: datetime) -> int:
        return await goods.release_goods(conn, order_ids, now)

    async def settle(self, conn: AsyncConnection, order_ids: Sequence[int], now: datetime) -> int:
        return await goods.sell_goods(conn, order_ids, now)

    async def forfeit(self, conn: AsyncConnection, order_ids: Sequence[int], now: datetime) -> int:
        return await goods.take_off_sale(conn, order_ids, now)


class SeatHold(Hold):
    """Seats of one show; the seat cache is told after each commit."""

    kind = "seat"

    def __init__(self, cache: SeatCache | None = None) -> None:
        self.cache = cache or NoSeatCache()

    async def hold(
        self, conn: AsyncConnection, holder: Holder, lines: Sequence[Line], now: datetime
    ) -> None:
        assert holder.show_id is not None
        seat_rows = [_SeatRow(line.item_id, line.label) for line in lines]
        await shows.hold_seats(
            conn,
            show_id=holder.show_id,
            order_id=holder.order_id,
            buyer_id=holder.buyer_id,
            seat_rows=seat_rows,
            now=now,
        )
        labels = tuple(sorted(line.label for line in lines))
        self._tell(conn, [shows.SeatMove(holder.show_id, labels, shows.FREE, shows.HELD)])

    async def release(self, conn: AsyncConnection, order_ids: Sequence[int], now: datetime) -> int:
        return self._tell(conn, await shows.release_seats(conn, order_ids))

    async def settle(self, conn: AsyncConnection, order_ids: Sequence[int], now: datetime) -> int:
        return self._tell(conn, await shows.sell_seats(conn, order_ids, now))

    async def forfeit(self, conn: AsyncConnection, order_ids: Sequence[int], now: datetime) -> int:
        return self._tell(conn, await shows.void_seats(conn, order_ids, now))

    def _tell(self, conn: AsyncConnection, moves: list[shows.SeatMove]) -> int:
        if moves:
            cache = self.cache
            after_commit(conn, lambda: cache.moved(moves))
        return sum(len(m.labels) for m in moves)


@dataclass(frozen=True)
class _SeatRow:
    id: int
    label: str


class SkuHold(Hold):
    """Units of SKUs: taken from stock, back to stock on a cancel before payment, sold on
    payment. A paid order cancelled keeps them out of stock (the seller failed to ship; an
    operator decides what comes back)."""

    kind = "sku"
    table = skus

    async def hold(
        self, conn: AsyncConnection, holder: Holder, lines: Sequence[Line], now: datetime
    ) -> None:
        for line in sorted(lines, key=lambda line: line.item_id):
            if not await shop.take(conn, self.table, line.item_id, line.quantity, now):
                row = await shop.get(conn, self.table, line.item_id)
                left = row.stock if row is not None else 0
                raise OutOfStock(self._short(line, left))

    def _short(self, line: Line, left: int) -> str:
        return f"sku {line.item_id} ({line.label}): {left} left, {line.quantity} asked"

    async def release(self, conn: AsyncConnection, order_ids: Sequence[int], now: datetime) -> int:
        rows = await shop.units_of(conn, order_ids, self.kind)
        return await shop.give_back(conn, self.table, shop.per_item(rows), now)

    async def settle(self, conn: AsyncConnection, order_ids: Sequence[int], now: datetime) -> int:
        rows = await shop.units_of(conn, order_ids, self.kind)
        return await shop.sell(conn, self.table, shop.per_item(rows), now)

    async def forfeit(self, conn: AsyncConnection, order_ids: Sequence[int], now: datetime) -> int:
        return 0


class FlashHold(SkuHold):
    """Units of a flash sale's own stock (the order also holds the SKU's units), counted
    against the buyer's limit for the sale."""

    kind = "flash"
    table = flash_sales

    def _short(self, line: Line, left: int) -> str:
        return f"flash sale {line.item_id} ({line.label}): {left} left, {line.quantity} asked"

    async def hold(
        self, conn: AsyncConnection, holder: Holder, lines: Sequence[Line], now: datetime
    ) -> None:
        ordered = sorted(lines, key=lambda line: line.item_id)
        limits = []
        for line in ordered:
            # The take answers the sale's limit: the sale is not read again.
            limit = await shop.take_flash(conn, line.item_id, line.quantity, now)
            if limit is None:
                row = await shop.get(conn, self.table, line.item_id)
                raise OutOfStock(self._short(line, row.stock if row is not None else 0))
            limits.append(limit)
        for line, limit in zip(ordered, limits, strict=True):
            counted = await shop.count_buyer(
                conn,
                flash_sale_id=line.item_id,
                buyer_id=holder.buyer_id,
                quantity=line.quantity,
                limit=limit,
            )
            if counted is not None:
                raise PurchaseLimitExceeded(
                    f"flash sale {line.item_id} allows {limit} a buyer; you hold"
                    f" or bought {counted} and asked for {line.quantity} more"
                )

    async def release(self, conn: AsyncConnection, order_ids: Sequence[int], now: datetime) -> int:
        rows = await shop.units_of(conn, order_ids, self.kind)
        units = await shop.give_back(conn, self.table, shop.per_item(rows), now)
        await shop.uncount_buyers(conn, rows)
        return units


class CouponHold(Hold):
    """The buyer's coupon: locked to the order, used on payment, given back by a cancel before
    payment (expired if its validity ended meanwhile); a paid order cancelled keeps it used
    (the refund is what was paid)."""

    kind = "coupon"

    async def hold(
        self, conn: AsyncConnection, holder: Holder, lines: Sequence[Line], now: datetime
    ) -> None:
        for line in lines:
            if not await shop.lock_coupon(
                conn, line.item_id, buyer_id=holder.buyer_id, order_id=holder.order_id, now=now
            ):
                raise CouponUnusable(f"coupon {line.item_id} was just taken by another order")

    async def release(self, conn: AsyncConnection, order_ids: Sequence[int], now: datetime) -> int:
        return await shop.return_coupons(conn, order_ids, now)

    async def settle(self, conn: AsyncConnection, order_ids: Sequence[int], now: datetime) -> int:
        return await shop.use_coupons(conn, order_ids, now)

    async def forfeit(self, conn: AsyncConnection, order_ids: Sequence[int], now: datetime) -> int:
        return 0


#: The kinds each flow's orders hold, in the order they are taken and let go (SKUs before
#: flash sales before coupons: every transaction locks rows in this order).
FLOW_KINDS: Mapping[str, tuple[str, ...]] = {
    "marketplace": ("goods",),
    "tickets": ("seat",),
    "shop": ("sku", "flash", "coupon"),
}


@dataclass(frozen=True)
class Holds:
    """Every kind's :class:`Hold`, and which kinds each flow holds."""

    by_kind: Mapping[str, Hold]

    @classmethod
    def build(cls, *, seat_cache: SeatCache | None = None) -> Holds:
        """One Hold per kind (the seat cache, if any, goes to the seats')."""
        kinds: list[Hold] = [
            GoodsHold(),
            SeatHold(seat_cache),
            SkuHold(),
            FlashHold(),
            CouponHold(),
        ]
        return cls({h.kind: h for h in kinds})

    def of(self, kind: str) -> Hold:
        """The Hold of ``kind``."""
        return self.by_kind[kind]

    def for_flows(self, moved: Sequence[Row[Any]]) -> list[tuple[Hold, list[int]]]:
        """For moved orders (rows with ``id`` and ``flow``): each Hold their flows hold, with
        the ids of the orders it concerns."""
        ids_by_kind: dict[str, list[int]] = defaultdict(list)
        for row in moved:
            for kind in FLOW_KINDS[row.flow]:
                ids_by_kind[kind].append(row.id)
        return [(self.by_kind[kind], ids) for kind, ids in ids_by_kind.items()]


async def insert_lines(conn: AsyncConnection, order_id: int, lines: Sequence[Line]) -> None:
    """Write what the order holds (kept for good: what was bought); one line (goods, most
    places) is a hot statement."""
    rows = [
        {
            "order_id": order_id,
            "kind": line.kind,
            "item_id": line.item_id,
            "label": line.label[:200],
            "quantity": line.quantity,
            "price": line.price,
        }
        for line in lines
    ]
    if len(rows) == 1:
        await hot.inserting(order_lines, _LINE_COLUMNS).rowcount(conn, rows)
    else:
        await conn.execute(order_lines.insert(), rows)


_LINE_COLUMNS = ("order_id", "kind", "item_id", "label", "quantity", "price")


async def lines_of(conn: AsyncConnection, order_ids: Sequence[int]) -> dict[int, list[Row[Any]]]:
    """Each order's lines, in the order they were written."""
    found: dict[int, list[Row[Any]]] = {oid: [] for oid in order_ids}
    if not order_ids:
        return found
    query = (
        select(order_lines).where(order_lines.c.order_id.in_(order_ids)).order_by(order_lines.c.id)
    )
    for row in (await conn.execute(query)).all():
        found[row.order_id].append(row)
    return found


_HELD = (
    order_lines.c.order_id,
    order_lines.c.kind,
    order_lines.c.item_id,
    order_lines.c.label,
    order_lines.c.quantity,
)


async def held_lines(conn: AsyncConnection, order_ids: Sequence[int]) -> dict[int, list[Row[Any]]]:
    """:func:`lines_of` with only what :func:`describe` needs (order_id, kind, item_id, label,
    quantity): a cancel of a batch reads every line of it."""
    found: dict[int, list[Row[Any]]] = {oid: [] for oid in order_ids}
    if not order_ids:
        return found
    of_batch = tally.among(conn, order_lines.c.order_id, order_ids)
    query = select(*_HELD).where(of_batch).order_by(order_lines.c.id)
    rows: list[Any] = list((await conn.execute(query)).all())
    for row in rows:
        found[row.order_id].append(row)
    return found


def describe(lines: Sequence[Row[Any]]) -> str:
    """What lines hold, in words (the detail of a ``released`` event): ``goods 7``,
    ``seats A-1, A-2``, ``sku 3 x2, 5 x1; coupon 9``."""
    by_kind: dict[str, list[str]] = defaultdict(list)
    for line in lines:
        if line.kind == "seat":
            by_kind[line.kind].append(line.label)
        elif line.kind in ("sku", "flash"):
            by_kind[line.kind].append(f"{line.item_id} x{line.quantity}")
        else:
            by_kind[line.kind].append(str(line.item_id))
    parts = []
    for kind, items in by_kind.items():
        noun = kind if len(items) == 1 or kind in ("goods", "sku", "flash") else f"{kind}s"
        parts.append(f"{noun} {', '.join(items)}")
    return "; ".join(parts) or "nothing"

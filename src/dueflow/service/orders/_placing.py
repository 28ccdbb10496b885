"""Placing an order of goods: the hold, the order row, its timers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.domain.deadlines import DEFAULT_ORDER_TYPE
from dueflow.domain.lifecycle import OrderStatus
from dueflow.domain.timers import TimerKind
from dueflow.exceptions import (
    GoodsUnavailable,
    NotAllowed,
    NotFound,
    Unauthenticated,
)
from dueflow.locks import base as locks
from dueflow.service import accounts, actors
from dueflow.service.accounts import User
from dueflow.service.deps import Deps
from dueflow.store import (
    goods,
    holds,
    hot,
    idempotency,
    orders,
    timers,
    users,
)
from dueflow.store.goods import ON_SALE
from dueflow.store.schema import order_lines as line_rows
from dueflow.store.schema import orders as order_rows
from dueflow.store.schema import timers as timer_rows
from dueflow.store.types import CENT, fit

S = OrderStatus


async def place_order(
    deps: Deps,
    *,
    buyer_id: int,
    goods_id: int,
    key: idempotency.Key | None = None,
    buyer_known: bool = False,
) -> int:
    """Hold the goods for a new ``normal`` order awaiting payment; returns the order id. The
    server picks the order type (the buyer never does: it sets the buyer's own deadlines).
    ``buyer_known``: the caller has just read the buyer (authenticated them), so placing does
    not read it again.

    Raises:
        NotFound: no such goods or buyer.
        NotAllowed: the buyer sells these goods.
        GoodsUnavailable: another order holds them, or they are sold or off sale.
        Busy: the database is locked by others right now; try again.
    """
    placed = await place_order_view(
        deps, buyer_id=buyer_id, goods_id=goods_id, key=key, buyer_known=buyer_known
    )
    return int(placed["id"])


async def place_order_view(
    deps: Deps,
    *,
    buyer_id: int,
    goods_id: int,
    key: idempotency.Key | None = None,
    buyer_known: bool = False,
) -> dict[str, Any]:
    """:func:`place_order`, answering the new order's view (as :func:`order_view` shows it),
    built from what the placing transaction wrote: a new order has no payments, refunds,
    reviews or tickets yet, only its lines, its timers and its one event.

    Raises:
        As :func:`place_order`.
    """
    async with locks.held(deps.locks, f"goods:{goods_id}", deps.lock_ttl):
        placed, armed = await _place(deps, buyer_id, goods_id, key, buyer_known)
    await deps.arm(armed)
    return placed


async def place_by_token(
    deps: Deps, *, token: str, goods_id: int, known: Callable[[User], None]
) -> dict[str, Any]:
    """:func:`place_order_view` for the holder of a personal ``token``. ``known`` is told the
    buyer as soon as the token is read (before anything can refuse the order). Returns the new
    order's view.

    With a lock store that keeps others out (Redis), the token is read first, on its own, as
    the route does: nobody without a valid token takes a goods' lock or makes a buyer wait for
    it. Without one (the database's guarded hold decides alone), the token's read is the
    placing transaction's first statement: one checkout and one transaction a request instead
    of a read and a write.

    Raises:
        Unauthenticated: no user holds ``token`` (nothing is written, no lock taken).
        As :func:`place_order`.
    """
    if deps.locks.excludes:
        user = await accounts.authenticate(deps, token)
        if user is None:
            raise Unauthenticated("the bearer token is not valid")
        known(user)
        async with locks.held(deps.locks, f"goods:{goods_id}", deps.lock_ttl):
            placed, armed = await _place(deps, user.id, goods_id, None, buyer_known=True)
    else:
        token_hash = accounts.hash_token(token)
        now = deps.clock.now()
        async with deps.db.write() as conn:
            row = await users.by_token_hash(conn, token_hash)
            if row is None:
                raise Unauthenticated("the bearer token is not valid")
            known(User(row.id, row.name, row.is_admin))
            placed, armed = await _place_in(conn, deps, row.id, goods_id, None, now)
    await deps.arm(armed)
    return placed


async def _place(
    deps: Deps, buyer_id: int, goods_id: int, key: idempotency.Key | None, buyer_known: bool
) -> tuple[dict[str, Any], list[timers.Armed]]:
    now = deps.clock.now()
    async with deps.db.write() as conn:
        return await _place_in(conn, deps, buyer_id, goods_id, key, now, buyer_known=buyer_known)


async def _place_in(
    conn: AsyncConnection,
    deps: Deps,
    buyer_id: int,
    goods_id: int,
    key: idempotency.Key | None,
    now: datetime,
    *,
    buyer_known: bool = True,
) -> tuple[dict[str, Any], list[timers.Armed]]:
    """The placing transaction's work (``buyer_known``: the buyer was read already)."""
    item = await goods.get(conn, goods_id)
    if item is None:
        raise NotFound(f"no goods {goods_id}")
    if not buyer_known:
        await known_buyer(conn, buyer_id)
    if item.seller_id == buyer_id:
        raise NotAllowed("you cannot buy your own goods")
    if item.status != ON_SALE or item.reserved_order_id is not None:
        raise GoodsUnavailable(f"goods {goods_id} are {_goods_state(item)}")
    line = holds.Line(kind="goods", item_id=goods_id, label=item.title, price=item.price)
    order = await insert_placed(
        conn,
        deps,
        flow="marketplace",
        order_type=DEFAULT_ORDER_TYPE,
        buyer_id=buyer_id,
        seller_id=item.seller_id,
        amount=item.price,
        lines=[line],
        now=now,
        goods_id=goods_id,
    )
    await deps.holds.of(line.kind).hold(conn, holds.Holder(order["id"], buyer_id), [line], now)
    return await finish_placing(
        conn, deps, order, [line], key, now=now, detail=f"goods {goods_id} for {item.price}"
    )


async def known_buyer(conn: AsyncConnection, buyer_id: int) -> None:
    """The buyer exists (for callers that have not read it already).

    Raises:
        NotFound: no such user.
    """
    if await users.by_id(conn, buyer_id) is None:
        raise NotFound(f"no user {buyer_id}")


async def insert_placed(
    conn: AsyncConnection,
    deps: Deps,
    *,
    flow: str,
    order_type: str,
    buyer_id: int,
    seller_id: int,
    amount: Decimal,
    lines: Sequence[holds.Line],
    now: datetime,
    goods_id: int | None = None,
    show_id: int | None = None,
) -> dict[str, Any]:
    """In the placing transaction of every flow: the new order awaiting payment and its lines
    (what it holds is taken next, by the caller); returns the order row as written.

    Raises:
        InvalidInput: ``amount`` is above what any configured provider takes in one payment
            (refused before anything is written: such an order could never be paid).
    """
    deps.providers.check_payable(amount)
    values: dict[str, Any] = {
        "flow": flow,
        "order_type": order_type,
        "buyer_id": buyer_id,
        "seller_id": seller_id,
        "amount": amount,
        "status": S.PENDING_PAYMENT.value,
        "created_at": now,
        "updated_at": now,
        "pay_deadline": deps.policy.pay_deadline(order_type, now),
    }
    if goods_id is not None:
        values["goods_id"] = goods_id
    if show_id is not None:
        values["show_id"] = show_id
    values["id"] = await orders.insert_order(conn, **values)
    await holds.insert_lines(conn, values["id"], lines)
    return orders.as_read(order_rows, values)


async def finish_placing(
    conn: AsyncConnection,
    deps: Deps,
    order: dict[str, Any],
    lines: Sequence[holds.Line],
    key: idempotency.Key | None,
    *,
    now: datetime,
    detail: str,
) -> tuple[dict[str, Any], list[timers.Armed]]:
    """Last in the placing transaction of every flow, once what the order holds is taken:
    the pay deadline's ``cancel_unpaid`` timer, the reminder's (unless it would come too late),
    the ``place`` event, and the request's Idempotency-Key with its answer. Returns the new
    order's view (as :func:`view_in` reads it, built from what was written) and the timers for
    the trigger (after commit)."""
    order_id, order_type = order["id"], order["order_type"]
    new = [timers.NewTimer(order_id, TimerKind.CANCEL_UNPAID, order["pay_deadline"])]
    remind_at = deps.policy.reminder_at(order_type, now)
    if remind_at is not None:
        new.append(timers.NewTimer(order_id, TimerKind.PAY_REMINDER, remind_at))
    scheduled = await timers.schedule_rows(conn, new, now)
    held = _line_views(lines)
    event = await orders.add_event(
        conn,
        order_id,
        event="place",
        actor=actors.user(order["buyer_id"]),
        now=now,
        to_status=S.PENDING_PAYMENT,
        detail=detail,
        data={
            "amount": order["amount"],
            "lines": [{k: v[k] for k in ("kind", "item_id", "quantity")} for v in held],
        },
        # The order whole, as written: no statement to read it back.
        snapshot={**order, "lines": held, "tickets": [], "payments": [], "refunds": []},
    )
    view = new_view(order, lines, [orders.as_read(timer_rows, t) for t in scheduled], event)
    await idempotency.tie(conn, key, view, now)
    return view, [timers.Armed(t["id"], t["due_at"]) for t in scheduled]


def new_view(
    order: dict[str, Any],
    lines: Sequence[holds.Line],
    scheduled: list[dict[str, Any]],
    event: dict[str, Any],
) -> dict[str, Any]:
    """The view :func:`view_in` reads of an order just placed, from what was written."""
    view = dict(order)
    view["lines"] = _line_views(lines)
    view["tickets"], view["payments"], view["refunds"], view["reviews"] = [], [], [], []
    view["timers"] = scheduled
    view["notices"] = []
    view["timeline"] = [event]
    return view


def _line_views(lines: Sequence[holds.Line]) -> list[dict[str, Any]]:
    """The lines as the order view reads them back."""
    return [
        {
            "kind": line.kind,
            "item_id": line.item_id,
            "label": fit(line_rows.c.label, line.label),
            "quantity": line.quantity,
            "price": line.price.quantize(CENT),
        }
        for line in lines
    ]


def _goods_state(item: Row[Any] | hot.HotRow) -> str:
    if item.status != ON_SALE:
        return str(item.status).replace("_", " ")
    return "held by another order"

"""Who the caller is to an order, and the cancel that follows from it: its buyer cancels before
paying, its seller before shipping."""

from __future__ import annotations

from typing import Literal

from dueflow.exceptions import NotAllowed, NotFound
from dueflow.service import orders
from dueflow.service.deps import Deps
from dueflow.store import orders as order_store


async def role_in(deps: Deps, order_id: int, user_id: int) -> Literal["buyer", "seller"]:
    """The user's part in the order (one statement).

    Raises:
        NotFound: no such order.
        NotAllowed: the user is neither its buyer nor its seller.
    """
    async with deps.db.read() as conn:
        order = await order_store.get(conn, order_id)
    if order is None:
        raise NotFound(f"no order {order_id}")
    if order.buyer_id == user_id:
        return "buyer"
    if order.seller_id == user_id:
        return "seller"
    raise NotAllowed(f"order {order_id} is not yours")


async def cancel(deps: Deps, *, order_id: int, user_id: int) -> None:
    """The order's buyer (:func:`~dueflow.service.orders.cancel_by_buyer`) or seller
    (:func:`~dueflow.service.orders.cancel_by_seller`) cancels it, whichever the user is."""
    if await role_in(deps, order_id, user_id) == "buyer":
        await orders.cancel_by_buyer(deps, order_id=order_id, user_id=user_id)
    else:
        await orders.cancel_by_seller(deps, order_id=order_id, user_id=user_id)

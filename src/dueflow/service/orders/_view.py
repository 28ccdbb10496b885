"""An order as its parties and operators see it."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.exceptions import (
    NotFound,
)
from dueflow.service.deps import Deps
from dueflow.store import (
    aftersale,
    holds,
    orders,
    payments,
    shows,
    snapshots,
    timers,
)


async def order_view(deps: Deps, order_id: int) -> dict[str, Any]:
    """The order with its payments, refunds, reviews, timers and timeline."""
    async with deps.db.read() as conn:
        return await view_in(conn, order_id)


async def view_in(conn: AsyncConnection, order_id: int) -> dict[str, Any]:
    """The order's view (nine statements; ten for a show's order)."""
    order = await orders.get(conn, order_id)
    if order is None:
        raise NotFound(f"no order {order_id}")
    view = dict(order._mapping)
    view["lines"] = [
        {
            "kind": r.kind,
            "item_id": r.item_id,
            "label": r.label,
            "quantity": r.quantity,
            "price": r.price,
        }
        for r in (await holds.lines_of(conn, [order_id]))[order_id]
    ]
    view["tickets"] = [
        snapshots.ticket_view(t)
        # Only a show's orders have tickets: the others skip the statement.
        for t in (await shows.tickets_for(conn, order_id) if order.show_id is not None else [])
    ]
    view["payments"] = [dict(r._mapping) for r in await payments.for_orders(conn, [order_id])]
    view["refunds"] = [dict(r._mapping) for r in await payments.refunds_for_order(conn, order_id)]
    view["reviews"] = [dict(r._mapping) for r in await aftersale.for_order(conn, order_id)]
    view["timers"] = [dict(r._mapping) for r in await timers.for_order(conn, order_id)]
    view["notices"] = [dict(r._mapping) for r in await aftersale.reminders_for(conn, order_id)]
    view["timeline"] = [dict(r._mapping) for r in await orders.timeline(conn, order_id)]
    return view

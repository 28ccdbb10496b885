"""An order's page (``/admin/orders/{id}``), found by its number from ``/admin/orders``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from dueflow.api.admin_pages.site import HEADERS, Pages, id_of
from dueflow.domain.lifecycle import OrderStatus
from dueflow.service import operations, orders
from dueflow.service.accounts import User

FINAL_STATUSES = {s.value for s in OrderStatus if s.is_cancelled} | {"completed"}


def add_routes(routes: APIRouter, pages: Pages) -> None:
    """``/admin/orders`` and ``/admin/orders/{id}`` on the admin router."""
    deps = pages.deps

    @routes.get("/orders", response_class=HTMLResponse)
    async def find_order(request: Request, id: str = "") -> Response:
        async def found(_: User) -> Response:
            order_id = id_of(id.strip().lstrip("#"))
            if order_id is None:
                return pages.back("/admin", f"{id!r} is not an order number")
            return RedirectResponse(f"/admin/orders/{order_id}", status_code=303, headers=HEADERS)

        return await pages.signed_in(request, found)

    @routes.get("/orders/{order_id}", response_class=HTMLResponse)
    async def order_page(request: Request, order_id: str) -> Response:
        async def load(found: int) -> dict[str, Any]:
            return await orders.order_view(deps, found)

        async def render(user: User, _: int, view: dict[str, Any]) -> Response:
            live = view["status"] not in FINAL_STATUSES or any(
                t["state"] in operations.LIVE for t in view["timers"]
            )
            return pages.page(
                request, "order.html", user=user, order=view, refresh=2 if live else 0
            )

        return await pages.one(request, "order", order_id, load, render)

"""An order's page (``/admin/orders/{id}``), found by its number from ``/admin/orders``."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from dueflow.api.admin_pages.site import HEADERS, Pages, id_of, login_redirect
from dueflow.domain.lifecycle import OrderStatus
from dueflow.exceptions import NotFound
from dueflow.service import operations, orders

FINAL_STATUSES = {s.value for s in OrderStatus if s.is_cancelled} | {"completed"}


def add_routes(routes: APIRouter, pages: Pages) -> None:
    """``/admin/orders`` and ``/admin/orders/{id}`` on the admin router."""
    deps = pages.deps

    @routes.get("/orders", response_class=HTMLResponse)
    async def find_order(request: Request, id: str = "") -> Response:
        if await pages.user(request) is None:
            return login_redirect(request)
        order_id = id_of(id.strip().lstrip("#"))
        if order_id is None:
            return pages.back("/admin", f"{id!r} is not an order number")
        return RedirectResponse(f"/admin/orders/{order_id}", status_code=303, headers=HEADERS)

    @routes.get("/orders/{order_id}", response_class=HTMLResponse)
    async def order_page(request: Request, order_id: str) -> Response:
        user = await pages.user(request)
        if user is None:
            return login_redirect(request)
        found = id_of(order_id)
        try:
            if found is None:
                raise NotFound(f"no order {order_id}")
            view = await orders.order_view(deps, found)
        except NotFound as exc:
            return pages.problem(request, user, 404, "Not found", exc.message)
        live = view["status"] not in FINAL_STATUSES or any(
            t["state"] in operations.LIVE for t in view["timers"]
        )
        return pages.page(request, "order.html", user=user, order=view, refresh=2 if live else 0)

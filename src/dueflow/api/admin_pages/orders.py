"""The orders pages: every order (``/admin/orders``, filtered, searched, in cursor pages), the
same orders as CSV (``/admin/orders.csv``, every page), and one order (``/admin/orders/{id}``,
also reached by its number: ``/admin/orders?id=``)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse

from dueflow.api.admin_pages.site import HEADERS, Pages, id_of
from dueflow.domain import events, lifecycle
from dueflow.domain.lifecycle import OrderStatus
from dueflow.exceptions import InvalidInput
from dueflow.service import operations, order_search, orders, people
from dueflow.service.accounts import User

FINAL_STATUSES = {s.value for s in OrderStatus if s.is_cancelled} | {"completed"}
#: Orders on a page of the list.
PAGE_SIZE = 50


def add_routes(routes: APIRouter, pages: Pages) -> None:
    """``/admin/orders``, ``/admin/orders.csv`` and ``/admin/orders/{id}`` on the admin
    router."""
    deps = pages.deps

    @routes.get("/orders", response_class=HTMLResponse)
    async def order_list(request: Request, id: str | None = None, after: str = "") -> Response:
        async def render(user: User) -> Response:
            if id is not None:  # the number typed into the top bar's box of old
                return _to_order(pages, id)
            given = _filters(request)
            try:
                kept = order_search.order_filter(given)
                page = await order_search.orders_page(
                    deps, kept, after=after or None, limit=PAGE_SIZE
                )
            except InvalidInput as exc:
                return pages.problem(request, user, 422, "Bad filter", exc.message)
            query = {name: value for name, value in given.items() if value}
            return pages.page(
                request,
                "orders.html",
                user=user,
                orders=page.items,
                given=given,
                statuses=[s.value for s in OrderStatus],
                flows=sorted(lifecycle.LIFECYCLES),
                next=f"?{urlencode({**query, 'after': page.next})}" if page.next else "",
                first=f"?{urlencode(query)}" if after else "",
                csv=f"/admin/orders.csv?{urlencode(query)}",
                limit=PAGE_SIZE,
            )

        return await pages.signed_in(request, render)

    @routes.get("/orders.csv")
    async def order_csv(request: Request) -> Response:
        async def render(user: User) -> Response:
            try:
                kept = order_search.order_filter(_filters(request))
            except InvalidInput as exc:
                return pages.problem(request, user, 422, "Bad filter", exc.message)
            at = deps.clock.now().strftime("%Y%m%dT%H%M%SZ")
            return StreamingResponse(
                order_search.orders_csv(deps, kept),
                media_type="text/csv; charset=utf-8",
                headers={
                    **HEADERS,
                    "Content-Disposition": f'attachment; filename="orders-{at}.csv"',
                },
            )

        return await pages.signed_in(request, render)

    @routes.get("/orders/{order_id}", response_class=HTMLResponse)
    async def order_page(request: Request, order_id: str) -> Response:
        async def load(found: int) -> dict[str, Any]:
            return await orders.order_view(deps, found)

        async def render(user: User, _: int, view: dict[str, Any]) -> Response:
            live = view["status"] not in FINAL_STATUSES or any(
                t["state"] in operations.LIVE for t in view["timers"]
            )
            actors = {e["actor"]: events.actor_of(e["actor"]) for e in view["timeline"]}
            acting = [a["user_id"] for a in actors.values() if a["type"] == "user"]
            names = await people.names(deps, (view["buyer_id"], view["seller_id"], *acting))
            return pages.page(
                request,
                "order.html",
                user=user,
                order=view,
                names=names,
                actors=actors,
                refresh=2 if live else 0,
            )

        return await pages.one(request, "order", order_id, load, render)


def _filters(request: Request) -> dict[str, str]:
    """The filters of the request's query (each the first value given, blank when absent)."""
    return {name: request.query_params.get(name, "") for name in order_search.FILTERS}


def _to_order(pages: Pages, typed: str) -> Response:
    order_id = id_of(typed.strip().lstrip("#"))
    if order_id is None:
        return pages.back("/admin", f"{typed!r} is not an order number")
    return RedirectResponse(f"/admin/orders/{order_id}", status_code=303, headers=HEADERS)

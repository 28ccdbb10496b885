"""The shop pages under ``/admin``: every SKU with its units (``/admin/skus``), one SKU with its
flash sales and newest orders (``/admin/skus/{id}``), every flash sale with what it sold, holds
and has left (``/admin/flash-sales``), and a buyer's coupons (``/admin/users/{id}/coupons``,
found by name or id from ``/admin/coupons``).

:func:`add_routes` puts them on the admin router, behind the same session as every admin page.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from dueflow.api.admin_pages.site import HEADERS, Pages, id_of
from dueflow.exceptions import NotFound
from dueflow.service import accounts, people, shop, shop_overview
from dueflow.service.accounts import User

#: SKUs and flash sales on the list pages, newest first.
LISTED = 200
#: Orders on a SKU's page, newest first.
ORDERS_LISTED = 500


def add_routes(routes: APIRouter, pages: Pages) -> None:
    """The SKU, flash sale and coupon pages on the admin router."""
    deps = pages.deps

    @routes.get("/skus", response_class=HTMLResponse)
    async def sku_list(request: Request) -> Response:
        return await pages.listing(
            request, "skus.html", "skus", shop_overview.skus_overview, LISTED
        )

    @routes.get("/skus/{sku_id}", response_class=HTMLResponse)
    async def sku_page(request: Request, sku_id: str) -> Response:
        async def load(found: int) -> dict[str, Any]:
            return await shop_overview.sku_page(deps, found, ORDERS_LISTED)

        async def render(user: User, _: int, sku: dict[str, Any]) -> Response:
            return pages.page(
                request, "sku.html", user=user, sku=sku, limit=ORDERS_LISTED, refresh=5
            )

        return await pages.one(request, "sku", sku_id, load, render)

    @routes.get("/flash-sales", response_class=HTMLResponse)
    async def flash_sale_list(request: Request) -> Response:
        return await pages.listing(
            request, "flash_sales.html", "sales", shop_overview.flash_sales_overview, LISTED
        )

    @routes.get("/coupons", response_class=HTMLResponse)
    async def find_coupons(request: Request, user: str = "") -> Response:
        async def render(admin: User) -> Response:
            wanted = user.strip()
            if not wanted:
                return pages.page(request, "coupons.html", user=admin, owner=None, coupons=[])
            try:
                owner = await _owner(wanted)
            except NotFound as exc:
                return pages.problem(request, admin, 404, "Not found", exc.message)
            return RedirectResponse(
                f"/admin/users/{owner.id}/coupons", status_code=303, headers=HEADERS
            )

        return await pages.signed_in(request, render)

    async def _owner(wanted: str) -> User:
        """The user named ``wanted``, or (failing that) the user with that id."""
        try:
            return await accounts.get_user(deps, wanted)
        except NotFound:
            by_id = id_of(wanted.lstrip("#"))
            if by_id is None:
                raise
            return await accounts.get_user(deps, by_id)

    @routes.get("/users/{user_id}/coupons", response_class=HTMLResponse)
    async def user_coupons(request: Request, user_id: str) -> Response:
        async def load(found: int) -> User:
            return await accounts.get_user(deps, found)

        async def render(admin: User, _: int, owner: User) -> Response:
            coupons = await shop.coupons_of(deps, owner.id)
            return pages.page(
                request,
                "coupons.html",
                user=admin,
                owner=owner,
                coupons=coupons,
                names=await people.names(deps, [c["seller_id"] for c in coupons]),
                refresh=5,
            )

        return await pages.one(request, "user", user_id, load, render)

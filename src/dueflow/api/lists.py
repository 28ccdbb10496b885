"""The list routes: ``GET /api/goods``, ``GET /api/orders``, the catalogue's
(``GET /api/skus``, ``/api/shows``, ``/api/flash-sales``, ``/api/coupon-templates``), the
caller's coupons (``GET /api/me/coupons``) and ``GET /api/me``.

Lists are paged by an opaque cursor (:mod:`dueflow.service.lists`): each answer is
``{"items": [...], "next": CURSOR or null}``; pass ``next`` back as ``after``, with the same
filters, for the following page. Goods on sale are public to every user; orders and coupons are
only ever the caller's own; the catalogue is every signed-in user's to read, as its single reads
are. The admins' lists (refunds, users) are in :mod:`dueflow.api.refunds` and
:mod:`dueflow.api.admin`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from dueflow.api import auth
from dueflow.api.common import FOR_A_USER, MAX_ID, WITH_PARAMS, answer, resource
from dueflow.api.goods import GoodsView
from dueflow.api.schemas import OrderListItem, View, errors
from dueflow.api.shop import CouponTemplateView, CouponView, FlashSaleView, SkuView
from dueflow.api.shows import ShowItem
from dueflow.domain import lifecycle
from dueflow.domain.lifecycle import OrderStatus
from dueflow.service import lists
from dueflow.service.deps import Deps

#: Cursors are URL-safe base64 of a small JSON object; anything else is refused at the edge.
After = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=400,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="the ``next`` cursor of the page before (omit for the first page)",
    ),
]
PageLimit = Annotated[
    int, Query(ge=1, le=lists.MAX_LIMIT, description=f"rows per page, at most {lists.MAX_LIMIT}")
]
SellerId = Annotated[
    int | None,
    Query(
        ge=1,
        le=MAX_ID,
        description="only this seller's goods (the caller's own in every status)",
    ),
]


def id_filter(description: str) -> Any:
    """A query filter by one id (positive, 64-bit), documented with ``description``."""
    return Query(ge=1, le=MAX_ID, description=description)


OwnedBy = Annotated[int | None, id_filter("only this seller's")]
OrganizedBy = Annotated[int | None, id_filter("only this organizer's")]
OfSku = Annotated[int | None, id_filter("only this SKU's")]
Flow = Annotated[
    str | None,
    Query(
        max_length=32,
        description="only orders of this flow",
        json_schema_extra={"enum": sorted(lifecycle.LIFECYCLES)},
    ),
]


#: What every list answers besides its items.
NEXT_DESCRIPTION = (
    "the cursor of the next page, to pass as ``after`` with the same filters; null on the last"
)


class GoodsPage(View):
    """A page of goods, newest first."""

    items: list[GoodsView]
    next: str | None = Field(description=NEXT_DESCRIPTION)


class OrderPage(View):
    """A page of the caller's orders, newest first."""

    items: list[OrderListItem]
    next: str | None = Field(description=NEXT_DESCRIPTION)


class SkuPage(View):
    """A page of SKUs, newest first."""

    items: list[SkuView]
    next: str | None = Field(description=NEXT_DESCRIPTION)


class ShowPage(View):
    """A page of shows, newest first."""

    items: list[ShowItem]
    next: str | None = Field(description=NEXT_DESCRIPTION)


class FlashSalePage(View):
    """A page of flash sales, newest first."""

    items: list[FlashSaleView]
    next: str | None = Field(description=NEXT_DESCRIPTION)


class CouponTemplatePage(View):
    """A page of coupon templates, newest first."""

    items: list[CouponTemplateView]
    next: str | None = Field(description=NEXT_DESCRIPTION)


class CouponList(View):
    """A page of the caller's coupons, newest first (``coupons`` repeats ``items`` for the
    clients written before the list had pages)."""

    items: list[CouponView]
    next: str | None = Field(description=NEXT_DESCRIPTION)
    coupons: list[CouponView] = Field(
        deprecated=True, description="the same coupons as ``items``; read ``items``"
    )


class MeView(View):
    """The caller, and how many orders they have as buyer and as seller."""

    id: int
    name: str
    admin: bool
    orders_as_buyer: int
    orders_as_seller: int


def _page(page: lists.Page) -> JSONResponse:
    return answer({"items": page.items, "next": page.next})


def router(deps: Deps) -> APIRouter:
    """The list routes over ``deps``; every one is for a user: goods need the ``catalog`` scope,
    orders and the caller the ``orders`` scope."""
    api = resource("/api", auth.current_user(deps, "catalog"), FOR_A_USER)
    own = resource("/api", auth.current_user(deps, "orders"), FOR_A_USER)

    @api.get("/goods", tags=["goods"], response_model=GoodsPage, responses=errors(*WITH_PARAMS))
    async def list_goods(
        request: Request,
        seller_id: SellerId = None,
        after: After = None,
        limit: PageLimit = lists.DEFAULT_LIMIT,
    ) -> JSONResponse:
        """Goods on sale (held ones too: ``reserved_order_id`` is set), newest first; with
        ``seller_id`` one seller's, in every status when they are the caller's own."""
        page = await lists.goods_list(
            deps, auth.caller(request), seller_id=seller_id, after=after, limit=limit
        )
        return _page(page)

    @own.get("/orders", tags=["orders"], response_model=OrderPage, responses=errors(*WITH_PARAMS))
    async def list_orders(
        request: Request,
        role: Literal["buyer", "seller"] = "buyer",
        status: OrderStatus | None = None,
        flow: Flow = None,
        after: After = None,
        limit: PageLimit = lists.DEFAULT_LIMIT,
    ) -> JSONResponse:
        """The caller's orders as buyer (or as seller), newest first, optionally in one
        status and of one flow. Nobody sees another's orders here, admins included."""
        page = await lists.orders_list(
            deps,
            auth.caller(request),
            role=role,
            status=status,
            flow=flow,
            after=after,
            limit=limit,
        )
        return _page(page)

    @api.get("/skus", tags=["shop"], response_model=SkuPage, responses=errors(*WITH_PARAMS))
    async def list_skus(
        seller_id: OwnedBy = None, after: After = None, limit: PageLimit = lists.DEFAULT_LIMIT
    ) -> JSONResponse:
        """SKUs, newest first, optionally one seller's; each as ``GET /api/skus/{id}`` shows
        it (every signed-in user reads every SKU)."""
        return _page(await lists.skus_list(deps, seller_id=seller_id, after=after, limit=limit))

    @api.get("/shows", tags=["shows"], response_model=ShowPage, responses=errors(*WITH_PARAMS))
    async def list_shows(
        organizer_id: OrganizedBy = None,
        status: Literal["on_sale", "cancelled"] | None = None,
        after: After = None,
        limit: PageLimit = lists.DEFAULT_LIMIT,
    ) -> JSONResponse:
        """Shows, newest first, optionally one organizer's and in one status; each as
        ``GET /api/shows/{id}`` shows it but for the seat counts, which that read has."""
        page = await lists.shows_list(
            deps, organizer_id=organizer_id, status=status, after=after, limit=limit
        )
        return _page(page)

    @api.get(
        "/flash-sales", tags=["shop"], response_model=FlashSalePage, responses=errors(*WITH_PARAMS)
    )
    async def list_flash_sales(
        seller_id: OwnedBy = None,
        sku_id: OfSku = None,
        after: After = None,
        limit: PageLimit = lists.DEFAULT_LIMIT,
    ) -> JSONResponse:
        """Flash sales (over, running and to come), newest first, optionally one seller's
        and of one SKU."""
        page = await lists.flash_sales_list(
            deps, seller_id=seller_id, sku_id=sku_id, after=after, limit=limit
        )
        return _page(page)

    @api.get(
        "/coupon-templates",
        tags=["shop"],
        response_model=CouponTemplatePage,
        responses=errors(*WITH_PARAMS),
    )
    async def list_templates(
        seller_id: OwnedBy = None, after: After = None, limit: PageLimit = lists.DEFAULT_LIMIT
    ) -> JSONResponse:
        """Coupon templates (expired ones too), newest first, optionally one seller's."""
        page = await lists.templates_list(deps, seller_id=seller_id, after=after, limit=limit)
        return _page(page)

    @api.get(
        "/me/coupons", tags=["shop"], response_model=CouponList, responses=errors(*WITH_PARAMS)
    )
    async def my_coupons(
        request: Request, after: After = None, limit: PageLimit = lists.MAX_LIMIT
    ) -> JSONResponse:
        """The caller's coupons, newest first; a page holds 100 unless ``limit`` says fewer.
        ``coupons`` repeats ``items`` (deprecated: read ``items`` and follow ``next``)."""
        page = await lists.coupons_list(deps, auth.caller(request), after=after, limit=limit)
        return answer({"items": page.items, "next": page.next, "coupons": page.items})

    @own.get("/me", tags=["users"], response_model=MeView)
    async def me(request: Request) -> JSONResponse:
        """The caller: id, name, admin flag, and their orders counted as buyer and as seller."""
        return answer(await lists.me(deps, auth.caller(request)))

    both = APIRouter()
    both.include_router(api)
    both.include_router(own)
    return both

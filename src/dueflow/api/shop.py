"""The shop routes: SKUs (``/api/skus``), coupon templates and coupons
(``/api/coupon-templates``) and flash sales (``/api/flash-sales``); their lists and the caller's
coupons (``/api/me/coupons``) are in :mod:`dueflow.api.lists`. Units are ordered through
``POST /api/orders`` (``lines`` and ``coupon_id``, or ``flash_sale_id`` and ``quantity``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from dueflow.api import auth, idempotency
from dueflow.api import schemas as out
from dueflow.api.common import (
    FOR_A_USER,
    MAX_ID,
    WITH_BODY,
    WITH_PARAMS,
    Body,
    Id,
    answer,
    resource,
)
from dueflow.api.schemas import Money, View, errors
from dueflow.error_codes import ErrorCode
from dueflow.service import shop
from dueflow.service.deps import Deps

Price = Field(min_length=1, max_length=32, pattern=r"^[0-9]+(\.[0-9]+)?$", examples=["12.50"])
Stock = Field(ge=0, le=shop.MAX_UNITS)


class NewSku(Body):
    """A SKU to sell: its title, its price in yuan and how many units are on sale."""

    title: out.SingleLine = Field(min_length=1, max_length=200)
    price: str = Price
    stock: int = Stock


class Restock(Body):
    """How many more units to put on sale."""

    quantity: int = Field(ge=1, le=shop.MAX_UNITS)


class NewTemplate(Body):
    """A coupon template: the amount off orders of at least ``min_amount`` from the caller's
    shop, valid in [valid_from, valid_until), at most ``total`` issued."""

    title: out.SingleLine = Field(min_length=1, max_length=200)
    amount_off: str = Price
    min_amount: str = Field(
        default="0", min_length=1, max_length=32, pattern=r"^[0-9]+(\.[0-9]+)?$"
    )
    valid_from: out.Time
    valid_until: out.Time
    total: int = Field(ge=1, le=shop.MAX_UNITS)


class Issue(Body):
    """The user to issue one coupon to."""

    user_id: int = Field(ge=1, le=MAX_ID)


class NewFlashSale(Body):
    """A flash sale of one of the caller's SKUs: its price, its units, its window and how many
    units one buyer may hold or buy."""

    sku_id: int = Field(ge=1, le=MAX_ID)
    price: str = Price
    stock: int = Field(ge=1, le=shop.MAX_UNITS)
    starts_at: out.Time
    ends_at: out.Time
    per_buyer_limit: int = Field(default=1, ge=1, le=shop.MAX_QUANTITY)


class Units(View):
    """Units of a SKU or flash sale where they are: stock + held + sold = stocked."""

    stock: int = Field(description="units on sale")
    held: int = Field(description="held by unpaid orders")
    sold: int = Field(description="sold with paid orders")
    stocked: int = Field(description="every unit ever put in")


class SkuView(Units):
    """A SKU of a shop."""

    id: int
    seller_id: int
    title: str
    price: Money
    created_at: datetime
    updated_at: datetime


class FlashSaleView(Units):
    """A flash sale of a SKU: its own price and units, its window and per-buyer limit."""

    id: int
    sku_id: int
    seller_id: int
    price: Money
    starts_at: datetime
    ends_at: datetime
    per_buyer_limit: int
    created_at: datetime
    updated_at: datetime


class CouponTemplateView(View):
    """What a seller's coupons are worth, and how many were issued."""

    id: int
    seller_id: int
    title: str
    amount_off: Money
    min_amount: Money
    valid_from: datetime
    valid_until: datetime
    total: int
    issued: int
    created_at: datetime


class CouponView(View):
    """A coupon issued to a user, with its template's terms."""

    id: int
    template_id: int
    user_id: int
    seller_id: int
    title: str
    amount_off: Money
    min_amount: Money
    valid_from: datetime
    valid_until: datetime
    state: str = Field(description="available | locked | used | expired")
    order_id: int | None = Field(description="the order it is locked to or was used by")
    issued_at: datetime
    used_at: datetime | None
    updated_at: datetime


def router(deps: Deps) -> APIRouter:
    """The shop routes over ``deps``."""
    codes = [*FOR_A_USER, ErrorCode.NOT_FOUND]
    api = resource("/api", auth.current_user(deps, "catalog"), codes, tag="shop")
    keyed = idempotency.idempotent(deps)

    async def created(
        create: Callable[..., Awaitable[dict[str, Any]]], body: Body, request: Request
    ) -> JSONResponse:
        """What ``create`` makes of the body's fields, the caller its seller: its view, 201."""
        user = auth.caller(request)
        return answer(await create(deps, seller_id=user.id, **body.model_dump()), 201)

    @api.post("/skus", status_code=201, response_model=SkuView, responses=errors(*WITH_BODY))
    @keyed
    async def add_sku(body: NewSku, request: Request) -> JSONResponse:
        """Put a SKU on sale, the caller its seller."""
        return await created(shop.create_sku, body, request)

    @api.get("/skus/{sku_id}", response_model=SkuView, responses=errors(*WITH_PARAMS))
    async def get_sku(sku_id: Id) -> JSONResponse:
        """A SKU with its units on sale, held and sold."""
        return answer(await shop.sku_view(deps, sku_id))

    @api.post(
        "/skus/{sku_id}/restock",
        response_model=SkuView,
        responses=errors(*WITH_PARAMS, *WITH_BODY, ErrorCode.NOT_ALLOWED),
    )
    @keyed
    async def restock(sku_id: Id, body: Restock, request: Request) -> JSONResponse:
        """The seller puts more units on sale."""
        user = auth.caller(request)
        view = await shop.restock(deps, sku_id=sku_id, user_id=user.id, quantity=body.quantity)
        return answer(view)

    @api.post(
        "/coupon-templates",
        status_code=201,
        response_model=CouponTemplateView,
        responses=errors(*WITH_BODY),
    )
    @keyed
    async def add_template(body: NewTemplate, request: Request) -> JSONResponse:
        """A coupon template for orders of the caller's SKUs."""
        return await created(shop.create_template, body, request)

    @api.get(
        "/coupon-templates/{template_id}",
        response_model=CouponTemplateView,
        responses=errors(*WITH_PARAMS),
    )
    async def get_template(template_id: Id) -> JSONResponse:
        """A coupon template with how many were issued."""
        return answer(await shop.template_view(deps, template_id))

    @api.post(
        "/coupon-templates/{template_id}/issue",
        status_code=201,
        response_model=CouponView,
        responses=errors(
            *WITH_PARAMS, *WITH_BODY, ErrorCode.NOT_ALLOWED, ErrorCode.COUPON_UNUSABLE
        ),
    )
    @keyed
    async def issue(template_id: Id, body: Issue, request: Request) -> JSONResponse:
        """Issue one coupon to a user (the template's seller, or an admin); 409 when all were
        issued or the template expired."""
        user = auth.caller(request)
        view = await shop.issue_coupon(
            deps,
            template_id=template_id,
            issuer_id=user.id,
            user_id=body.user_id,
            admin=user.is_admin,
        )
        return answer(view, 201)

    @api.post(
        "/flash-sales",
        status_code=201,
        response_model=FlashSaleView,
        responses=errors(*WITH_BODY, ErrorCode.NOT_ALLOWED),
    )
    @keyed
    async def add_flash_sale(body: NewFlashSale, request: Request) -> JSONResponse:
        """A flash sale of one of the caller's SKUs."""
        return await created(shop.create_flash_sale, body, request)

    @api.get("/flash-sales/{sale_id}", response_model=FlashSaleView, responses=errors(*WITH_PARAMS))
    async def get_flash_sale(sale_id: Id) -> JSONResponse:
        """A flash sale with its units on sale, held and sold."""
        return answer(await shop.flash_sale_view(deps, sale_id))

    return api

"""The goods routes under ``/api/goods``: a seller puts goods on sale, anyone signed in reads
them (the list of goods is in :mod:`dueflow.api.lists`). Goods are ordered through
``POST /api/orders`` (``goods_id``)."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from dueflow.api import auth, idempotency
from dueflow.api import schemas as out
from dueflow.api.common import FOR_A_USER, WITH_BODY, WITH_PARAMS, Body, Id, answer, resource
from dueflow.api.schemas import Money, View, errors
from dueflow.error_codes import ErrorCode
from dueflow.service import accounts
from dueflow.service.deps import Deps


class NewGoods(Body):
    """Goods to put on sale; the price is a string of yuan such as ``"12.50"``."""

    title: out.SingleLine = Field(min_length=1, max_length=200)
    price: str = Field(
        min_length=1, max_length=32, pattern=r"^[0-9]+(\.[0-9]+)?$", examples=["12.50"]
    )


class GoodsView(View):
    """Goods on sale, held by an order (``reserved_order_id``), sold or off sale."""

    id: int
    seller_id: int
    title: str
    price: Money
    status: str = Field(description="on_sale | sold | off_sale")
    reserved_order_id: int | None
    created_at: datetime
    updated_at: datetime


def router(deps: Deps) -> APIRouter:
    """The ``/api/goods`` routes over ``deps``."""
    routes = resource("/api/goods", auth.current_user(deps, "catalog"), FOR_A_USER, tag="goods")
    keyed = idempotency.idempotent(deps)

    @routes.post("", status_code=201, response_model=GoodsView, responses=errors(*WITH_BODY))
    @keyed
    async def add_goods(body: NewGoods, request: Request) -> JSONResponse:
        """Put goods on sale as the caller."""
        user = auth.caller(request)
        goods_id = await accounts.add_goods(
            deps, seller_id=user.id, title=body.title, price=body.price
        )
        return answer(await accounts.get_goods(deps, goods_id), 201)

    @routes.get(
        "/{goods_id}", response_model=GoodsView, responses=errors(*WITH_PARAMS, ErrorCode.NOT_FOUND)
    )
    async def get_goods(goods_id: Id) -> JSONResponse:
        """Goods by id."""
        return answer(await accounts.get_goods(deps, goods_id))

    return routes

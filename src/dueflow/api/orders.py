"""The orders routes under ``/api/orders``: placing an order (goods, seats of a show, units of
SKUs with a coupon, units of a flash sale; with its ``Idempotency-Key``), reading it, and what its
buyer and seller do to it: pay, cancel, ship, confirm receipt, review. (The caller's orders as a
list are in :mod:`dueflow.api.lists`.) Errors are raised as dueflow's own and answered by
:mod:`dueflow.api.errors`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field, model_validator

from dueflow.api import auth, idempotency
from dueflow.api import schemas as out
from dueflow.api.common import (
    FOR_A_USER,
    KEYED,
    MAX_ID,
    WITH_BODY,
    WITH_PARAMS,
    Body,
    Id,
    answer,
    encode,
    resource,
)
from dueflow.api.schemas import OrderView, View, errors
from dueflow.error_codes import ErrorCode
from dueflow.exceptions import DomainError, NotAllowed
from dueflow.service import orders, parties, payments, replays, shop, tickets
from dueflow.service.accounts import User
from dueflow.service.deps import Deps


class NewLine(Body):
    """Units of one SKU."""

    sku_id: int = Field(ge=1, le=MAX_ID)
    quantity: int = Field(ge=1, le=10_000)


class NewOrder(Body):
    """What to order, one of: goods (``goods_id``); seats of a show (``show_id`` and
    ``seats``); SKU lines (``lines``, optionally a ``coupon_id``); units of a flash sale
    (``flash_sale_id``, ``quantity``). The server picks the order type from what is bought."""

    goods_id: int | None = Field(default=None, ge=1, le=MAX_ID)
    show_id: int | None = Field(default=None, ge=1, le=MAX_ID)
    seats: list[out.SingleLine] | None = Field(
        default=None, min_length=1, max_length=50, examples=[["A-12", "A-13"]]
    )
    lines: list[NewLine] | None = Field(default=None, min_length=1, max_length=50)
    coupon_id: int | None = Field(default=None, ge=1, le=MAX_ID)
    flash_sale_id: int | None = Field(default=None, ge=1, le=MAX_ID)
    quantity: int | None = Field(default=None, ge=1, le=10_000)

    @model_validator(mode="after")
    def _one_kind(self) -> NewOrder:
        given = [
            name
            for name in ("goods_id", "show_id", "lines", "flash_sale_id")
            if getattr(self, name) is not None
        ]
        if len(given) != 1:
            raise ValueError(
                "give one of goods_id, show_id with seats, lines, or flash_sale_id with quantity"
            )
        if (self.show_id is None) != (self.seats is None):
            raise ValueError("seats go with a show_id, and a show_id with seats")
        if self.coupon_id is not None and self.lines is None:
            raise ValueError("coupon_id goes with lines of SKUs")
        if (self.flash_sale_id is None) != (self.quantity is None):
            raise ValueError("quantity goes with a flash_sale_id, and a flash_sale_id with it")
        return self


class NewPayment(Body):
    """Pay through this provider (``alipay`` or ``wechatpay``)."""

    provider: out.SingleLine = Field(min_length=1, max_length=16)


class Shipment(Body):
    """The carrier and its tracking number."""

    carrier: out.SingleLine = Field(min_length=1, max_length=64)
    tracking_no: out.SingleLine = Field(min_length=1, max_length=64)


class NewReview(Body):
    """A rating from 1 to 5 and an optional comment."""

    rating: int = Field(ge=1, le=5)
    comment: out.MultiLine = Field(default="", max_length=500)


class PaymentStarted(View):
    """The new attempt's pay number and where the buyer pays."""

    pay_no: str
    pay_url: str


class ReviewAnswer(View):
    """The role the caller reviewed as, and the order afterwards."""

    role: Literal["buyer", "seller"]
    order: OrderView


#: The fields of a timer an order's buyer and seller see (the claim and the last error are
#: the operators': /api/admin and the admin pages).
_PARTY_TIMER = tuple(out.OrderTimerView.model_fields)


def for_parties(view: Mapping[str, Any]) -> dict[str, Any]:
    """An order's view as its buyer and seller are answered it: every order answer of the API
    passes here, so its timers carry only :class:`~dueflow.api.schemas.OrderTimerView`'s
    fields."""
    return {**view, "timers": [{k: t[k] for k in _PARTY_TIMER} for t in view["timers"]]}


class _Kept:
    """The encoder an Idempotency-Key writes its first answer with, in the placing
    transaction; it keeps the bytes so the answer sent is the answer kept."""

    def __init__(self) -> None:
        self.body: bytes | None = None

    def __call__(self, view: Mapping[str, Any]) -> str:
        self.body = encode(for_parties(view))
        return self.body.decode()


def _again(again: replays.Replay) -> Response:
    """The first answer to an Idempotency-Key, given again."""
    if again.body is not None:
        return idempotency.again(again)
    assert again.view is not None  # a replay has its body or its order's view
    replayed = answer(for_parties(again.view), again.status_code)
    replayed.headers[idempotency.REPLAYED] = "true"
    return replayed


async def _place(deps: Deps, user: User, body: NewOrder, key: replays.Key | None) -> dict[str, Any]:
    """Place the order the body asks for; answers its view. The buyer is the caller, just
    authenticated: placing does not read it again."""
    if body.show_id is not None:
        assert body.seats is not None  # checked by the body
        return await tickets.place_ticket_order(
            deps,
            buyer_id=user.id,
            show_id=body.show_id,
            labels=body.seats,
            key=key,
            buyer_known=True,
        )
    if body.lines is not None:
        return await shop.place_shop_order(
            deps,
            buyer_id=user.id,
            lines=[line.model_dump() for line in body.lines],
            coupon_id=body.coupon_id,
            key=key,
            buyer_known=True,
        )
    if body.flash_sale_id is not None:
        assert body.quantity is not None  # checked by the body
        return await shop.place_flash_order(
            deps,
            buyer_id=user.id,
            flash_sale_id=body.flash_sale_id,
            quantity=body.quantity,
            key=key,
            buyer_known=True,
        )
    assert body.goods_id is not None
    return await orders.place_order_view(
        deps, buyer_id=user.id, goods_id=body.goods_id, key=key, buyer_known=True
    )


#: What placing can answer besides a bad body: what it buys missing, held, sold, out of stock or
#: past a limit, sales closed, the coupon unusable or not the buyer's, one's own goods, and the
#: Idempotency-Key's (it keeps its own, in its transaction).
PLACING = (
    *WITH_BODY,
    ErrorCode.NOT_ALLOWED,
    ErrorCode.GOODS_UNAVAILABLE,
    ErrorCode.SEAT_UNAVAILABLE,
    ErrorCode.OUT_OF_STOCK,
    ErrorCode.SEAT_LIMIT_EXCEEDED,
    ErrorCode.PURCHASE_LIMIT_EXCEEDED,
    ErrorCode.SALES_CLOSED,
    ErrorCode.COUPON_UNUSABLE,
    *KEYED,
)
#: What every move of an order's party can answer: the order's status does not allow it, and
#: (to an admin who is not its party; anyone else is told 404) not yours.
MOVE = (*WITH_PARAMS, ErrorCode.INVALID_TRANSITION, ErrorCode.NOT_ALLOWED)


def router(deps: Deps) -> APIRouter:
    """The ``/api/orders`` routes over ``deps``."""
    codes = [*FOR_A_USER, ErrorCode.NOT_FOUND]
    routes = resource("/api/orders", auth.current_user(deps, "orders"), codes, tag="orders")
    # Starting a payment is the one order route of the ``payments`` scope.
    paying = resource("/api/orders", auth.current_user(deps, "payments"), codes, tag="orders")
    keyed = idempotency.idempotent(deps)

    @routes.post("", status_code=201, response_model=OrderView, responses=errors(*PLACING))
    async def place_order(
        body: NewOrder,
        request: Request,
        idempotency_key: idempotency.KeyHeader = None,
    ) -> Response:
        """Hold what the order buys (goods, seats of a show, units of SKUs and a coupon, units
        of a flash sale) for a new order awaiting payment: 409 when held, sold, out of stock,
        past a per-buyer limit, sales closed, the coupon unusable, or busy. With an
        ``Idempotency-Key`` header the same key from the same buyer within 24 h answers the
        first order again; the key with another body is a 409."""
        user = auth.caller(request)
        if idempotency_key is None:
            return answer(for_parties(await _place(deps, user, body, None)), 201)
        kept = _Kept()
        key = replays.key_for(
            user.id, idempotency.checked(idempotency_key), body.model_dump(), answer=kept
        )
        again = await replays.replay(deps, key)
        if again is not None:
            return _again(again)
        try:
            view = await _place(deps, user, body, key)
        except DomainError:
            # The same key raced this request and won (this one then fails on the key's row, or
            # sooner on what the winner took: the last units, the coupon): its order is the
            # answer. A refusal with no order behind the key is the answer itself.
            again = await replays.replay(deps, key)
            if again is None:
                raise
            return _again(again)
        # The answer was kept with the key in the placing transaction: send those bytes.
        text = kept.body if kept.body is not None else encode(for_parties(view))
        return Response(text, status_code=201, media_type="application/json")

    @routes.get("/{order_id}", response_model=OrderView, responses=errors(*WITH_PARAMS))
    async def get_order(order_id: Id, request: Request) -> JSONResponse:
        """The order with its payments, refunds, reviews, timers and timeline; only its buyer,
        its seller and admins see it (everyone else gets 404)."""
        user = auth.caller(request)
        view = await orders.order_view(deps, order_id)
        if not user.is_admin and user.id not in (view["buyer_id"], view["seller_id"]):
            raise NotAllowed(f"order {order_id} is not yours")
        return answer(for_parties(view))

    @paying.post(
        "/{order_id}/payments",
        status_code=201,
        response_model=PaymentStarted,
        responses=errors(
            *MOVE,
            *WITH_BODY,
            ErrorCode.NOT_YOUR_ROLE,
            ErrorCode.SALES_CLOSED,
            ErrorCode.PROVIDER_ERROR,
            ErrorCode.PROVIDER_UNAVAILABLE,
        ),
    )
    @keyed
    async def start_payment(order_id: Id, body: NewPayment, request: Request) -> JSONResponse:
        """The buyer starts paying: the pay number and where to pay."""
        user = auth.caller(request)
        pay_no, pay_url = await payments.start_payment(
            deps,
            order_id=order_id,
            user_id=user.id,
            provider=body.provider,
            key=idempotency.claimed(request),
        )
        return answer({"pay_no": pay_no, "pay_url": pay_url}, 201)

    @routes.post(
        "/{order_id}/cancel",
        response_model=OrderView,
        responses=errors(*MOVE, ErrorCode.PROVIDER_UNAVAILABLE, ErrorCode.PAYMENT_MISMATCH),
    )
    @keyed
    async def cancel(order_id: Id, request: Request) -> JSONResponse:
        """The buyer cancels before paying; the seller cancels before shipping (a refund
        awaits review)."""
        user = auth.caller(request)
        await parties.cancel(deps, order_id=order_id, user_id=user.id)
        return answer(for_parties(await orders.order_view(deps, order_id)))

    @routes.post(
        "/{order_id}/ship",
        response_model=OrderView,
        responses=errors(*MOVE, *WITH_BODY, ErrorCode.NOT_YOUR_ROLE),
    )
    @keyed
    async def ship(order_id: Id, body: Shipment, request: Request) -> JSONResponse:
        """The seller ships."""
        user = auth.caller(request)
        await orders.ship(
            deps,
            order_id=order_id,
            user_id=user.id,
            carrier=body.carrier,
            tracking_no=body.tracking_no,
        )
        return answer(for_parties(await orders.order_view(deps, order_id)))

    @routes.post(
        "/{order_id}/confirm-receipt",
        response_model=OrderView,
        responses=errors(*MOVE, ErrorCode.NOT_YOUR_ROLE),
    )
    @keyed
    async def confirm_receipt(order_id: Id, request: Request) -> JSONResponse:
        """The buyer confirms receipt."""
        user = auth.caller(request)
        await orders.confirm_receipt(deps, order_id=order_id, user_id=user.id)
        return answer(for_parties(await orders.order_view(deps, order_id)))

    @routes.post(
        "/{order_id}/reviews",
        status_code=201,
        response_model=ReviewAnswer,
        responses=errors(*MOVE, *WITH_BODY),
    )
    @keyed
    async def review(order_id: Id, body: NewReview, request: Request) -> JSONResponse:
        """The buyer or the seller reviews a received order."""
        user = auth.caller(request)
        role = await orders.review(
            deps, order_id=order_id, user_id=user.id, rating=body.rating, comment=body.comment
        )
        view = for_parties(await orders.order_view(deps, order_id))
        return answer({"role": role, "order": view}, 201)

    both = APIRouter()
    both.include_router(routes)
    both.include_router(paying)
    return both

"""The JSON API under ``/api``: goods, orders and what buyers and sellers do to them, and the
admin routes (the refund routes are in :mod:`dueflow.api.refunds`). Errors are raised as dueflow's own and answered by :mod:`dueflow.api.errors`.

Each route's ``response_model`` (from :mod:`dueflow.api.schemas`) documents its answer in the
OpenAPI schema; the JSON itself is built by :func:`answer` (FastAPI passes a returned response
through untouched), encoded once by orjson: money stays exact decimal text and datetimes keep
their ``+00:00``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Depends, Header, Path, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator

from dueflow.api import auth
from dueflow.api import schemas as out
from dueflow.api.schemas import errors
from dueflow.exceptions import DomainError, InvalidInput, NotAllowed
from dueflow.service import accounts, operations, orders, parties, payments, replays, shop, tickets
from dueflow.service.accounts import User
from dueflow.service.deps import Deps

#: Ids are positive 64-bit integers; anything else is refused before it reaches the database.
MAX_ID = 2**63 - 1
Id = Annotated[int, Path(ge=1, le=MAX_ID)]
Limit = Annotated[int, Query(ge=1, le=1000, description="at most this many rows")]


class Body(BaseModel):
    """A request body: unknown fields and loose types are refused (422)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class NewGoods(Body):
    """Goods to put on sale; the price is a string of yuan such as ``"12.50"``."""

    title: out.SingleLine = Field(min_length=1, max_length=200)
    price: str = Field(
        min_length=1, max_length=32, pattern=r"^[0-9]+(\.[0-9]+)?$", examples=["12.50"]
    )


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


#: An Idempotency-Key: printable ASCII without spaces, as most clients make them (UUIDs).
IDEMPOTENCY_KEY = re.compile(r"[!-~]{1,255}")


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


class NewUser(Body):
    """A user to create; its token is shown once in the answer."""

    name: out.SingleLine = Field(min_length=1, max_length=64)
    admin: bool = False


def _unnative(value: Any) -> Any:
    """What orjson does not encode itself: Decimals (as exact text), mappings that are not
    dicts (rows' mappings) and named tuples."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def encode(value: Any) -> bytes:
    """``value`` as JSON in one pass: Decimals as strings (money stays exact), datetimes as
    ISO 8601 (``+00:00``, microseconds when there are any), keys as text."""
    return orjson.dumps(value, default=_unnative, option=orjson.OPT_NON_STR_KEYS)


class _Encoded(JSONResponse):
    """A JSON response rendered by :func:`encode`."""

    def render(self, content: Any) -> bytes:
        return encode(content)


def answer(value: Any, status: int = 200) -> JSONResponse:
    """A JSON response of ``value``, encoded once (:func:`encode`)."""
    return _Encoded(value, status_code=status)


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
        return Response(again.body, status_code=again.status_code, media_type="application/json")
    assert again.view is not None  # a replay has its body or its order's view
    return answer(for_parties(again.view), again.status_code)


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


def router(deps: Deps) -> APIRouter:
    """Every ``/api`` route over ``deps``."""
    routes = APIRouter(prefix="/api")
    routes.include_router(_goods(deps))
    routes.include_router(_orders(deps))
    routes.include_router(_admin(deps))
    return routes


def _goods(deps: Deps) -> APIRouter:
    routes = APIRouter(
        prefix="/goods",
        tags=["goods"],
        dependencies=[Depends(auth.current_user(deps))],
        responses=errors(401, 413, 422, 503),
    )

    @routes.post("", status_code=201, response_model=out.GoodsView, responses=errors(400))
    async def add_goods(body: NewGoods, request: Request) -> JSONResponse:
        """Put goods on sale as the caller."""
        user = auth.caller(request)
        goods_id = await accounts.add_goods(
            deps, seller_id=user.id, title=body.title, price=body.price
        )
        return answer(await accounts.get_goods(deps, goods_id), 201)

    @routes.get("/{goods_id}", response_model=out.GoodsView, responses=errors(404))
    async def get_goods(goods_id: Id) -> JSONResponse:
        """Goods by id."""
        return answer(await accounts.get_goods(deps, goods_id))

    return routes


def _orders(deps: Deps) -> APIRouter:
    routes = APIRouter(
        prefix="/orders",
        tags=["orders"],
        dependencies=[Depends(auth.current_user(deps))],
        responses=errors(401, 404, 413, 422, 503),
    )

    @routes.post("", status_code=201, response_model=out.OrderView, responses=errors(400, 403, 409))
    async def place_order(
        body: NewOrder,
        request: Request,
        idempotency_key: Annotated[
            str | None,
            Header(
                alias="Idempotency-Key",
                description="1-255 printable ASCII characters, no spaces (a UUID): the same "
                "key from the same buyer within 24 h answers the first order again; with "
                "another body, 409.",
            ),
        ] = None,
    ) -> Response:
        """Hold what the order buys (goods, seats of a show, units of SKUs and a coupon, units
        of a flash sale) for a new order awaiting payment: 409 when held, sold, out of stock,
        past a per-buyer limit, sales closed, the coupon unusable, or busy. With an
        ``Idempotency-Key`` header the same key from the same buyer within 24 h answers the
        first order again; the key with another body is a 409."""
        user = auth.caller(request)
        header = idempotency_key
        if header is None:
            return answer(for_parties(await _place(deps, user, body, None)), 201)
        if not IDEMPOTENCY_KEY.fullmatch(header):
            raise InvalidInput("Idempotency-Key: 1-255 printable ASCII characters, no spaces")
        kept = _Kept()
        key = replays.key_for(user.id, header, body.model_dump(), answer=kept)
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

    @routes.get("/{order_id}", response_model=out.OrderView)
    async def get_order(order_id: Id, request: Request) -> JSONResponse:
        """The order with its payments, refunds, reviews, timers and timeline; only its buyer,
        its seller and admins see it (everyone else gets 404)."""
        user = auth.caller(request)
        view = await orders.order_view(deps, order_id)
        if not user.is_admin and user.id not in (view["buyer_id"], view["seller_id"]):
            raise NotAllowed(f"order {order_id} is not yours")
        return answer(for_parties(view))

    @routes.post(
        "/{order_id}/payments",
        status_code=201,
        response_model=out.PaymentStarted,
        responses=errors(400, 403, 409, 502),
    )
    async def start_payment(order_id: Id, body: NewPayment, request: Request) -> JSONResponse:
        """The buyer starts paying: the pay number and where to pay."""
        user = auth.caller(request)
        pay_no, pay_url = await payments.start_payment(
            deps, order_id=order_id, user_id=user.id, provider=body.provider
        )
        return answer({"pay_no": pay_no, "pay_url": pay_url}, 201)

    @routes.post("/{order_id}/cancel", response_model=out.OrderView, responses=errors(403, 409))
    async def cancel(order_id: Id, request: Request) -> JSONResponse:
        """The buyer cancels before paying; the seller cancels before shipping (a refund
        awaits review)."""
        user = auth.caller(request)
        await parties.cancel(deps, order_id=order_id, user_id=user.id)
        return answer(for_parties(await orders.order_view(deps, order_id)))

    @routes.post("/{order_id}/ship", response_model=out.OrderView, responses=errors(400, 403, 409))
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
        "/{order_id}/confirm-receipt", response_model=out.OrderView, responses=errors(403, 409)
    )
    async def confirm_receipt(order_id: Id, request: Request) -> JSONResponse:
        """The buyer confirms receipt."""
        user = auth.caller(request)
        await orders.confirm_receipt(deps, order_id=order_id, user_id=user.id)
        return answer(for_parties(await orders.order_view(deps, order_id)))

    @routes.post(
        "/{order_id}/reviews",
        status_code=201,
        response_model=out.ReviewAnswer,
        responses=errors(400, 403, 409),
    )
    async def review(order_id: Id, body: NewReview, request: Request) -> JSONResponse:
        """The buyer or the seller reviews a received order."""
        user = auth.caller(request)
        role = await orders.review(
            deps, order_id=order_id, user_id=user.id, rating=body.rating, comment=body.comment
        )
        view = for_parties(await orders.order_view(deps, order_id))
        return answer({"role": role, "order": view}, 201)

    return routes


def _admin(deps: Deps) -> APIRouter:
    routes = APIRouter(
        prefix="/admin",
        tags=["admin"],
        dependencies=[Depends(auth.current_admin(deps))],
        responses=errors(401, 403, 413, 503),
    )

    @routes.post(
        "/users", status_code=201, response_model=out.UserCreated, responses=errors(400, 422)
    )
    async def add_user(body: NewUser) -> JSONResponse:
        """Create a user; the token is shown only here."""
        user, token = await accounts.add_user(deps, body.name, admin=body.admin)
        return answer(
            {"id": user.id, "name": user.name, "admin": user.is_admin, "token": token}, 201
        )

    @routes.get("/overdue", response_model=list[out.OverdueTimer], responses=errors(422))
    async def overdue(limit: Limit = 100) -> JSONResponse:
        """Live timers past due by more than the scan grace, oldest first, with their order's
        status."""
        return answer(await operations.overdue_timers(deps, limit))

    @routes.get("/timers", response_model=list[out.TimerView], responses=errors(422))
    async def timers(
        state: Literal["stuck", "scheduled", "claimed", "done", "cancelled", "parked"] = "stuck",
        limit: Limit = 100,
    ) -> JSONResponse:
        """Timers in one state; ``stuck`` means live timers flagged stuck."""
        return answer(await operations.timers_in_state(deps, state, limit))

    @routes.post(
        "/timers/{timer_id}/run-now",
        response_model=out.TimerView,
        responses=errors(404, 409, 422),
    )
    async def run_now(timer_id: Id, request: Request) -> JSONResponse:
        """Make a waiting, stuck or parked timer due now (409 when a worker holds it or it is
        over)."""
        actor = f"user:{auth.caller(request).id}"
        return answer(await operations.run_timer_now(deps, timer_id, actor=actor))

    @routes.get("/summary", response_model=out.Summary)
    async def summary() -> JSONResponse:
        """Orders by status, timers by state, overdue and stuck timers, refunds by state,
        discrepancies, timer lateness over the last hour by kind, and the invariants."""
        return answer(await operations.summary(deps))

    @routes.get("/discrepancies", response_model=list[out.DiscrepancyView], responses=errors(422))
    async def discrepancies(limit: Limit = 100) -> JSONResponse:
        """Recorded payment discrepancies, newest first."""
        return answer(await operations.discrepancies(deps, limit))

    return routes

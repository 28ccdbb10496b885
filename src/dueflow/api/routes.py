"""The JSON API under ``/api``: goods, orders and what buyers and sellers do to them, and the
admin routes. Errors are raised as dueflow's own and answered by :mod:`dueflow.api.errors`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import date, datetime
from decimal import Decimal
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select

from dueflow.api import auth
from dueflow.domain.timers import TimerState
from dueflow.exceptions import NotAllowed, NotFound
from dueflow.service import accounts, operations, orders, payments, refunds
from dueflow.service.accounts import User
from dueflow.service.deps import Deps
from dueflow.store import orders as order_store
from dueflow.store import schema
from dueflow.store import timers as timer_store

#: Ids are positive 64-bit integers; anything else is refused before it reaches the database.
MAX_ID = 2**63 - 1
Id = Annotated[int, Path(ge=1, le=MAX_ID)]
Limit = Annotated[int, Query(ge=1, le=1000, description="at most this many rows")]
LIVE = (TimerState.SCHEDULED.value, TimerState.CLAIMED.value)


class Body(BaseModel):
    """A request body: unknown fields and loose types are refused (422)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class NewGoods(Body):
    """Goods to put on sale; the price is a string of yuan such as ``"12.50"``."""

    title: str = Field(min_length=1, max_length=200)
    price: str = Field(min_length=1, max_length=32, examples=["12.50"])


class NewOrder(Body):
    """An order for goods; ``order_type`` picks the deadlines (the default type if omitted)."""

    goods_id: int = Field(ge=1, le=MAX_ID)
    order_type: str | None = Field(default=None, max_length=32)


class NewPayment(Body):
    """Pay through this provider (``alipay`` or ``wechatpay``)."""

    provider: str = Field(min_length=1, max_length=16)


class Shipment(Body):
    """The carrier and its tracking number."""

    carrier: str = Field(max_length=64)
    tracking_no: str = Field(max_length=64)


class NewReview(Body):
    """A rating from 1 to 5 and an optional comment."""

    rating: int = Field(ge=1, le=5)
    comment: str = Field(default="", max_length=500)


class NewUser(Body):
    """A user to create; its token is shown once in the answer."""

    name: str = Field(min_length=1, max_length=64)
    admin: bool = False


def jsonable(value: Any) -> Any:
    """Rows and views as JSON: Decimals as strings (money stays exact), datetimes as ISO 8601."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def answer(value: Any, status: int = 200) -> JSONResponse:
    """A JSON response of ``value`` through :func:`jsonable`."""
    return JSONResponse(jsonable(value), status_code=status)


def rows(found: Sequence[Any]) -> list[dict[str, Any]]:
    """SQLAlchemy rows as dicts."""
    return [dict(r._mapping) for r in found]


def router(deps: Deps) -> APIRouter:
    """Every ``/api`` route over ``deps``."""
    routes = APIRouter(prefix="/api")
    routes.include_router(_goods(deps))
    routes.include_router(_orders(deps))
    routes.include_router(_admin(deps))
    return routes


def _goods(deps: Deps) -> APIRouter:
    routes = APIRouter(
        prefix="/goods", tags=["goods"], dependencies=[Depends(auth.current_user(deps))]
    )

    @routes.post("", status_code=201)
    async def add_goods(body: NewGoods, request: Request) -> JSONResponse:
        """Put goods on sale as the caller."""
        user = auth.caller(request)
        goods_id = await accounts.add_goods(
            deps, seller_id=user.id, title=body.title, price=body.price
        )
        return answer(await accounts.get_goods(deps, goods_id), 201)

    @routes.get("/{goods_id}")
    async def get_goods(goods_id: Id) -> JSONResponse:
        """Goods by id."""
        return answer(await accounts.get_goods(deps, goods_id))

    return routes


async def _role(deps: Deps, order_id: int, user: User) -> Literal["buyer", "seller"]:
    """The caller's part in the order (NotAllowed, answered 404, when it has none)."""
    async with deps.db.read() as conn:
        order = await order_store.get(conn, order_id)
    if order is None:
        raise NotFound(f"no order {order_id}")
    if order.buyer_id == user.id:
        return "buyer"
    if order.seller_id == user.id:
        return "seller"
    raise NotAllowed(f"order {order_id} is not yours")


def _orders(deps: Deps) -> APIRouter:
    routes = APIRouter(
        prefix="/orders", tags=["orders"], dependencies=[Depends(auth.current_user(deps))]
    )

    @routes.post("", status_code=201)
    async def place_order(body: NewOrder, request: Request) -> JSONResponse:
        """Hold the goods for a new order awaiting payment (409 when held, sold or busy)."""
        user = auth.caller(request)
        options = {"order_type": body.order_type} if body.order_type is not None else {}
        order_id = await orders.place_order(
            deps, buyer_id=user.id, goods_id=body.goods_id, **options
        )
        return answer(await orders.order_view(deps, order_id), 201)

    @routes.get("/{order_id}")
    async def get_order(order_id: Id, request: Request) -> JSONResponse:
        """The order with its payments, refunds, reviews, timers and timeline; only its buyer,
        its seller and admins see it (everyone else gets 404)."""
        user = auth.caller(request)
        view = await orders.order_view(deps, order_id)
        if not user.is_admin and user.id not in (view["buyer_id"], view["seller_id"]):
            raise NotAllowed(f"order {order_id} is not yours")
        return answer(view)

    @routes.post("/{order_id}/payments", status_code=201)
    async def start_payment(order_id: Id, body: NewPayment, request: Request) -> JSONResponse:
        """The buyer starts paying: the pay number and where to pay."""
        user = auth.caller(request)
        pay_no, pay_url = await payments.start_payment(
            deps, order_id=order_id, user_id=user.id, provider=body.provider
        )
        return answer({"pay_no": pay_no, "pay_url": pay_url}, 201)

    @routes.post("/{order_id}/cancel")
    async def cancel(order_id: Id, request: Request) -> JSONResponse:
        """The buyer cancels before paying; the seller cancels before shipping (a refund
        awaits review)."""
        user = auth.caller(request)
        if await _role(deps, order_id, user) == "buyer":
            await orders.cancel_by_buyer(deps, order_id=order_id, user_id=user.id)
        else:
            await orders.cancel_by_seller(deps, order_id=order_id, user_id=user.id)
        return answer(await orders.order_view(deps, order_id))

    @routes.post("/{order_id}/ship")
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
        return answer(await orders.order_view(deps, order_id))

    @routes.post("/{order_id}/confirm-receipt")
    async def confirm_receipt(order_id: Id, request: Request) -> JSONResponse:
        """The buyer confirms receipt."""
        user = auth.caller(request)
        await orders.confirm_receipt(deps, order_id=order_id, user_id=user.id)
        return answer(await orders.order_view(deps, order_id))

    @routes.post("/{order_id}/reviews", status_code=201)
    async def review(order_id: Id, body: NewReview, request: Request) -> JSONResponse:
        """The buyer or the seller reviews a received order."""
        user = auth.caller(request)
        role = await orders.review(
            deps, order_id=order_id, user_id=user.id, rating=body.rating, comment=body.comment
        )
        return answer({"role": role, "order": await orders.order_view(deps, order_id)}, 201)

    return routes


def _admin(deps: Deps) -> APIRouter:
    routes = APIRouter(
        prefix="/admin", tags=["admin"], dependencies=[Depends(auth.current_admin(deps))]
    )

    @routes.post("/users", status_code=201)
    async def add_user(body: NewUser) -> JSONResponse:
        """Create a user; the token is shown only here."""
        user, token = await accounts.add_user(deps, body.name, admin=body.admin)
        return answer(
            {"id": user.id, "name": user.name, "admin": user.is_admin, "token": token}, 201
        )

    @routes.get("/overdue")
    async def overdue(limit: Limit = 100) -> JSONResponse:
        """Live timers past due by more than the scan grace, oldest first, with their order's
        status."""
        return answer(await _overdue(deps, limit))

    @routes.get("/timers")
    async def timers(
        state: Literal["stuck", "scheduled", "claimed", "done", "cancelled"] = "stuck",
        limit: Limit = 100,
    ) -> JSONResponse:
        """Timers in one state; ``stuck`` means live timers flagged stuck."""
        return answer(await _timers(deps, state, limit))

    @routes.post("/timers/{timer_id}/run-now")
    async def run_now(timer_id: Id, request: Request) -> JSONResponse:
        """Make a waiting or stuck timer due now (409 when a worker holds it or it is over)."""
        await operations.run_timer_now(deps, timer_id, actor=f"user:{auth.caller(request).id}")
        async with deps.db.read() as conn:
            return answer(dict((await timer_store.get(conn, timer_id))._mapping))

    @routes.get("/summary")
    async def summary() -> JSONResponse:
        """Orders by status, timers by state, overdue and stuck timers, refunds by state,
        discrepancies, timer lateness over the last hour by kind, and the invariants."""
        return answer(await operations.summary(deps))

    @routes.get("/discrepancies")
    async def discrepancies(limit: Limit = 100) -> JSONResponse:
        """Recorded payment discrepancies, newest first."""
        table = schema.discrepancies
        async with deps.db.read() as conn:
            query = select(table).order_by(table.c.id.desc()).limit(limit)
            return answer(rows((await conn.execute(query)).all()))

    @routes.get("/refunds")
    async def list_refunds(
        state: Annotated[str | None, Query(max_length=32)] = None,
    ) -> JSONResponse:
        """Refunds, newest first, optionally in one state."""
        return answer(await refunds.list_refunds(deps, state=state))

    @routes.post("/refunds/{refund_id}/approve")
    async def approve(refund_id: Id, request: Request) -> JSONResponse:
        """Submit a refund in review to its provider."""
        state = await refunds.approve(deps, refund_id, actor=f"user:{auth.caller(request).id}")
        return answer({"id": refund_id, "state": state})

    @routes.post("/refunds/{refund_id}/retry")
    async def retry(refund_id: Id, request: Request) -> JSONResponse:
        """Submit a failed refund again, with the same refund number."""
        state = await refunds.retry(deps, refund_id, actor=f"user:{auth.caller(request).id}")
        return answer({"id": refund_id, "state": state})

    return routes


async def _overdue(deps: Deps, limit: int) -> list[dict[str, Any]]:
    timers, t_orders = schema.timers, schema.orders
    query = (
        select(timers, t_orders.c.status.label("order_status"))
        .join(t_orders, t_orders.c.id == timers.c.order_id)
        .where(timers.c.state.in_(LIVE), timers.c.due_at <= deps.clock.now() - deps.scan_grace)
        .order_by(timers.c.due_at, timers.c.id)
        .limit(limit)
    )
    async with deps.db.read() as conn:
        return rows((await conn.execute(query)).all())


async def _timers(deps: Deps, state: str, limit: int) -> list[dict[str, Any]]:
    timers = schema.timers
    query = select(timers).order_by(timers.c.due_at, timers.c.id).limit(limit)
    if state == "stuck":
        query = query.where(timers.c.stuck.is_(True), timers.c.state.in_(LIVE))
    else:
        query = query.where(timers.c.state == state)
    async with deps.db.read() as conn:
        return rows((await conn.execute(query)).all())

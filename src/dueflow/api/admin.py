"""The operators' JSON routes under ``/api/admin``: users, overdue and stuck timers, a timer run
now, the summary and the payment discrepancies (the refund routes are in
:mod:`dueflow.api.refunds`, the pages in :mod:`dueflow.api.admin_pages`)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from dueflow.api import auth, idempotency
from dueflow.api import schemas as out
from dueflow.api.common import WITH_BODY, WITH_PARAMS, Body, Id, Limit, answer, resource
from dueflow.api.lists import NEXT_DESCRIPTION, After, PageLimit
from dueflow.api.schemas import View, errors
from dueflow.error_codes import ErrorCode
from dueflow.service import accounts, lists, operations
from dueflow.service.deps import Deps


class NewUser(Body):
    """A user to create; its token is shown once in the answer."""

    name: out.SingleLine = Field(min_length=1, max_length=64)
    admin: bool = False


class UserCreated(View):
    """The new user; the token is shown only here."""

    id: int
    name: str
    admin: bool
    token: str


class UserView(View):
    """A user as admins list them (never the token)."""

    id: int
    name: str
    admin: bool
    created_at: datetime


class UserPage(View):
    """A page of users, newest first."""

    items: list[UserView]
    next: str | None = Field(description=NEXT_DESCRIPTION)


class DiscrepancyView(View):
    """A payment that did not match its order, as recorded."""

    id: int
    kind: str
    order_id: int
    payment_id: int
    detail: str
    created_at: datetime


class LatenessView(View):
    """Seconds from deadline to firing of one kind's timers done in the last hour."""

    kind: str
    count: int
    p50: float
    p99: float
    max: float


class InvariantsView(View):
    """The promises checked against the database; each list names its offenders."""

    ok: bool
    held_by_dead_order: list[int]
    past_deadline: list[int]
    reminders_twice: list[int]
    reviews_twice: list[int]
    goods_held_twice: list[int]
    seats_held_by_dead_order: list[int] = Field(description="orders")
    seats_held_twice: list[int] = Field(description="seat ids")
    seat_limits_broken: list[int] = Field(description="shows")
    units_unbalanced: list[int] = Field(description="SKUs")
    units_held_by_dead_order: list[int] = Field(description="SKUs")
    units_sold_unpaid: list[int] = Field(description="SKUs")
    flash_units_unbalanced: list[int] = Field(description="flash sales")
    flash_units_held_by_dead_order: list[int] = Field(description="flash sales")
    flash_units_sold_unpaid: list[int] = Field(description="flash sales")
    flash_limits_broken: list[int] = Field(description="flash sales")
    coupons_locked_by_dead_order: list[int] = Field(description="coupons")
    coupons_used_by_unpaid_order: list[int] = Field(description="coupons")
    coupons_used_twice: list[int] = Field(description="coupons")
    coupons_not_with_their_order: list[int] = Field(description="orders")
    cancels_not_notified: list[int] = Field(description="orders")


class Summary(View):
    """The system at one instant, for the dashboard."""

    at: datetime
    orders: dict[str, int] = Field(description="orders by status")
    timers: dict[str, int] = Field(description="timers by state")
    overdue: int
    stuck: int
    refunds: dict[str, int] = Field(description="refunds by state")
    discrepancies: int
    lateness_last_hour: list[LatenessView]
    invariants: InvariantsView


def router(deps: Deps) -> APIRouter:
    """The ``/api/admin`` routes over ``deps``, for admins only."""
    routes = resource("/api/admin", auth.current_admin(deps), [ErrorCode.NOT_ALLOWED], tag="admin")
    keyed = idempotency.idempotent(deps)

    @routes.post(
        "/users", status_code=201, response_model=UserCreated, responses=errors(*WITH_BODY)
    )
    @keyed
    async def add_user(body: NewUser) -> JSONResponse:
        """Create a user; the token is shown only here."""
        user, token = await accounts.add_user(deps, body.name, admin=body.admin)
        return answer(
            {"id": user.id, "name": user.name, "admin": user.is_admin, "token": token}, 201
        )

    @routes.get("/users", response_model=UserPage, responses=errors(*WITH_PARAMS))
    async def list_users(
        after: After = None, limit: PageLimit = lists.DEFAULT_LIMIT
    ) -> JSONResponse:
        """The users, newest first, a page at a time (as every list: pass ``next`` back as
        ``after``)."""
        page = await lists.users_list(deps, after=after, limit=limit)
        return answer({"items": page.items, "next": page.next})

    @routes.get("/overdue", response_model=list[out.OverdueTimer], responses=errors(*WITH_PARAMS))
    async def overdue(limit: Limit = 100) -> JSONResponse:
        """Live timers past due by more than the scan grace, oldest first, with their order's
        status."""
        return answer(await operations.overdue_timers(deps, limit))

    @routes.get("/timers", response_model=list[out.TimerView], responses=errors(*WITH_PARAMS))
    async def timers(
        state: Literal["stuck", "scheduled", "claimed", "done", "cancelled", "parked"] = "stuck",
        limit: Limit = 100,
    ) -> JSONResponse:
        """Timers in one state; ``stuck`` means live timers flagged stuck."""
        return answer(await operations.timers_in_state(deps, state, limit))

    @routes.post(
        "/timers/{timer_id}/run-now",
        response_model=out.TimerView,
        responses=errors(*WITH_PARAMS, ErrorCode.NOT_FOUND, ErrorCode.TIMER_NOT_WAITING),
    )
    @keyed
    async def run_now(timer_id: Id, request: Request) -> JSONResponse:
        """Make a waiting, stuck or parked timer due now (409 when a worker holds it or it is
        over)."""
        actor = auth.actor(request)
        return answer(await operations.run_timer_now(deps, timer_id, actor=actor))

    @routes.get("/summary", response_model=Summary)
    async def summary() -> JSONResponse:
        """Orders by status, timers by state, overdue and stuck timers, refunds by state,
        discrepancies, timer lateness over the last hour by kind, and the invariants."""
        return answer(await operations.summary(deps))

    @routes.get(
        "/discrepancies", response_model=list[DiscrepancyView], responses=errors(*WITH_PARAMS)
    )
    async def discrepancies(limit: Limit = 100) -> JSONResponse:
        """Recorded payment discrepancies, newest first."""
        return answer(await operations.discrepancies(deps, limit))

    return routes

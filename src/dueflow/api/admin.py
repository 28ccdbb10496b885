"""The operators' JSON routes under ``/api/admin``: users, overdue and stuck timers, a timer run
now, the summary and the payment discrepancies (the refund routes are in
:mod:`dueflow.api.refunds`, the pages in :mod:`dueflow.api.admin_pages`)."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from dueflow.api import auth
from dueflow.api import schemas as out
from dueflow.api.common import Body, Id, Limit, answer
from dueflow.api.schemas import errors
from dueflow.service import accounts, operations
from dueflow.service.deps import Deps


class NewUser(Body):
    """A user to create; its token is shown once in the answer."""

    name: out.SingleLine = Field(min_length=1, max_length=64)
    admin: bool = False


def router(deps: Deps) -> APIRouter:
    """The ``/api/admin`` routes over ``deps``, for admins only."""
    routes = APIRouter(
        prefix="/api/admin",
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

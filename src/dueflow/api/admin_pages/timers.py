"""Timers by state (``/admin/timers``), and a timer made due now."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from dueflow.api.admin_pages.site import Pages, checked_id
from dueflow.service import operations
from dueflow.service.accounts import User


def add_routes(routes: APIRouter, pages: Pages) -> None:
    """``/admin/timers`` and the run-now action on the admin router."""
    deps = pages.deps

    @routes.get("/timers", response_class=HTMLResponse)
    async def timer_list(request: Request, state: str = "stuck") -> Response:
        async def render(user: User) -> Response:
            if state not in operations.TIMER_STATES:
                return pages.problem(
                    request, user, 422, "Bad filter", f"unknown timer state {state!r}"
                )
            found = await operations.timers_in_state(deps, state, 200)
            return pages.page(
                request,
                "timers.html",
                user=user,
                timers=found,
                state=state,
                states=operations.TIMER_STATES,
                refresh=5,
            )

        return await pages.signed_in(request, render)

    @routes.post("/timers/{timer_id}/run-now")
    async def run_now(request: Request, timer_id: int) -> Response:
        async def go(actor: str) -> str:
            await operations.run_timer_now(deps, checked_id(timer_id), actor=actor)
            return f"Timer {timer_id} is due now."

        return await pages.act(request, go)

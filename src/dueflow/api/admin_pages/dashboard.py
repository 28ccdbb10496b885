"""The dashboard (``/admin``): the system at one instant, refreshed every few seconds."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from dueflow.api.admin_pages.site import Pages
from dueflow.service import operations, refunds, report, webhooks
from dueflow.service.accounts import User


def add_routes(routes: APIRouter, pages: Pages) -> None:
    """``/admin`` on the admin router."""
    deps = pages.deps

    @routes.get("", response_class=HTMLResponse)
    async def dashboard(request: Request) -> Response:
        async def render(user: User) -> Response:
            snap = await report.snapshot(deps)
            return pages.page(
                request,
                "dashboard.html",
                user=user,
                snap=snap,
                lateness=await operations.lateness(deps),
                overdue=await operations.overdue_timers(deps, 20),
                stuck=await operations.timers_in_state(deps, "stuck", 20),
                parked=await operations.timers_in_state(deps, "parked", 20),
                discrepancies=await operations.discrepancies(deps, 10),
                invariants=await report.check_invariants(deps),
                events=await webhooks.delivery_status(deps),
                seats=await report.seats_taken(deps),
                processing=await refunds.list_refunds(deps, state="processing", limit=10),
                refresh=5,
            )

        return await pages.signed_in(request, render)

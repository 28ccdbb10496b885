"""The dashboard (``/admin``): the system at one instant, refreshed every few seconds, with what
needs a person and the invariants over the latest changes; the full check (``/admin/invariants``)
on demand."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from dueflow.api.admin_pages.site import Pages
from dueflow.service import attention, invariants, operations, refunds, report, webhooks
from dueflow.service.accounts import User


def add_routes(routes: APIRouter, pages: Pages) -> None:
    """``/admin`` and ``/admin/invariants`` on the admin router."""
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
                attention=await attention.needs_attention(deps, 20),
                lateness=await operations.lateness(deps),
                overdue=await operations.overdue_timers(deps, 20),
                stuck=await operations.timers_in_state(deps, "stuck", 20),
                discrepancies=await operations.discrepancies(deps, 10),
                checked=await invariants.check_recent(deps),
                events=await webhooks.delivery_status(deps),
                seats=await report.seats_taken(deps),
                processing=await refunds.list_refunds(deps, state="processing", limit=10),
                refresh=5,
            )

        return await pages.signed_in(request, render)

    @routes.get("/invariants", response_class=HTMLResponse)
    async def full_check(request: Request) -> Response:
        async def render(user: User) -> Response:
            started = time.perf_counter()
            checked = await invariants.check_full(deps)
            return pages.page(
                request,
                "invariants.html",
                user=user,
                checked=checked,
                seconds=time.perf_counter() - started,
            )

        return await pages.signed_in(request, render)

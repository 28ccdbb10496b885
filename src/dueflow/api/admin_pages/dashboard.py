"""The dashboard (``/admin``): the system at one instant, refreshed every few seconds, with what
needs a person and the invariants over the latest changes; the full check (``/admin/invariants``)
on demand."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from dueflow.api.admin_pages.site import Pages
from dueflow.service import (
    attention,
    invariants,
    operations,
    reads,
    refunds,
    report,
    webhooks,
)
from dueflow.service.accounts import User
from dueflow.service.deps import Deps


def add_routes(routes: APIRouter, pages: Pages) -> None:
    """``/admin`` and ``/admin/invariants`` on the admin router."""
    deps = pages.deps

    @routes.get("", response_class=HTMLResponse)
    async def dashboard(request: Request) -> Response:
        async def render(user: User) -> Response:
            return pages.page(request, "dashboard.html", user=user, **await _read(deps))

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


async def _read(deps: Deps) -> dict[str, Any]:
    """What the dashboard shows, read side by side on PostgreSQL and MariaDB: its longest read
    sets its time, not the sum of them; within one page's :data:`reads.WIDTH` connections
    (docs/benchmarks.md, "The dashboard over a million orders")."""
    lanes = reads.lanes()
    lists = reads.together(
        deps,
        lambda: attention.needs_attention(deps, 20),
        lambda: operations.lateness(deps),
        lambda: operations.overdue_timers(deps, 20),
        lambda: operations.timers_in_state(deps, "stuck", 20),
        lambda: operations.discrepancies(deps, 10),
        lambda: webhooks.delivery_status(deps),
        lambda: report.seats_taken(deps),
        lambda: refunds.list_refunds(deps, state="processing", limit=10),
        lanes=lanes,
    )
    if reads.side_by_side(deps):
        snap, checked, found = await asyncio.gather(
            report.snapshot(deps, lanes=lanes), invariants.check_recent(deps, lanes=lanes), lists
        )
    else:
        snap, checked, found = (
            await report.snapshot(deps),
            await invariants.check_recent(deps),
            await lists,
        )
    waiting, lateness, overdue, stuck, discrepancies, events, seats, processing = found
    return {
        "snap": snap,
        "attention": waiting,
        "lateness": lateness,
        "overdue": overdue,
        "stuck": stuck,
        "discrepancies": discrepancies,
        "checked": checked,
        "events": events,
        "seats": seats,
        "processing": processing,
        "refresh": 5,
    }

"""The refund queue (``/admin/refunds``) and what an operator does to a refund: approve,
retry, reject with a reason, record it settled off-line with a reference."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from dueflow.api.admin_pages.site import Pages, checked_id
from dueflow.exceptions import InvalidInput
from dueflow.service import refunds, report
from dueflow.service.accounts import User
from dueflow.service.deps import Deps


class Submit(Protocol):
    """An operator's move that submits a refund to its provider (approve, retry)."""

    def __call__(self, deps: Deps, refund_id: int, *, actor: str) -> Awaitable[str]:
        """Submit the refund; its state afterwards."""


def add_routes(routes: APIRouter, pages: Pages) -> None:
    """``/admin/refunds`` and the refund actions on the admin router."""
    deps = pages.deps

    @routes.get("/refunds", response_class=HTMLResponse)
    async def refund_queue(request: Request, state: str = "") -> Response:
        async def render(user: User) -> Response:
            try:
                found = await refunds.list_refunds(deps, state=state or None, limit=200)
            except InvalidInput as exc:
                return pages.problem(request, user, 422, "Bad filter", exc.message)
            counts = await report.refund_counts(deps)
            return pages.page(
                request,
                "refunds.html",
                user=user,
                refunds=found,
                state=state,
                states=refunds.STATES,
                counts=counts,
                refresh=3,
            )

        return await pages.signed_in(request, render)

    async def submitted(request: Request, refund_id: int, submit: Submit, done: str) -> Response:
        """The refund submitted by ``submit`` (approve, retry) for a checked POST; the flash
        says ``done`` and the refund's state now."""

        async def go(actor: str) -> str:
            state = await submit(deps, checked_id(refund_id), actor=actor)
            return f"Refund {refund_id} {done}: now {state}."

        return await pages.act(request, go)

    @routes.post("/refunds/{refund_id}/approve")
    async def approve(request: Request, refund_id: int) -> Response:
        return await submitted(request, refund_id, refunds.approve, "approved and submitted")

    @routes.post("/refunds/{refund_id}/retry")
    async def retry(request: Request, refund_id: int) -> Response:
        return await submitted(request, refund_id, refunds.retry, "submitted again")

    @routes.post("/refunds/{refund_id}/reject")
    async def reject(request: Request, refund_id: int) -> Response:
        async def go(actor: str, form: dict[str, str]) -> str:
            reason = form.get("reason", "")
            state = await refunds.reject(deps, checked_id(refund_id), reason=reason, actor=actor)
            return f"Refund {refund_id} {state}: {reason.strip()}."

        return await pages.act_on_form(request, go)

    @routes.post("/refunds/{refund_id}/settle-offline")
    async def settle_offline(request: Request, refund_id: int) -> Response:
        async def go(actor: str, form: dict[str, str]) -> str:
            reference = form.get("reference", "")
            state = await refunds.settle_offline(
                deps, checked_id(refund_id), reference=reference, actor=actor
            )
            return f"Refund {refund_id} {state.replace('_', ' ')}: {reference.strip()}."

        return await pages.act_on_form(request, go)

"""The webhook endpoints (``/admin/webhooks``): each with its URL, event-type filter, state and
where its deliveries stand; make one (its secret shown on the answer to that form only), enable
or disable it, rotate its secret (the new one shown the same way), replay a range of events to
it, delete it (:mod:`dueflow.service.webhook_endpoints`).

A secret is never in a redirect, a flash cookie or a log: the form that makes it is answered by
a page of its own (``Cache-Control: no-store``, not redrawn). A refused form (a bad URL or range,
an endpoint deleted meanwhile) is answered by the list with its status (422, 404) and the
reason, the make form filled in again; nothing changes.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from dueflow.api import errors
from dueflow.api.admin_pages.site import Pages, id_of, seq_range
from dueflow.exceptions import DomainError, InvalidInput, NotFound
from dueflow.service import webhook_endpoints
from dueflow.service.accounts import User
from dueflow.service.deps import Deps

#: Endpoints on the page, newest first (one API page at most).
LISTED = 100


async def newest(deps: Deps, limit: int) -> list[dict[str, Any]]:
    """The newest ``limit`` endpoints, each with where its deliveries stand."""
    return (await webhook_endpoints.page(deps, after=None, limit=limit)).items


def _endpoint(raw: str) -> int:
    found = id_of(raw)
    if found is None:
        raise NotFound(f"no webhook endpoint {raw}")
    return found


def _types(raw: str) -> list[str]:
    """Event types as typed: separated by spaces or commas; none for every event."""
    return [name for name in re.split(r"[\s,]+", raw) if name]


def add_routes(routes: APIRouter, pages: Pages) -> None:
    """``/admin/webhooks`` and the endpoints' actions on the admin router."""
    deps = pages.deps

    @routes.get("/webhooks", response_class=HTMLResponse)
    async def endpoint_list(request: Request) -> Response:
        return await pages.listing(request, "webhooks.html", "endpoints", newest, LISTED)

    async def refused(
        request: Request, user: User, form: dict[str, str], exc: DomainError
    ) -> Response:
        """The list again with the refusal, its status, and what the make form held."""
        return pages.page(
            request,
            "webhooks.html",
            status=errors.status_of(exc),
            user=user,
            endpoints=await newest(deps, LISTED),
            limit=LISTED,
            error=f"Refused: {exc.message}",
            typed=form if "url" in form else {},
        )

    def secret_page(request: Request, user: User, made: dict[str, Any], what: str) -> Response:
        return pages.page(request, "webhook_secret.html", user=user, endpoint=made, what=what)

    @routes.post("/webhooks", response_class=HTMLResponse)
    async def make_endpoint(request: Request) -> Response:
        async def answer(user: User, form: dict[str, str]) -> Response:
            made = await webhook_endpoints.create(
                deps,
                url=form.get("url", "").strip(),
                event_types=_types(form.get("types", "")),
                description=form.get("description", "").strip() or None,
                actor=f"user:{user.id}",
            )
            return secret_page(request, user, made, "made")

        return await pages.answer_form(request, answer, refused)

    @routes.post("/webhooks/{endpoint_id}/rotate", response_class=HTMLResponse)
    async def rotate_secret(request: Request, endpoint_id: str) -> Response:
        async def answer(user: User, form: dict[str, str]) -> Response:
            keep = form.get("keep_old_for", "86400").strip()
            if not keep.isdigit() or len(keep) > 9:
                raise InvalidInput("keep_old_for: seconds, from 0 to 7 days")
            rotated = await webhook_endpoints.rotate(
                deps,
                _endpoint(endpoint_id),
                keep_old_for=timedelta(seconds=int(keep)),
                actor=f"user:{user.id}",
            )
            return secret_page(request, user, rotated, "given a new secret")

        return await pages.answer_form(request, answer, refused)

    async def switched(request: Request, endpoint_id: str, enabled: bool) -> Response:
        async def go(actor: str, _: dict[str, str]) -> str:
            changes = {"enabled": enabled}
            await webhook_endpoints.update(
                deps, _endpoint(endpoint_id), changes=changes, actor=actor
            )
            return f"Webhook endpoint {endpoint_id} {'enabled' if enabled else 'disabled'}."

        return await pages.act_on_form(request, go, refused)

    @routes.post("/webhooks/{endpoint_id}/enable")
    async def enable(request: Request, endpoint_id: str) -> Response:
        return await switched(request, endpoint_id, True)

    @routes.post("/webhooks/{endpoint_id}/disable")
    async def disable(request: Request, endpoint_id: str) -> Response:
        return await switched(request, endpoint_id, False)

    @routes.post("/webhooks/{endpoint_id}/replay")
    async def replay(request: Request, endpoint_id: str) -> Response:
        async def go(actor: str, form: dict[str, str]) -> str:
            first, last = seq_range(form)
            told = await webhook_endpoints.replay(
                deps, _endpoint(endpoint_id), first=first, last=last, actor=actor
            )
            return f"Webhook endpoint {endpoint_id}: {told}."

        return await pages.act_on_form(request, go, refused)

    @routes.post("/webhooks/{endpoint_id}/delete")
    async def delete(request: Request, endpoint_id: str) -> Response:
        async def go(actor: str, _: dict[str, str]) -> str:
            await webhook_endpoints.delete(deps, _endpoint(endpoint_id), actor=actor)
            return f"Webhook endpoint {endpoint_id} deleted."

        return await pages.act_on_form(request, go, refused)

"""The events feed's webhook: replay a run of events, or skip the one it waits on."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from dueflow.api.admin_pages.site import Pages, id_of, seq_range
from dueflow.exceptions import InvalidInput
from dueflow.service import webhooks


def add_routes(routes: APIRouter, pages: Pages) -> None:
    """The replay and skip actions on the admin router."""
    deps = pages.deps

    @routes.post("/events/replay")
    async def replay_events(request: Request) -> Response:
        async def go(actor: str, form: dict[str, str]) -> str:
            first, last = seq_range(form)
            return await webhooks.replay(deps, first=first, last=last, actor=actor)

        return await pages.act_on_form(request, go)

    @routes.post("/events/skip")
    async def skip_event(request: Request) -> Response:
        async def go(actor: str, form: dict[str, str]) -> str:
            seq = id_of(form.get("seq", "").strip())
            if seq is None:
                raise InvalidInput("a skip takes the seq of the event the webhook waits on")
            return await webhooks.skip(deps, seq=seq, actor=actor)

        return await pages.act_on_form(request, go)

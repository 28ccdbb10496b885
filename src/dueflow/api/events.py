"""``GET /api/events``: the order events feed, in commit order, resumable from any cursor.

An admin reads every event; anyone else the events of the orders they buy or sell. The cursor
is opaque (the position after the last event read, base64url); ``next`` is always given, so a
reader that stores it and asks again from there sees each event exactly once.
"""

from __future__ import annotations

import base64
import binascii
import re
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from dueflow.api import auth
from dueflow.api.common import answer, resource
from dueflow.api.schemas import View
from dueflow.exceptions import InvalidInput
from dueflow.service import events
from dueflow.service.deps import Deps

MAX_SEQ = 2**63 - 1
DEFAULT_LIMIT = 100
MAX_LIMIT = 500
_POSITION = re.compile(r"e(0|[1-9][0-9]{0,18})")


class FeedEvent(View):
    """One order event."""

    id: str = Field(
        examples=["evt_42"], description="the delivery id (also the webhook's X-Dueflow-Delivery)"
    )
    seq: int = Field(description="the position in commit order (1, 2, ...)")
    order_id: int
    event: str = Field(examples=["pay"])
    actor: str = Field(examples=["user:7"])
    at: datetime
    from_status: str | None
    to_status: str | None
    detail: str | None


class EventPage(View):
    """A page of the feed and where to go on from."""

    events: list[FeedEvent]
    next: str = Field(description="the cursor to pass as ``after`` next (also on an empty page)")


def cursor_of(seq: int) -> str:
    """The opaque cursor of the position after event ``seq``."""
    return base64.urlsafe_b64encode(f"e{seq}".encode()).decode().rstrip("=")


def position_of(cursor: str | None) -> int:
    """The seq a cursor stands after (0: from the start).

    Raises:
        InvalidInput: not a cursor this feed gave.
    """
    if cursor is None:
        return 0
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raw = ""
    found = _POSITION.fullmatch(raw)
    if found is None or int(found.group(1)) > MAX_SEQ or cursor_of(int(found.group(1))) != cursor:
        raise InvalidInput("after: not a cursor of this feed (pass back a `next` it gave)")
    return int(found.group(1))


Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT, description="at most this many events")]
After = Annotated[
    str | None, Query(max_length=64, description="a `next` from an earlier page; none: the start")
]


def router(deps: Deps) -> APIRouter:
    """The feed's route over ``deps``."""
    routes = resource(
        "/api/events", auth.current_user(deps, "events"), [401, 413, 422, 503], tag="events"
    )

    @routes.get("", response_model=EventPage)
    async def feed(
        request: Request, after: After = None, limit: Limit = DEFAULT_LIMIT
    ) -> JSONResponse:
        """Order events after the cursor, oldest first (the order they committed in): every
        event for an admin, the events of the caller's orders (as buyer or seller) otherwise."""
        user = auth.caller(request)
        position = position_of(after)
        found, last = await events.feed_page(
            deps, after=position, limit=limit, user_id=None if user.is_admin else user.id
        )
        return answer({"events": found, "next": cursor_of(last)})

    return routes

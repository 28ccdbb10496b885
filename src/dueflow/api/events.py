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
from typing import Annotated, Any, Literal

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from dueflow.api import auth
from dueflow.api.common import FOR_A_USER, WITH_PARAMS, answer, resource
from dueflow.api.schemas import (
    LineView,
    OrderListItem,
    PaymentView,
    RefundView,
    TicketView,
    View,
    errors,
)
from dueflow.domain.events import EventType
from dueflow.exceptions import InvalidInput
from dueflow.service import events
from dueflow.service.deps import Deps

MAX_SEQ = 2**63 - 1
DEFAULT_LIMIT = 100
MAX_LIMIT = 500
_POSITION = re.compile(r"e(0|[1-9][0-9]{0,18})")


class UserActor(View):
    """A user did it (``user:<id>``), through a service key acting for them when ``key_id``
    is given (``user:<id>@key:<key id>``)."""

    type: Literal["user"]
    user_id: int
    key_id: int | None = Field(description="the service key that acted for the user; null: none")


class KeyActor(View):
    """A service key did it acting for nobody (``key:<key id>``: an admin route called by a
    key without ``Dueflow-Act-As``)."""

    type: Literal["key"]
    key_id: int


class OperatorActor(View):
    """An operator did it (the admin pages, the CLI's operator commands)."""

    type: Literal["operator"]
    name: str = Field(examples=["operator"])


class SystemActor(View):
    """dueflow did it: a deadline's timer (``timer``), a payment provider's notification
    (``alipay``, ``wechatpay``, ``manual``, ``simulator``), a trade's close or query
    (``close_or_query``), the command line (``cli``), the notifier (``notifier``)."""

    type: Literal["system"]
    name: str = Field(examples=["timer"])


Actor = Annotated[UserActor | KeyActor | OperatorActor | SystemActor, Field(discriminator="type")]


class OrderSnapshot(OrderListItem):
    """The order after the event, as ``GET /api/orders/{id}`` shows it: its fields, what it
    holds, its deadlines, payments and refunds."""

    lines: list[LineView]
    tickets: list[TicketView]
    payments: list[PaymentView]
    refunds: list[RefundView]


class Envelope(View):
    """An order event (the feed, the events webhook) or a buyer notice (the notifier's
    webhook): docs/events.md."""

    id: str = Field(
        examples=["evt_42"],
        description="evt_<seq> for an event (seq: its position in commit order), ntc_<id> for a "
        "notice; the same on every retry and replay: drop repeats by it",
    )
    type: EventType
    version: Literal[1] = Field(description="the envelope's version")
    created_at: datetime
    actor: Actor
    data: dict[str, Any] = Field(description="what is particular to the type (docs/events.md)")
    order: OrderSnapshot | None = Field(
        description="the order after the event; null only on events written before the "
        "envelope existed"
    )


#: The feed's events (the name the feed's answer always had).
FeedEvent = Envelope


class EventPage(View):
    """A page of the feed and where to go on from."""

    events: list[Envelope]
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
        raise InvalidInput(
            "after: not a cursor of this feed (pass back a `next` it gave)", field="after"
        )
    return int(found.group(1))


Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT, description="at most this many events")]
After = Annotated[
    str | None, Query(max_length=64, description="a `next` from an earlier page; none: the start")
]


def router(deps: Deps) -> APIRouter:
    """The feed's route over ``deps``."""
    routes = resource("/api/events", auth.current_user(deps, "events"), FOR_A_USER, tag="events")

    @routes.get("", response_model=EventPage, responses=errors(*WITH_PARAMS))
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


def webhooks(app: FastAPI) -> None:
    """The OpenAPI document's ``webhooks``: what dueflow POSTs to the host (each body an
    :class:`Envelope`)."""

    # An answer of the host's own, not FastAPI's 422 of a route that reads a body.
    other = "any other answer: not received"

    @app.webhooks.post(
        "order-event", responses={"default": {"description": f"{other}; sent again later"}}
    )
    def order_event(body: Envelope) -> None:
        """Each order event, in commit order, to ``DUEFLOW_EVENTS_WEBHOOK_URL`` (retried until
        a 2xx; drop repeats by ``id``): the feed's envelope."""

    @app.webhooks.post(
        "buyer-notice", responses={"default": {"description": f"{other}; a 5xx is tried again"}}
    )
    def buyer_notice(body: Envelope) -> None:
        """A buyer notice (``type`` ``pay_reminder`` or ``order_closed``) to the notifier's
        webhook (``DUEFLOW_NOTIFIER=webhook``); drop repeats by ``id``."""

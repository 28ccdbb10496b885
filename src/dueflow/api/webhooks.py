"""``/api/admin/webhooks``: the webhook endpoints (admins only): make one (its secret shown in
that answer only), list them by cursor with where their deliveries stand, show one, change its
URL, filter, state or description, rotate its secret, delete it, and replay events to it
(:mod:`dueflow.service.webhook_endpoints`)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from dueflow.api import auth, idempotency
from dueflow.api.common import MAX_ID, WITH_BODY, WITH_PARAMS, Body, Id, answer, resource
from dueflow.api.schemas import View, errors
from dueflow.domain.events import EventType
from dueflow.error_codes import ErrorCode
from dueflow.service import lists, webhook_endpoints
from dueflow.service.deps import Deps

#: The body's JSON strings taken as the enum's values (the bodies are strict otherwise).
FilterType = Annotated[EventType, Field(strict=False)]
EventTypes = Annotated[
    list[FilterType] | None,
    Field(
        max_length=webhook_endpoints.MAX_TYPES,
        description="the order event types sent (none: all); a buyer notice's type "
        "(pay_reminder, order_closed) is refused: the notifier sends those",
    ),
]
Url = Annotated[str, Field(min_length=1, max_length=2000, examples=["https://host.example/hooks"])]
Description = Annotated[str | None, Field(max_length=webhook_endpoints.MAX_DESCRIPTION)]


class NewEndpoint(Body):
    """An endpoint to make; its secret is in the answer only."""

    url: Url
    event_types: EventTypes = None
    description: Description = None


class EndpointChange(Body):
    """What to change on an endpoint (only the fields given)."""

    url: Url | None = None
    event_types: EventTypes = None
    enabled: bool | None = None
    description: Description = None


class Rotation(Body):
    """How long the old secret keeps signing beside the new one."""

    keep_old_for_seconds: int = Field(default=86_400, ge=0, le=7 * 86_400)


class Replay(Body):
    """The events to deliver again (by seq): ``first`` alone, or ``first`` to ``last``."""

    first: int = Field(ge=1, le=MAX_ID)
    last: int | None = Field(default=None, ge=1, le=MAX_ID)


class DeliveryState(View):
    """Where an endpoint's deliveries stand."""

    delivered_seq: int = Field(description="every event of its types up to this seq is delivered")
    backlog: int = Field(description="events of its types not delivered yet")
    failures: int = Field(description="failed tries of the next event in a row")
    retry_at: datetime | None
    last_error: str | None
    last_error_at: datetime | None
    replays: int = Field(description="replays not done yet")


class EndpointView(View):
    """A webhook endpoint (never its secret)."""

    id: int
    url: str
    event_types: list[str] | None = Field(description="null: every event")
    enabled: bool
    description: str | None
    created_by: str
    created_at: datetime
    updated_at: datetime
    previous_secret_until: datetime | None = Field(
        description="after a rotation: until when the old secret signs too"
    )


class EndpointStatus(EndpointView):
    """An endpoint and where its deliveries stand."""

    status: DeliveryState


class EndpointSecret(EndpointView):
    """An endpoint with its secret: shown in this answer only."""

    secret: str | None = Field(
        description="shown in this answer only: null on a repeat of the request under its "
        "Idempotency-Key (the secret is not stored with the answer)",
        examples=["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
    )


class EndpointPage(View):
    """A page of endpoints, newest first."""

    items: list[EndpointStatus]
    next: str | None = Field(description="the cursor of the next page; null on the last")


class Queued(View):
    """What was done."""

    message: str


After = Annotated[str | None, Query(min_length=1, max_length=400, pattern=r"^[A-Za-z0-9_-]+$")]
PageLimit = Annotated[int, Query(ge=1, le=lists.MAX_LIMIT)]


def router(deps: Deps) -> APIRouter:
    """The ``/api/admin/webhooks`` routes over ``deps``, for admins only."""
    routes = resource(
        "/api/admin/webhooks", auth.current_admin(deps), [ErrorCode.NOT_ALLOWED], tag="webhooks"
    )
    keyed = idempotency.idempotent(deps)
    withheld = idempotency.idempotent(deps, withheld=("secret",))
    one = (*WITH_PARAMS, ErrorCode.NOT_FOUND)
    unsafe = ErrorCode.UNSAFE_WEBHOOK_URL

    @routes.post(
        "", status_code=201, response_model=EndpointSecret, responses=errors(*WITH_BODY, unsafe)
    )
    @withheld
    async def create_endpoint(body: NewEndpoint, request: Request) -> JSONResponse:
        """Make an endpoint; its ``whsec_`` secret is shown only here. A URL that is not
        http(s), or whose host is or resolves to a private, loopback, link-local or reserved
        address, is refused (422 ``unsafe_webhook_url``) unless the deployment allows them."""
        made = await webhook_endpoints.create(
            deps,
            url=body.url,
            event_types=body.event_types,
            description=body.description,
            actor=auth.actor(request),
        )
        return answer(made, 201)

    @routes.get("", response_model=EndpointPage, responses=errors(*WITH_PARAMS))
    async def list_endpoints(after: After = None, limit: PageLimit = 20) -> JSONResponse:
        """Endpoints newest first with where their deliveries stand; pass ``next`` back as
        ``after`` for the next page."""
        found = await webhook_endpoints.page(deps, after=after, limit=limit)
        return answer({"items": found.items, "next": found.next})

    @routes.get("/{endpoint_id}", response_model=EndpointStatus, responses=errors(*one))
    async def show_endpoint(endpoint_id: Id) -> JSONResponse:
        """One endpoint and where its deliveries stand."""
        return answer(await webhook_endpoints.show(deps, endpoint_id))

    @routes.patch(
        "/{endpoint_id}", response_model=EndpointView, responses=errors(*one, *WITH_BODY, unsafe)
    )
    async def change_endpoint(
        endpoint_id: Id, body: EndpointChange, request: Request
    ) -> JSONResponse:
        """Change the URL (checked as at creation), the event types (null or []: every
        event), enable or disable it, or its description."""
        changes = body.model_dump(exclude_unset=True)
        return answer(
            await webhook_endpoints.update(
                deps, endpoint_id, changes=changes, actor=auth.actor(request)
            )
        )

    @routes.post(
        "/{endpoint_id}/rotate",
        response_model=EndpointSecret,
        responses=errors(*one, *WITH_BODY),
    )
    @withheld
    async def rotate_secret(endpoint_id: Id, body: Rotation, request: Request) -> JSONResponse:
        """A new secret, shown only here; the old one signs beside it for
        ``keep_old_for_seconds`` (default a day; 0: no more at once)."""
        keep = timedelta(seconds=body.keep_old_for_seconds)
        return answer(
            await webhook_endpoints.rotate(
                deps, endpoint_id, keep_old_for=keep, actor=auth.actor(request)
            )
        )

    @routes.post("/{endpoint_id}/replay", response_model=Queued, responses=errors(*one, *WITH_BODY))
    @keyed
    async def replay_events(endpoint_id: Id, body: Replay, request: Request) -> JSONResponse:
        """Deliver the events ``first`` to ``last`` (one without ``last``) again to this
        endpoint, with their ids and ``Dueflow-Replay: true``."""
        told = await webhook_endpoints.replay(
            deps, endpoint_id, first=body.first, last=body.last, actor=auth.actor(request)
        )
        return answer({"message": told})

    @routes.delete("/{endpoint_id}", response_model=Queued, responses=errors(*one))
    async def delete_endpoint(endpoint_id: Id, request: Request) -> JSONResponse:
        """Delete the endpoint and its streams (what it has not delivered is not sent)."""
        await webhook_endpoints.delete(deps, endpoint_id, actor=auth.actor(request))
        return answer({"message": f"webhook endpoint {endpoint_id} deleted"})

    return routes

"""The door of a show under ``/api/tickets``: a ticket code checked in once by its show's
organizer (their token, or a service key with the ``catalog`` scope acting for them) or an
admin. Someone else's ticket is answered as an unknown code (404): a code is a bearer secret.
The show's tickets as CSV are ``GET /api/shows/{show_id}/tickets.csv``
(:mod:`dueflow.api.shows`)."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Path, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from dueflow.api import auth, idempotency
from dueflow.api import schemas as out
from dueflow.api.common import FOR_A_USER, WITH_BODY, Body, answer, resource
from dueflow.api.schemas import View, errors
from dueflow.error_codes import ErrorCode
from dueflow.service import checkin
from dueflow.service.deps import Deps

#: The codes a check-in answers besides those of every route.
REFUSED = (
    ErrorCode.NOT_FOUND,
    ErrorCode.TICKET_CHECKED_IN,
    ErrorCode.TICKET_VOID,
    ErrorCode.BUSY,
)


class CheckIn(Body):
    """Where the ticket is checked in (optional)."""

    gate: out.SingleLine | None = Field(
        default=None, min_length=1, max_length=checkin.MAX_GATE, examples=["North 2"]
    )


class TicketAtDoor(View):
    """A ticket let in: its seat, show, order and buyer, and when and where it was checked in."""

    code: str
    show_id: int
    order_id: int
    seat: str = Field(description="the seat's label")
    buyer: str = Field(description="the buyer's name")
    state: str = Field(description="valid")
    checked_in_at: datetime
    gate: str | None


def router(deps: Deps) -> APIRouter:
    """The ``/api/tickets`` routes over ``deps``."""
    codes = [*FOR_A_USER, *REFUSED]
    api = resource("/api/tickets", auth.current_user(deps, "catalog"), codes, tag="tickets")
    keyed = idempotency.idempotent(deps)

    @api.post("/{code}/check-in", response_model=TicketAtDoor, responses=errors(*WITH_BODY))
    @keyed
    async def check_in(
        request: Request,
        code: str = Path(max_length=64, examples=["lX3h2r7Qm0yq8f6b1Zt9dA"]),
        body: CheckIn | None = None,
    ) -> JSONResponse:
        """Check the ticket in at the door (the body's ``gate``, optional): 200 with the
        ticket, when it is valid and not checked in yet; 409 ``ticket_checked_in`` when it was
        (its message says when, ISO 8601, and at which gate); 409 ``ticket_void`` when
        its show or order was cancelled; 404 for an unknown code or a ticket of a show the
        caller does not organize. Of concurrent scans of one code exactly one is valid. With an
        ``Idempotency-Key`` a repeat of a valid check-in answers that 200 again; a second scan
        without one is 409 ``ticket_checked_in``."""
        ticket = await checkin.check_in(
            deps, code, user=auth.caller(request), gate=body.gate if body else None
        )
        return answer(ticket)

    return api

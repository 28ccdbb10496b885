"""The door of a show: a ticket checked in once, by its show's organizer (or an admin), and the
show's tickets as a list for the door and a CSV.

Who may: the show's organizer, with their personal token, an admin page session of theirs
(the gate page) or a service key acting for them; and an admin, at any show. Anyone else is
answered as if the code did not exist (404): a ticket code is a bearer secret, and a 403 would
tell a stranger that a code they guessed or copied is real.

Verdicts: ``valid`` (checked in now: when, at which gate, by whom are kept on the ticket and
recorded as the order's ``ticket_checked_in`` event), :class:`~dueflow.exceptions.TicketCheckedIn`
(when and at which gate), :class:`~dueflow.exceptions.TicketVoid` (the show or the order was
cancelled), :class:`~dueflow.exceptions.NotFound`. The check-in itself is one conditional
UPDATE (:func:`dueflow.store.checkins.check_in`); of N scans of one code at once exactly one
matches it, and only a refusal reads the ticket to say why.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence
from typing import Any

from dueflow.domain import text
from dueflow.exceptions import Busy, InvalidInput, NotFound, TicketCheckedIn, TicketVoid
from dueflow.service import actors
from dueflow.service.accounts import User
from dueflow.service.deps import Deps
from dueflow.store import checkins, orders, shows

#: A ticket code as :func:`dueflow.store.shows.new_code` makes them (URL-safe base64); anything
#: else is no ticket, answered without a statement.
CODE = re.compile(r"[A-Za-z0-9_-]{1,32}")
#: The longest gate name.
MAX_GATE = 40
#: The event a check-in records on its order.
CHECKED_IN = "ticket_checked_in"
#: The CSV's columns.
CSV_COLUMNS = ("seat", "code", "buyer", "state", "checked_in_at", "gate")


def gate_of(value: str | None) -> str | None:
    """The gate's name as kept (trimmed; None when blank).

    Raises:
        InvalidInput: longer than :data:`MAX_GATE` characters, or not one line of text.
    """
    if value is None or not value.strip():
        return None
    gate = value.strip()
    if len(gate) > MAX_GATE:
        raise InvalidInput(f"a gate is at most {MAX_GATE} characters", field="gate")
    problem = text.refused_character(gate)
    if problem is not None:
        raise InvalidInput(f"gate {problem}", field="gate")
    return gate


async def check_in(deps: Deps, code: str, *, user: User, gate: str | None) -> dict[str, Any]:
    """Check the ticket ``code`` in at ``gate`` for ``user`` (its show's organizer, or an
    admin); answers the ticket (:func:`ticket_view`). One UPDATE, one read and the order's
    event when it is let in.

    Raises:
        InvalidInput: a bad gate.
        NotFound: no such ticket, or one of a show ``user`` does not organize.
        TicketVoid: its show or its order was cancelled.
        TicketCheckedIn: it was checked in already (when and at which gate).
    """
    gate = gate_of(gate)
    if CODE.fullmatch(code) is None:
        raise NotFound("no such ticket")
    now = deps.clock.now()
    actor = actors.user(user.id)
    organizer_id = None if user.is_admin else user.id
    async with deps.db.write() as conn:
        let_in = await checkins.check_in(
            conn, code, organizer_id=organizer_id, now=now, gate=gate, by=actor
        )
        ticket = await checkins.at_door(conn, code)
        if let_in and ticket is not None:
            await orders.record_events(
                conn,
                [ticket.order_id],
                event=CHECKED_IN,
                actor=actor,
                now=now,
                detail=f"ticket for seat {ticket.seat} checked in"
                + (f" at gate {gate}" if gate else ""),
                data={"show_id": ticket.show_id, "seat": ticket.seat, "code": code, "gate": gate},
            )
            return ticket_view(ticket)
    raise refusal(ticket, user)


def refusal(ticket: Any, user: User) -> Exception:
    """Why the door did not let ``ticket`` in (None: no such ticket) for ``user``."""
    if ticket is None or not (user.is_admin or ticket.organizer_id == user.id):
        return NotFound("no such ticket")
    if ticket.show_status != shows.ON_SALE:
        return TicketVoid(f"void: show {ticket.show_id} was cancelled (seat {ticket.seat})")
    if ticket.state != shows.VALID or ticket.order_status != checkins.PAID:
        return TicketVoid(f"void: order {ticket.order_id} was cancelled (seat {ticket.seat})")
    if ticket.checked_in_at is not None:
        where = f" at gate {ticket.checked_in_gate}" if ticket.checked_in_gate else ""
        return TicketCheckedIn(
            f"checked in already at {ticket.checked_in_at.isoformat()}{where} (seat {ticket.seat})",
            checked_in_at=ticket.checked_in_at,
            gate=ticket.checked_in_gate,
        )
    # Valid and not checked in, yet not matched: it changed between the two statements.
    return Busy("the ticket changed meanwhile; scan it again")


def ticket_view(ticket: Any) -> dict[str, Any]:
    """A ticket as the door answers it."""
    return {
        "code": ticket.code,
        "show_id": ticket.show_id,
        "order_id": ticket.order_id,
        "seat": ticket.seat,
        "buyer": ticket.buyer,
        "state": ticket.state,
        "checked_in_at": ticket.checked_in_at,
        "gate": ticket.checked_in_gate,
    }


async def door(deps: Deps, show_id: int, user: User) -> dict[str, Any]:
    """The show as its door sees it: its id, title, venue, status and ticket counts
    (:func:`dueflow.store.checkins.door_counts`).

    Raises:
        NotFound: no such show, or not ``user``'s (an admin's: any).
    """
    async with deps.db.read() as conn:
        show = await _own_show(conn, show_id, user)
        counts = await checkins.door_counts(conn, show_id)
    return {
        "id": show.id,
        "title": show.title,
        "venue": show.venue,
        "status": show.status,
        "starts_at": show.starts_at,
        "tickets": counts,
    }


async def show_tickets(deps: Deps, show_id: int, user: User) -> list[dict[str, Any]]:
    """Every ticket of the show in seat order (:func:`ticket_view` each), for its organizer or
    an admin.

    Raises:
        NotFound: no such show, or not ``user``'s.
    """
    async with deps.db.read() as conn:
        await _own_show(conn, show_id, user)
        return [ticket_view(t) for t in await checkins.of_show(conn, show_id)]


async def _own_show(conn: Any, show_id: int, user: User) -> Any:
    show = await shows.get(conn, show_id)
    if show is None or not (user.is_admin or show.organizer_id == user.id):
        raise NotFound(f"no show {show_id}")
    return show


def tickets_csv(tickets: Sequence[dict[str, Any]]) -> str:
    """The tickets as CSV (:data:`CSV_COLUMNS`, a header line first; times ISO 8601 UTC). A
    cell that a spreadsheet would run as a formula (``=``, ``+``, ``-``, ``@`` first: a buyer
    may name themselves so) is written after a ``'``."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(CSV_COLUMNS)
    for t in tickets:
        when = t["checked_in_at"].isoformat() if t["checked_in_at"] else ""
        writer.writerow(
            [_cell(t["seat"]), t["code"], _cell(t["buyer"]), t["state"], when, _cell(t["gate"])]
        )
    return out.getvalue()


def _cell(value: str | None) -> str:
    if not value:
        return ""
    return f"'{value}" if value[0] in "=+-@\t\r" else value

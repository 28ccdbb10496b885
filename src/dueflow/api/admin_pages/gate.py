"""A show's gate page, ``/admin/shows/{id}/gate``: phone-sized, the organizer (or an admin) types
or pastes ticket codes, one a line, and sees each verdict big: valid, checked in already (when,
at which gate), void, unknown. Also the CSV of the show's tickets,
``/admin/shows/{id}/tickets.csv``.

Who signs in: an admin with their admin session (any show); an organizer, who is no admin,
with their own personal token on the gate's sign-in form, which opens a gate session
(:func:`dueflow.service.sessions.open_gate_session`: its own cookie, ``dueflow_gate``, for
``/admin/shows`` only, signed so that it never passes for an admin session). A gate session
opens its user's own shows' gates and CSVs and nothing else of the admin pages; another show's
gate answers the not-found page, as the API answers a ticket of another show.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from dueflow.api.admin_pages.site import COOKIE, HEADERS, Pages, forbidden, id_of
from dueflow.api.shows import csv_answer
from dueflow.domain import text
from dueflow.exceptions import (
    DomainError,
    DueflowError,
    InvalidInput,
    NotFound,
    TicketCheckedIn,
    TicketVoid,
)
from dueflow.service import checkin, sessions
from dueflow.service.accounts import User

#: The gate session's cookie.
GATE_COOKIE = "dueflow_gate"
#: The most codes one form checks in.
MAX_CODES = 50


@dataclass(frozen=True)
class Verdict:
    """What the door said to one code: ``kind`` (valid, checked_in, void, unknown, refused),
    the words shown big, and the details under them."""

    code: str
    kind: str
    headline: str
    details: str


@dataclass(frozen=True)
class Signed:
    """Who is at the gate and the cookie that says so (its CSRF token is derived from it)."""

    user: User
    cookie: str
    admin: bool


async def verdict(pages: Pages, code: str, user: User, gate: str | None) -> Verdict:
    """Check ``code`` in for ``user`` and say what happened."""
    try:
        ticket = await checkin.check_in(pages.deps, code, user=user, gate=gate)
    except TicketCheckedIn as exc:
        where = f" at gate {exc.gate}" if exc.gate else ""
        when = exc.checked_in_at.strftime("%H:%M:%S")
        return Verdict(code, "checked_in", "Checked in already", f"at {when} UTC{where}")
    except TicketVoid as exc:
        return Verdict(code, "void", "Void", exc.message)
    except NotFound:
        return Verdict(code, "unknown", "Unknown code", "no ticket of this show has it")
    except DueflowError as exc:  # busy, the database away: scan it again
        return Verdict(code, "refused", "Not checked, scan again", exc.message)
    return Verdict(code, "valid", "Valid", f"seat {ticket['seat']} · {ticket['buyer']}")


def codes_of(form: dict[str, str]) -> list[str]:
    """The form's codes, one a line (blank lines skipped).

    Raises:
        InvalidInput: more than :data:`MAX_CODES`.
    """
    found = [line.strip() for line in form.get("codes", "").splitlines() if line.strip()]
    if len(found) > MAX_CODES:
        raise InvalidInput(f"at most {MAX_CODES} codes at once")
    return found


def add_routes(routes: APIRouter, pages: Pages) -> None:
    """The gate page, its sign-in and sign-out, and the tickets' CSV on the admin router."""
    deps = pages.deps

    async def signed(request: Request) -> Signed | None:
        admin = await pages.user(request)
        if admin is not None:
            return Signed(admin, request.cookies.get(COOKIE, ""), True)
        cookie = request.cookies.get(GATE_COOKIE, "")
        user = await sessions.gate_user(deps, cookie, secret=pages.secret) if cookie else None
        return Signed(user, cookie, False) if user is not None else None

    async def page(
        request: Request, show_id: int, who: Signed, status: int = 200, **context: Any
    ) -> Response:
        try:
            door = await checkin.door(deps, show_id, who.user)
        except NotFound as exc:
            return pages.problem(request, None, 404, "Not found", exc.message)
        return pages.page(
            request,
            "gate.html",
            status=status,
            user=who.user if who.admin else None,
            gate_user=who.user,
            gate_csrf=sessions.csrf_token(who.cookie, secret=pages.secret),
            door=door,
            **{"verdicts": [], "gate": "", "error": "", **context},
        )

    def sign_in(request: Request, show_id: str, status: int = 200, error: str = "") -> Response:
        return pages.page(request, "gate_login.html", status=status, show_id=show_id, error=error)

    @routes.get("/shows/{show_id}/gate", response_class=HTMLResponse)
    async def gate_page(request: Request, show_id: str) -> Response:
        who = await signed(request)
        found = id_of(show_id)
        if who is None:
            return sign_in(request, str(found or ""))
        if found is None:
            return pages.problem(request, None, 404, "Not found", f"no show {show_id}")
        return await page(request, found, who)

    @routes.post("/shows/{show_id}/gate", response_class=HTMLResponse)
    async def check_codes(request: Request, show_id: str) -> Response:
        form = await pages.form(request)
        who = await signed(request)
        token = form.get("csrf", "")
        if who is None or not sessions.csrf_ok(who.cookie, token, secret=pages.secret):
            return forbidden(pages, request)
        found = id_of(show_id)
        if found is None:
            return pages.problem(request, None, 404, "Not found", f"no show {show_id}")
        try:
            gate = checkin.gate_of(form.get("gate"))
            codes = codes_of(form)
            bad = next((c for c in codes if text.refused_character(c)), None)
            if bad is not None:
                raise InvalidInput("a code holds a character no code has")
            await checkin.door(deps, found, who.user)  # another's show: the not-found page
        except NotFound as exc:
            return pages.problem(request, None, 404, "Not found", exc.message)
        except DomainError as exc:
            return await page(request, found, who, 422, error=exc.message, gate=form.get("gate"))
        verdicts = [await verdict(pages, code, who.user, gate) for code in codes]
        return await page(request, found, who, verdicts=verdicts, gate=gate or "")

    @routes.post("/shows/{show_id}/gate/login", response_class=HTMLResponse)
    async def gate_login(request: Request, show_id: str) -> Response:
        form = await pages.form(request)
        found = id_of(show_id)
        token = form.get("token", "").strip()
        cookie = (
            await sessions.open_gate_session(deps, token, secret=pages.secret, ttl=pages.ttl)
            if token and text.refused_character(token) is None
            else None
        )
        if cookie is None or found is None:
            return sign_in(request, show_id, 401, "That is not a personal token.")
        response = RedirectResponse(f"/admin/shows/{found}/gate", status_code=303, headers=HEADERS)
        response.set_cookie(
            GATE_COOKIE,
            cookie,
            max_age=int(pages.ttl.total_seconds()),
            path="/admin/shows",
            httponly=True,
            samesite="strict",
            secure=pages.secure,
        )
        return response

    @routes.post("/shows/{show_id}/gate/logout")
    async def gate_logout(request: Request, show_id: str) -> Response:
        form = await pages.form(request)
        who = await signed(request)
        if who is None or not sessions.csrf_ok(
            who.cookie, form.get("csrf", ""), secret=pages.secret
        ):
            return forbidden(pages, request)
        found = id_of(show_id) or ""
        response = RedirectResponse(f"/admin/shows/{found}/gate", status_code=303, headers=HEADERS)
        response.delete_cookie(GATE_COOKIE, path="/admin/shows")
        return response

    @routes.get("/shows/{show_id}/tickets.csv")
    async def tickets_csv(request: Request, show_id: str) -> Response:
        who = await signed(request)
        if who is None:
            return sign_in(request, show_id)
        found = id_of(show_id)
        try:
            if found is None:
                raise NotFound(f"no show {show_id}")
            tickets = await checkin.show_tickets(deps, found, who.user)
        except NotFound as exc:
            return pages.problem(request, None, 404, "Not found", exc.message)
        return csv_answer(checkin.tickets_csv(tickets), f"show-{found}-tickets.csv")

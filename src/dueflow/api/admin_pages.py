"""The operators' web pages under ``/admin``: server-rendered (Jinja2), a signed cookie session
opened with an admin token, a CSRF token in every form.

Pages refresh their ``<main>`` every few seconds with a small script of our own
(``static/admin.js``); everything works without it, through plain links and forms that answer
with a redirect (post, redirect, get). Actions report back through a one-shot flash cookie.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from dueflow.api import errors
from dueflow.domain import text
from dueflow.domain.lifecycle import OrderStatus
from dueflow.exceptions import DomainError, DueflowError, InvalidInput, NotFound
from dueflow.service import events, operations, orders, refunds, report, sessions
from dueflow.service.accounts import User
from dueflow.service.deps import Deps

HERE = Path(__file__).parent
COOKIE = "dueflow_admin"
FLASH = "dueflow_flash"
MAX_ID = 2**63 - 1
ID = re.compile(r"[0-9]{1,19}")
#: Served with every page: no framing, no foreign scripts, styles or form targets.
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
FINAL_STATUSES = {s.value for s in OrderStatus if s.is_cancelled} | {"completed"}


class Pages:
    """The pages over ``deps``, signing sessions with ``secret``."""

    def __init__(self, deps: Deps, *, secret: bytes, ttl: timedelta, secure: bool) -> None:
        self.deps = deps
        self.secret = secret
        self.ttl = ttl
        self.secure = secure
        self.templates = Jinja2Templates(directory=HERE / "templates")
        self.templates.env.filters["when"] = _when

    async def user(self, request: Request) -> User | None:
        """The admin whose session cookie came with the request."""
        cookie = request.cookies.get(COOKIE)
        if not cookie:
            return None
        return await sessions.session_user(self.deps, cookie, secret=self.secret)

    def page(self, request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        """Render a template with the session's CSRF token and the pending flash message."""
        cookie = request.cookies.get(COOKIE, "")
        context.setdefault("user", None)
        response = self.templates.TemplateResponse(
            request,
            name,
            {
                **context,
                "csrf": sessions.csrf_token(cookie, secret=self.secret) if cookie else "",
                "flash": unquote(request.cookies.get(FLASH, "")),
                "path": request.url.path,
                "now": self.deps.clock.now(),
            },
            status_code=status,
            headers=HEADERS,
        )
        if FLASH in request.cookies:
            response.delete_cookie(FLASH, path="/admin")
        return response

    def problem(
        self, request: Request, user: User | None, status: int, title: str, message: str
    ) -> HTMLResponse:
        """The error page."""
        return self.page(
            request, "error.html", status=status, user=user, title=title, message=message
        )

    def back(self, to: str, flash: str) -> RedirectResponse:
        """Redirect (303) to an admin page, carrying a one-shot message."""
        response = RedirectResponse(_local(to), status_code=303, headers=HEADERS)
        response.set_cookie(
            FLASH,
            quote(flash[:300]),  # a cookie carries latin-1 at most
            path="/admin",
            httponly=True,
            samesite="strict",
            secure=self.secure,
        )
        return response

    async def form(self, request: Request) -> dict[str, str]:
        """The urlencoded form of a POST (the first value of each field)."""
        try:
            fields = parse_qs((await request.body()).decode("utf-8", "replace"), max_num_fields=20)
        except ValueError:  # more fields than any of our forms has: treated as an empty form
            return {}
        return {key: values[0] for key, values in fields.items()}

    async def checked(self, request: Request) -> tuple[User | None, dict[str, str]]:
        """The admin of a POST whose session and CSRF token are both good, and its form."""
        form = await self.form(request)
        cookie = request.cookies.get(COOKIE, "")
        user = await self.user(request)
        if user is None or not sessions.csrf_ok(cookie, form.get("csrf", ""), secret=self.secret):
            return None, form
        return user, form


def _local(to: str) -> str:
    """Only admin pages are redirect targets (no open redirect through ``back``)."""
    return to if to.startswith("/admin") and "//" not in to and "\\" not in to else "/admin"


def _when(value: Any) -> str:
    """A datetime as ``2026-03-01 12:00:05`` (UTC), anything else as text, None as a dash."""
    if value is None:
        return "–"
    if hasattr(value, "strftime"):
        return str(value.strftime("%Y-%m-%d %H:%M:%S"))
    return str(value)


def _id(value: str | None) -> int | None:
    if value is None or ID.fullmatch(value) is None or not 1 <= int(value) <= MAX_ID:
        return None
    return int(value)


def _refused_field(form: dict[str, str]) -> str | None:
    """The first form field holding a character no admin form takes (a control character, a
    lone surrogate, a noncharacter), with what it holds; None when every field is text."""
    for name, value in form.items():
        problem = text.refused_character(value)
        if problem is not None:
            return f"{name} {problem}"
    return None


def router(
    deps: Deps,
    *,
    secret: bytes | None = None,
    ttl: timedelta | None = None,
    secure: bool = False,
    sections: Sequence[Callable[[APIRouter, Pages], None]] = (),
) -> APIRouter:
    """The ``/admin`` pages and their static files; each of ``sections`` adds its pages (the
    shows pages: ``admin_shows.add_routes``) on the same session."""
    pages = Pages(
        deps,
        secret=secret or secrets.token_bytes(32),
        ttl=ttl or timedelta(hours=12),
        secure=secure,
    )
    routes = APIRouter(prefix="/admin", include_in_schema=False)
    _static(routes)
    _session_routes(routes, pages)
    _view_routes(routes, pages)
    _action_routes(routes, pages)
    for add_routes in sections:
        add_routes(routes, pages)
    return routes


def _static(routes: APIRouter) -> None:
    files = {
        "admin.css": "text/css; charset=utf-8",
        "admin.js": "text/javascript; charset=utf-8",
    }
    bodies = {name: (HERE / "static" / name).read_bytes() for name in files}

    @routes.get("/static/{name}")
    async def static(name: str) -> Response:
        if name not in files:
            raise NotFound(f"no file {name}")
        return Response(
            bodies[name], media_type=files[name], headers={"Cache-Control": "max-age=300"}
        )


def _login_redirect(request: Request) -> RedirectResponse:
    target = quote(
        _local(request.url.path + (f"?{request.url.query}" if request.url.query else ""))
    )
    return RedirectResponse(f"/admin/login?next={target}", status_code=303, headers=HEADERS)


def _session_routes(routes: APIRouter, pages: Pages) -> None:
    @routes.get("/login", response_class=HTMLResponse)
    async def login_form(request: Request, next: str = "/admin") -> Response:
        if await pages.user(request) is not None:
            return RedirectResponse(_local(next), status_code=303, headers=HEADERS)
        return pages.page(request, "login.html", next=_local(next), error="")

    @routes.post("/login", response_class=HTMLResponse)
    async def login(request: Request) -> Response:
        form = await pages.form(request)
        refused = _refused_field(form)
        if refused is not None:
            return pages.page(
                request, "login.html", status=422, next="/admin", error=f"Refused: {refused}."
            )
        token = form.get("token", "").strip()
        cookie = (
            await sessions.open_session(pages.deps, token, secret=pages.secret, ttl=pages.ttl)
            if token
            else None
        )
        if cookie is None:
            return pages.page(
                request,
                "login.html",
                status=401,
                next=_local(form.get("next", "/admin")),
                error="That is not an admin token.",
            )
        response = RedirectResponse(
            _local(form.get("next", "/admin")), status_code=303, headers=HEADERS
        )
        response.set_cookie(
            COOKIE,
            cookie,
            max_age=int(pages.ttl.total_seconds()),
            path="/admin",
            httponly=True,
            samesite="strict",
            secure=pages.secure,
        )
        return response

    @routes.post("/logout")
    async def logout(request: Request) -> Response:
        user, _ = await pages.checked(request)
        if user is None:
            return _forbidden(pages, request)
        response = RedirectResponse("/admin/login", status_code=303, headers=HEADERS)
        response.delete_cookie(COOKIE, path="/admin")
        return response


def _forbidden(pages: Pages, request: Request) -> HTMLResponse:
    return pages.problem(
        request,
        None,
        403,
        "Not allowed",
        "Your session has ended or the form is stale (cross-site request refused). "
        "Log in and try again.",
    )


def _view_routes(routes: APIRouter, pages: Pages) -> None:
    deps = pages.deps

    @routes.get("", response_class=HTMLResponse)
    async def dashboard(request: Request) -> Response:
        user = await pages.user(request)
        if user is None:
            return _login_redirect(request)
        snap = await report.snapshot(deps)
        return pages.page(
            request,
            "dashboard.html",
            user=user,
            snap=snap,
            lateness=await operations.lateness(deps),
            overdue=await operations.overdue_timers(deps, 20),
            stuck=await operations.timers_in_state(deps, "stuck", 20),
            parked=await operations.timers_in_state(deps, "parked", 20),
            discrepancies=await operations.discrepancies(deps, 10),
            invariants=await report.check_invariants(deps),
            events=await events.delivery_status(deps),
            seats=await report.seats_taken(deps),
            processing=await refunds.list_refunds(deps, state="processing", limit=10),
            refresh=5,
        )

    @routes.get("/orders", response_class=HTMLResponse)
    async def find_order(request: Request, id: str = "") -> Response:
        if await pages.user(request) is None:
            return _login_redirect(request)
        order_id = _id(id.strip().lstrip("#"))
        if order_id is None:
            return pages.back("/admin", f"{id!r} is not an order number")
        return RedirectResponse(f"/admin/orders/{order_id}", status_code=303, headers=HEADERS)

    @routes.get("/orders/{order_id}", response_class=HTMLResponse)
    async def order_page(request: Request, order_id: str) -> Response:
        user = await pages.user(request)
        if user is None:
            return _login_redirect(request)
        found = _id(order_id)
        try:
            if found is None:
                raise NotFound(f"no order {order_id}")
            view = await orders.order_view(deps, found)
        except NotFound as exc:
            return pages.problem(request, user, 404, "Not found", exc.message)
        live = view["status"] not in FINAL_STATUSES or any(
            t["state"] in operations.LIVE for t in view["timers"]
        )
        return pages.page(request, "order.html", user=user, order=view, refresh=2 if live else 0)

    @routes.get("/refunds", response_class=HTMLResponse)
    async def refund_queue(request: Request, state: str = "") -> Response:
        user = await pages.user(request)
        if user is None:
            return _login_redirect(request)
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

    @routes.get("/timers", response_class=HTMLResponse)
    async def timer_list(request: Request, state: str = "stuck") -> Response:
        user = await pages.user(request)
        if user is None:
            return _login_redirect(request)
        if state not in operations.TIMER_STATES:
            return pages.problem(request, user, 422, "Bad filter", f"unknown timer state {state!r}")
        found = await operations.timers_in_state(deps, state, 200)
        return pages.page(
            request,
            "timers.html",
            user=user,
            timers=found,
            state=state,
            states=operations.TIMER_STATES,
            refresh=5,
        )


def _action_routes(routes: APIRouter, pages: Pages) -> None:
    deps = pages.deps

    async def act(request: Request, action: Callable[[str], Awaitable[str]]) -> Response:
        """Run ``action(actor)`` for a checked POST; its answer (or the refusal) is the flash."""
        return await act_on_form(request, lambda actor, _: action(actor))

    async def act_on_form(
        request: Request, action: Callable[[str, dict[str, str]], Awaitable[str]]
    ) -> Response:
        """:func:`act` for an action that reads the form's fields: ``action(actor, form)``."""
        user, form = await pages.checked(request)
        if user is None:
            return _forbidden(pages, request)
        refused = _refused_field(form)
        if refused is not None:
            return pages.problem(request, user, 422, "Bad input", refused)
        back = form.get("back", "/admin")
        try:
            done = await action(f"user:{user.id}", form)
        except DomainError as exc:
            return pages.back(back, f"Refused: {exc.message}")
        except DueflowError as exc:  # busy, a provider or the database unreachable
            return pages.back(back, f"Not done, try again: {errors.public_message(exc)}")
        return pages.back(back, done)

    @routes.post("/refunds/{refund_id}/approve")
    async def approve(request: Request, refund_id: int) -> Response:
        async def go(actor: str) -> str:
            state = await refunds.approve(deps, _checked_id(refund_id), actor=actor)
            return f"Refund {refund_id} approved and submitted: now {state}."

        return await act(request, go)

    @routes.post("/refunds/{refund_id}/retry")
    async def retry(request: Request, refund_id: int) -> Response:
        async def go(actor: str) -> str:
            state = await refunds.retry(deps, _checked_id(refund_id), actor=actor)
            return f"Refund {refund_id} submitted again: now {state}."

        return await act(request, go)

    @routes.post("/refunds/{refund_id}/reject")
    async def reject(request: Request, refund_id: int) -> Response:
        async def go(actor: str, form: dict[str, str]) -> str:
            reason = form.get("reason", "")
            state = await refunds.reject(deps, _checked_id(refund_id), reason=reason, actor=actor)
            return f"Refund {refund_id} {state}: {reason.strip()}."

        return await act_on_form(request, go)

    @routes.post("/refunds/{refund_id}/settle-offline")
    async def settle_offline(request: Request, refund_id: int) -> Response:
        async def go(actor: str, form: dict[str, str]) -> str:
            reference = form.get("reference", "")
            state = await refunds.settle_offline(
                deps, _checked_id(refund_id), reference=reference, actor=actor
            )
            return f"Refund {refund_id} {state.replace('_', ' ')}: {reference.strip()}."

        return await act_on_form(request, go)

    @routes.post("/events/replay")
    async def replay_events(request: Request) -> Response:
        async def go(actor: str, form: dict[str, str]) -> str:
            first = _id(form.get("first", "").strip())
            last = _id(form.get("last", "").strip() or form.get("first", "").strip())
            if first is None or last is None:
                raise InvalidInput("a replay takes the seq of its first (and last) event")
            return await events.replay(deps, first=first, last=last, actor=actor)

        return await act_on_form(request, go)

    @routes.post("/events/skip")
    async def skip_event(request: Request) -> Response:
        async def go(actor: str, form: dict[str, str]) -> str:
            seq = _id(form.get("seq", "").strip())
            if seq is None:
                raise InvalidInput("a skip takes the seq of the event the webhook waits on")
            return await events.skip(deps, seq=seq, actor=actor)

        return await act_on_form(request, go)

    @routes.post("/timers/{timer_id}/run-now")
    async def run_now(request: Request, timer_id: int) -> Response:
        async def go(actor: str) -> str:
            await operations.run_timer_now(deps, _checked_id(timer_id), actor=actor)
            return f"Timer {timer_id} is due now."

        return await act(request, go)


def _checked_id(value: int) -> int:
    if not 1 <= value <= MAX_ID:
        raise NotFound(f"no such id {value}")
    return value

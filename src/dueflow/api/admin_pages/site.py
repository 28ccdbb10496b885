"""What every admin page shares: :class:`Pages` (the session's admin, a page only for it, one
thing's page found by the id in its path, a list page, rendering a template with
the CSRF token and the flash message, the error page, the redirect back, an action's checked
POST) and the small helpers of the areas' routes (ids from a path or a form, the login
redirect, the refusal of a stale form)."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, quote, unquote

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from dueflow.api import errors
from dueflow.domain import text
from dueflow.exceptions import DomainError, DueflowError, InvalidInput, NotFound
from dueflow.service import sessions
from dueflow.service.accounts import User
from dueflow.service.deps import Deps

#: api/: the templates and static files of every page.
HERE = Path(__file__).parents[1]
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


T = TypeVar("T")

#: A form's refusal as a page of its own: ``(request, user, form, exc)`` to the answer.
Refused = Callable[[Request, User, dict[str, str], DomainError], Awaitable[Response]]


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
        user = await sessions.session_user(self.deps, cookie, secret=self.secret)
        request.state.user = user  # whom the access log names
        return user

    async def signed_in(
        self, request: Request, render: Callable[[User], Awaitable[Response]]
    ) -> Response:
        """``render(user)`` for the session's admin; without one, the redirect to the login."""
        user = await self.user(request)
        if user is None:
            return login_redirect(request)
        return await render(user)

    async def one(
        self,
        request: Request,
        kind: str,
        raw_id: str,
        load: Callable[[int], Awaitable[T]],
        render: Callable[[User, int, T], Awaitable[Response]],
    ) -> Response:
        """The page of one ``kind`` named by the path's ``raw_id``, for the session's admin:
        ``render(user, id, load(id))``; the not-found page when ``raw_id`` is no id or ``load``
        finds nothing (raises NotFound)."""

        async def found(user: User) -> Response:
            one_id = id_of(raw_id)
            try:
                if one_id is None:
                    raise NotFound(f"no {kind} {raw_id}")
                loaded = await load(one_id)
            except NotFound as exc:
                return self.problem(request, user, 404, "Not found", exc.message)
            return await render(user, one_id, loaded)

        return await self.signed_in(request, found)

    async def listing(
        self,
        request: Request,
        name: str,
        rows: str,
        load: Callable[[Deps, int], Awaitable[list[dict[str, Any]]]],
        limit: int,
    ) -> Response:
        """A list page for the session's admin, redrawn every 5 seconds: the template ``name``
        with ``load(deps, limit)`` (the newest ``limit`` at most) as ``rows``, and ``limit``."""

        async def render(user: User) -> Response:
            found: dict[str, Any] = {rows: await load(self.deps, limit)}
            return self.page(request, name, user=user, limit=limit, refresh=5, **found)

        return await self.signed_in(request, render)

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
        response = RedirectResponse(local(to), status_code=303, headers=HEADERS)
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

    async def act(self, request: Request, action: Callable[[str], Awaitable[str]]) -> Response:
        """Run ``action(actor)`` for a checked POST; its answer (or the refusal) is the flash."""
        return await self.act_on_form(request, lambda actor, _: action(actor))

    async def act_on_form(
        self,
        request: Request,
        action: Callable[[str, dict[str, str]], Awaitable[str]],
        refused: Refused | None = None,
    ) -> Response:
        """:meth:`act` for an action that reads the form's fields: ``action(actor, form)``."""

        async def go(user: User, form: dict[str, str]) -> Response:
            return self.back(form.get("back", "/admin"), await action(f"user:{user.id}", form))

        return await self.answer_form(request, go, refused)

    async def answer_form(
        self,
        request: Request,
        answer: Callable[[User, dict[str, str]], Awaitable[Response]],
        refused: Refused | None = None,
    ) -> Response:
        """``answer(user, form)`` for a checked POST. A refusal (DomainError) is the flash on
        the page the form came from (``back``), or ``refused(request, user, form, exc)``'s page
        when given; a failure to try again (busy, unreachable) is always the flash."""
        user, form = await self.checked(request)
        if user is None:
            return forbidden(self, request)
        bad = refused_field(form)
        if bad is not None:
            return self.problem(request, user, 422, "Bad input", bad)
        back = form.get("back", "/admin")
        try:
            return await answer(user, form)
        except DomainError as exc:
            if refused is not None:
                return await refused(request, user, form, exc)
            return self.back(back, f"Refused: {exc.message}")
        except DueflowError as exc:  # busy, a provider or the database unreachable
            return self.back(back, f"Not done, try again: {errors.public_message(exc)}")


def local(to: str) -> str:
    """Only admin pages are redirect targets (no open redirect through ``back``)."""
    return to if to.startswith("/admin") and "//" not in to and "\\" not in to else "/admin"


def _when(value: Any) -> str:
    """A datetime as ``2026-03-01 12:00:05`` (UTC), anything else as text, None as a dash."""
    if value is None:
        return "–"
    if hasattr(value, "strftime"):
        return str(value.strftime("%Y-%m-%d %H:%M:%S"))
    return str(value)


def id_of(value: str | None) -> int | None:
    if value is None or ID.fullmatch(value) is None or not 1 <= int(value) <= MAX_ID:
        return None
    return int(value)


def seq_range(form: dict[str, str]) -> tuple[int, int]:
    """A replay form's events: the seqs ``first`` to ``last`` (``first`` alone without it).

    Raises:
        InvalidInput: ``first`` (or ``last``) is no seq.
    """
    first = id_of(form.get("first", "").strip())
    last = id_of(form.get("last", "").strip() or form.get("first", "").strip())
    if first is None or last is None:
        raise InvalidInput("a replay takes the seq of its first (and last) event")
    return first, last


def refused_field(form: dict[str, str]) -> str | None:
    """The first form field holding a character no admin form takes (a control character, a
    lone surrogate, a noncharacter), with what it holds; None when every field is text."""
    for name, value in form.items():
        problem = text.refused_character(value)
        if problem is not None:
            return f"{name} {problem}"
    return None


def login_redirect(request: Request) -> RedirectResponse:
    target = quote(local(request.url.path + (f"?{request.url.query}" if request.url.query else "")))
    return RedirectResponse(f"/admin/login?next={target}", status_code=303, headers=HEADERS)


def forbidden(pages: Pages, request: Request) -> HTMLResponse:
    return pages.problem(
        request,
        None,
        403,
        "Not allowed",
        "Your session has ended or the form is stale (cross-site request refused). "
        "Log in and try again.",
    )


def checked_id(value: int) -> int:
    if not 1 <= value <= MAX_ID:
        raise NotFound(f"no such id {value}")
    return value

"""The way in: the pages' static files (``/admin/static/...``), the login form opened with an
admin token, and the logout."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from dueflow.api.admin_pages.site import (
    COOKIE,
    HEADERS,
    HERE,
    Pages,
    forbidden,
    local,
    refused_field,
)
from dueflow.exceptions import NotFound
from dueflow.service import sessions


def add_routes(routes: APIRouter, pages: Pages) -> None:
    """The static files, ``/admin/login`` and ``/admin/logout`` on the admin router."""
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

    @routes.get("/login", response_class=HTMLResponse)
    async def login_form(request: Request, next: str = "/admin") -> Response:
        if await pages.user(request) is not None:
            return RedirectResponse(local(next), status_code=303, headers=HEADERS)
        return pages.page(request, "login.html", next=local(next), error="")

    @routes.post("/login", response_class=HTMLResponse)
    async def login(request: Request) -> Response:
        form = await pages.form(request)
        refused = refused_field(form)
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
                next=local(form.get("next", "/admin")),
                error="That is not an admin token.",
            )
        response = RedirectResponse(
            local(form.get("next", "/admin")), status_code=303, headers=HEADERS
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
            return forbidden(pages, request)
        response = RedirectResponse("/admin/login", status_code=303, headers=HEADERS)
        response.delete_cookie(COOKIE, path="/admin")
        return response

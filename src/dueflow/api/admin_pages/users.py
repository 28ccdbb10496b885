"""The people pages: every user (``/admin/users``, in cursor pages) and one user
(``/admin/users/{id}``: who they are, their orders on each side as links to the filtered
orders list with the newest few, and the service keys they made)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from dueflow.api.admin_pages.site import Pages
from dueflow.exceptions import InvalidInput
from dueflow.service import people
from dueflow.service.accounts import User

#: Users on a page of the list.
PAGE_SIZE = 50
#: Orders on a user's page, on each side (the list has them all).
ORDERS_SHOWN = 10


def add_routes(routes: APIRouter, pages: Pages) -> None:
    """``/admin/users`` and ``/admin/users/{id}`` on the admin router."""
    deps = pages.deps

    @routes.get("/users", response_class=HTMLResponse)
    async def user_list(request: Request, after: str = "") -> Response:
        async def render(user: User) -> Response:
            try:
                page = await people.users_page(deps, after=after or None, limit=PAGE_SIZE)
            except InvalidInput as exc:
                return pages.problem(request, user, 422, "Bad cursor", exc.message)
            return pages.page(
                request,
                "users.html",
                user=user,
                users=page.items,
                next=page.next,
                paged=bool(after),
                limit=PAGE_SIZE,
            )

        return await pages.signed_in(request, render)

    @routes.get("/users/{user_id}", response_class=HTMLResponse)
    async def user_page(request: Request, user_id: str) -> Response:
        async def load(found: int) -> dict[str, Any]:
            return await people.user_page(deps, found, orders_shown=ORDERS_SHOWN)

        async def render(user: User, _: int, person: dict[str, Any]) -> Response:
            return pages.page(request, "user.html", user=user, profile=person)

        return await pages.one(request, "user", user_id, load, render)

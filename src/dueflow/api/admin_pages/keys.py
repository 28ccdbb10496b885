"""The service keys page (``/admin/keys``): every key (never a secret), a form making one whose
secret is shown on the answer to that form only (not through a redirect: the secret never sits
in a cookie or a URL), and a revoke button per live key."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from dueflow.api.admin_pages.site import Pages, checked_id
from dueflow.domain import events, times
from dueflow.exceptions import DomainError, InvalidInput
from dueflow.service import keys, people
from dueflow.service.accounts import User

#: Keys on the page, newest first.
KEYS_LISTED = 100


def add_routes(routes: APIRouter, pages: Pages) -> None:
    """``/admin/keys``, making a key and revoking one, on the admin router."""
    deps = pages.deps

    async def listing(request: Request, user: User, status: int = 200, **shown: object) -> Response:
        page = await keys.keys_page(deps, after=None, limit=KEYS_LISTED)
        # Who made each key, parsed (``user:<id>``, ``user:<id>@key:<key>``, ``key:<key>``,
        # ``cli``), and the people among them by name: one statement more.
        makers = {k["created_by"]: events.actor_of(k["created_by"]) for k in page.items}
        names = await people.names(
            deps, (a["user_id"] for a in makers.values() if a["type"] == "user")
        )
        return pages.page(
            request,
            "keys.html",
            status=status,
            user=user,
            keys=page.items,
            makers=makers,
            names=names,
            scopes=keys.SCOPES,
            limit=KEYS_LISTED,
            **shown,
        )

    @routes.get("/keys", response_class=HTMLResponse)
    async def key_list(request: Request) -> Response:
        return await pages.signed_in(request, lambda user: listing(request, user))

    @routes.post("/keys", response_class=HTMLResponse)
    async def add_key(request: Request) -> Response:
        async def answer(user: User, form: dict[str, str]) -> Response:
            expiry = form.get("expires_at", "").strip()
            try:
                expires_at = times.parse(expiry) if expiry else None
            except ValueError as exc:  # the expiry is not a time
                raise InvalidInput(f"expires_at: {exc}") from None
            made, secret = await keys.add_key(
                deps,
                name=form.get("name", ""),
                scopes=[s for s in keys.SCOPES if form.get(f"scope_{s}")],
                expires_at=expires_at,
                by=f"user:{user.id}",
            )
            return await listing(request, user, 201, made=made, secret=secret)

        async def refused(
            request: Request, user: User, form: dict[str, str], exc: DomainError
        ) -> Response:
            status = 422 if isinstance(exc, InvalidInput) else 409
            return await listing(request, user, status, refused=exc.message)

        return await pages.answer_form(request, answer, refused)

    @routes.post("/keys/{key_id}/revoke")
    async def revoke(request: Request, key_id: int) -> Response:
        async def go(actor: str) -> str:
            await keys.revoke(deps, checked_id(key_id), by=actor)
            return f"Key {key_id} revoked: its next request is refused."

        return await pages.act(request, go)

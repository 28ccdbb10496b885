"""The service keys' routes under ``/api/admin/keys`` (an admin user, or a key with the ``admin``
scope): make one (its secret is in that answer only), list, show, rotate (a new key and secret;
the old key works until revoked) and revoke (refused at its next request). Who did it is recorded
(``created_by``) and logged, never the secret."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from dueflow.api import auth, idempotency
from dueflow.api import schemas as out
from dueflow.api.common import WITH_BODY, WITH_PARAMS, Body, Id, answer, resource
from dueflow.api.lists import NEXT_DESCRIPTION, After, PageLimit
from dueflow.api.schemas import View, errors
from dueflow.error_codes import ErrorCode
from dueflow.service import keys, lists
from dueflow.service.deps import Deps

Scope = Annotated[str, Field(json_schema_extra={"enum": list(keys.SCOPES)})]


class NewKey(Body):
    """A service key to make: its name, its scopes and when it stops working (never if null)."""

    name: out.SingleLine = Field(min_length=1, max_length=64, examples=["shop back end"])
    scopes: list[Scope] = Field(min_length=1, max_length=len(keys.SCOPES), examples=[["orders"]])
    expires_at: out.Time | None = None


class KeyView(View):
    """A service key as lists show it: never its secret."""

    id: int
    name: str
    prefix: str = Field(description="the start of its secret, to tell keys apart")
    scopes: list[Scope]
    state: str = Field(description="active | revoked | expired")
    created_at: datetime
    created_by: str = Field(description="who made it: an actor (`user:5`, `cli`, ...)")
    expires_at: datetime | None
    revoked_at: datetime | None
    rotated_from: int | None = Field(description="the key this one replaced by rotation")


class KeyMade(KeyView):
    """A key just made or rotated, with its secret: shown here only, stored hashed."""

    secret: str | None = Field(
        description="`Authorization: Bearer <secret>`; never shown again: null on a repeat of "
        "the request under its Idempotency-Key (the secret is not stored with the answer)"
    )


class KeyPage(View):
    """A page of keys, newest first."""

    items: list[KeyView]
    next: str | None = Field(description=NEXT_DESCRIPTION)


def router(deps: Deps) -> APIRouter:
    """The ``/api/admin/keys`` routes over ``deps``."""
    routes = resource(
        "/api/admin/keys", auth.current_admin(deps), [ErrorCode.NOT_ALLOWED], tag="admin"
    )
    keyed = idempotency.idempotent(deps)
    withheld = idempotency.idempotent(deps, withheld=("secret",))
    # Rotating or revoking a key that is revoked (or expired) already is a 409 ``conflict``.
    one = errors(*WITH_PARAMS, ErrorCode.NOT_FOUND)
    changed = errors(*WITH_PARAMS, ErrorCode.NOT_FOUND, ErrorCode.CONFLICT)

    @routes.post("", status_code=201, response_model=KeyMade, responses=errors(*WITH_BODY))
    @withheld
    async def add_key(body: NewKey, request: Request) -> JSONResponse:
        """Make a key; its secret is in this answer only."""
        made, secret = await keys.add_key(
            deps,
            name=body.name,
            scopes=body.scopes,
            expires_at=body.expires_at,
            by=auth.actor(request),
        )
        return answer({**made, "secret": secret}, 201)

    @routes.get("", response_model=KeyPage, responses=errors(*WITH_PARAMS))
    async def list_keys(
        after: After = None, limit: PageLimit = lists.DEFAULT_LIMIT
    ) -> JSONResponse:
        """Every key, newest first (revoked and expired ones too), a page at a time."""
        page = await keys.keys_page(deps, after=after, limit=limit)
        return answer({"items": page.items, "next": page.next})

    @routes.get("/{key_id}", response_model=KeyView, responses=one)
    async def get_key(key_id: Id) -> JSONResponse:
        """One key (never its secret)."""
        return answer(await keys.get_key(deps, key_id))

    @routes.post("/{key_id}/rotate", status_code=201, response_model=KeyMade, responses=changed)
    @withheld
    async def rotate(key_id: Id, request: Request) -> JSONResponse:
        """A new key (and secret) replacing this one, with its name, scopes and expiry; this one
        keeps working until revoked. 409 when it is revoked or expired."""
        made, secret = await keys.rotate(deps, key_id, by=auth.actor(request))
        return answer({**made, "secret": secret}, 201)

    @routes.post("/{key_id}/revoke", response_model=KeyView, responses=changed)
    @keyed
    async def revoke(key_id: Id, request: Request) -> JSONResponse:
        """Revoke the key: its next request is refused (401). 409 when revoked already."""
        return answer(await keys.revoke(deps, key_id, by=auth.actor(request)))

    return routes

"""Who is calling, and for whom: ``Authorization: Bearer <credential>`` resolved to a user.

Two credentials, side by side:

- a **personal token** (``dueflow users add``): the caller is its user; it may not act for
  anyone else (``Dueflow-Act-As`` is refused, 403 ``act_as_not_allowed``);
- a **service key** (``dfk_live_...``, ``dueflow keys add``): a host's back end, allowed the
  routes of its scopes (else 403 ``missing_scope`` naming the scope). On a route for a user it
  acts for the host's user named by ``Dueflow-Act-As`` (created on first use; 400
  ``act_as_required`` without it), and every rule of roles applies to that user. On an admin
  route its ``admin`` scope is enough.

Either way one statement reads the credential (and, for a key, the user acted for): nothing is
cached across requests, so a revoked key is refused at its next request in every process.

The dependencies are built per ``deps`` (and per scope) and meant for a router's
``dependencies=[...]``: they keep the caller in ``request.state.user`` (and the key in
``request.state.key_id``), where :func:`caller` and :func:`actor` find them, and name the key in
the events the request writes (:mod:`dueflow.service.actors`). (FastAPI resolves a route's
annotations in its module's globals, so a dependency made inside ``router(deps)`` cannot be named
in a parameter's annotation; the scoped security is a default value for the same reason.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Header, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from dueflow import tracing
from dueflow.exceptions import (
    ActAsNotAllowed,
    ActAsRequired,
    InvalidInput,
    NotAllowed,
    Unauthenticated,
)
from dueflow.service import accounts, actors, keys
from dueflow.service.accounts import User
from dueflow.service.deps import Deps

#: The OpenAPI schemes, both read from ``Authorization: Bearer``; missing or non-bearer headers
#: come through as None (we answer 401).
bearer = HTTPBearer(auto_error=False, description="a personal token from `dueflow users add`")
service_key = HTTPBearer(
    auto_error=False,
    scheme_name="ServiceKey",
    description="a service key (`dfk_live_...`) from `dueflow keys add` or `POST "
    "/api/admin/keys`, allowed the routes of its scopes (orders, catalog, payments, events, "
    "admin); it acts for the host's user named by the `Dueflow-Act-As` header",
)
Credentials = HTTPAuthorizationCredentials | None
Token = Annotated[Credentials, Depends(bearer)]
ActAs = Annotated[
    str | None,
    Header(
        alias="Dueflow-Act-As",
        description="service keys only: the host's own id of the user to act for (1-255 "
        "characters, UTF-8, no control characters); the user is created on first use",
    ),
]
ActAsName = Annotated[
    str | None,
    Header(
        alias="Dueflow-Act-As-Name",
        description="service keys only: the display name of the user acted for (1-255 "
        "characters, UTF-8)",
    ),
]


@dataclass(frozen=True)
class Caller:
    """Who a request is from: the user (None for a key acting for nobody) and the key (None for
    a personal token)."""

    user: User | None
    key_id: int | None


#: Per scope, the service key's credentials declared in the OpenAPI document with that scope.
SCOPED: dict[str, Any] = {scope: Security(service_key, scopes=[scope]) for scope in keys.SCOPES}


def current_user(deps: Deps, scope: str) -> Callable[..., AsyncIterator[User]]:
    """A dependency giving the user the request is for (also kept in ``request.state.user``):
    401 without a valid credential, 403 for a key without ``scope``, 400 for a key acting for
    nobody."""

    async def user(
        request: Request,
        token: Token,
        act_as: ActAs = None,
        act_as_name: ActAsName = None,
        key: Credentials = SCOPED[scope],
    ) -> AsyncIterator[User]:
        found = await _authenticate(deps, request, token or key, scope, act_as, act_as_name)
        if found.user is None:
            raise ActAsRequired(
                "this route acts for a user: name the host's user in the Dueflow-Act-As header"
            )
        with actors.acting_key(found.key_id):
            yield found.user

    return user


def current_admin(deps: Deps) -> Callable[..., AsyncIterator[Caller]]:
    """A dependency giving the caller when an admin user or a key with the ``admin`` scope;
    401 as :func:`current_user`, 403 for anyone else."""

    async def admin(
        request: Request,
        token: Token,
        act_as: ActAs = None,
        act_as_name: ActAsName = None,
        key: Credentials = SCOPED["admin"],
    ) -> AsyncIterator[Caller]:
        found = await _authenticate(deps, request, token or key, "admin", act_as, act_as_name)
        if found.key_id is None and not (found.user and found.user.is_admin):
            raise NotAllowed("only an admin may do this")
        with actors.acting_key(found.key_id):
            yield found

    return admin


async def _authenticate(
    deps: Deps,
    request: Request,
    credentials: Credentials,
    scope: str,
    act_as: str | None,
    act_as_name: str | None,
) -> Caller:
    if credentials is None or not credentials.credentials:
        raise Unauthenticated("a bearer token or a service key is required")
    secret = credentials.credentials
    if keys.is_key(secret):  # a service key: checked for the scope, acting for whom it names
        who = keys.act_as(
            _utf8("Dueflow-Act-As", act_as), _utf8("Dueflow-Act-As-Name", act_as_name)
        )
        acting = await keys.authenticate(deps, secret, scope, who)
        found = Caller(acting.user, acting.key_id)
    else:  # a personal token: its own user, and nobody else
        user = await accounts.authenticate(deps, secret)
        if user is None:
            raise Unauthenticated("the bearer token is not valid")
        if act_as is not None or act_as_name is not None:
            raise ActAsNotAllowed()
        found = Caller(user, None)
    request.state.user, request.state.key_id = found.user, found.key_id
    if tracing.on():  # on the request's span
        user_id = None if found.user is None else found.user.id
        tracing.annotate({"enduser.id": user_id, "dueflow.key_id": found.key_id})
    return found


def _utf8(header: str, value: str | None) -> str | None:
    """A header's value as the UTF-8 text it was sent as (ASGI servers hand bytes over as
    Latin-1)."""
    if value is None:
        return None
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        raise InvalidInput(f"{header}: UTF-8 text", field=header) from None


def caller(request: Request) -> User:
    """The user a router dependency authenticated for this request."""
    user = getattr(request.state, "user", None)
    if not isinstance(user, User):
        raise Unauthenticated("a bearer token or a service key is required")
    return user


def actor(request: Request) -> str:
    """Who the request acts as, for what it records (:mod:`dueflow.service.actors`)."""
    user = getattr(request.state, "user", None)
    key_id = getattr(request.state, "key_id", None)
    if isinstance(user, User):
        return actors.user(user.id)  # with the key, when one acts
    if key_id is not None:
        return actors.key(key_id)
    raise Unauthenticated("a bearer token or a service key is required")

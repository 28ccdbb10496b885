"""Who is calling: ``Authorization: Bearer <token>`` resolved to a user, and the admin check.

The dependencies are built per ``deps`` and meant for a router's ``dependencies=[...]``: they keep
the caller in ``request.state.user``, where :func:`caller` finds it. (FastAPI resolves a route's
annotations in its module's globals, so a dependency made inside ``router(deps)`` cannot be named
in a parameter's annotation.)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from dueflow.exceptions import NotAllowed
from dueflow.service import accounts
from dueflow.service.accounts import User
from dueflow.service.deps import Deps

#: The OpenAPI scheme; missing or non-bearer headers come through as None (we answer 401).
bearer = HTTPBearer(auto_error=False, description="a token from `dueflow users add`")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def _unauthorized(message: str) -> HTTPException:
    return HTTPException(401, message, headers={"WWW-Authenticate": "Bearer"})


async def _authenticate(deps: Deps, request: Request, credentials: Credentials) -> User:
    if credentials is None or not credentials.credentials:
        raise _unauthorized("a bearer token is required")
    found = await accounts.authenticate(deps, credentials.credentials)
    if found is None:
        raise _unauthorized("the bearer token is not valid")
    request.state.user = found
    return found


def current_user(deps: Deps) -> Callable[..., Awaitable[User]]:
    """A dependency giving the caller's user (also kept in ``request.state.user``); 401 without
    a bearer token or with one nobody holds."""

    async def user(request: Request, credentials: Credentials) -> User:
        return await _authenticate(deps, request, credentials)

    return user


def current_admin(deps: Deps) -> Callable[..., Awaitable[User]]:
    """A dependency giving the caller's user when an admin; 401 as :func:`current_user`, 403
    for anyone else."""

    async def admin(request: Request, credentials: Credentials) -> User:
        user = await _authenticate(deps, request, credentials)
        if not user.is_admin:
            raise NotAllowed("only an admin may do this")
        return user

    return admin


def caller(request: Request) -> User:
    """The user a router dependency authenticated for this request."""
    user = getattr(request.state, "user", None)
    if not isinstance(user, User):
        raise _unauthorized("a bearer token is required")
    return user

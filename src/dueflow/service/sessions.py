"""Admin page sessions: a signed cookie naming the user, its expiry and a digest of its token.

The cookie is ``{user_id}.{expires}.{signature}``; the signature is an HMAC of the user id, the
expiry and the user's stored token hash under the server's session secret, so a session ends
when it expires, when the secret changes, or when the user's token is replaced. Nothing is kept
on the server. Forms carry a CSRF token derived from the session cookie (a second HMAC), so a
page on another site cannot post as the operator even if a browser sent the cookie.

A show's gate page has sessions of its own (:func:`open_gate_session`), opened with any user's
personal token: the same cookie, signed for the gate (``gate:`` before what is signed), so it
never passes for an admin session; what it may open (its user's own shows' gates) the gate's
use cases decide (:mod:`dueflow.service.checkin`).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from datetime import timedelta

from dueflow.service import accounts
from dueflow.service.accounts import User
from dueflow.service.deps import Deps
from dueflow.store import users

#: ``{user id}.{expiry}.{signature}``, ASCII digits and lowercase hex only.
COOKIE = re.compile(r"([0-9]{1,18})\.([0-9]{1,12})\.([0-9a-f]{64})")
TOKEN = re.compile(r"[0-9a-f]{64}")
#: What a gate session's signature starts with (an admin session's: nothing).
GATE = "gate:"


def _sign(secret: bytes, message: str) -> str:
    return hmac.new(secret, message.encode(), hashlib.sha256).hexdigest()


async def open_session(deps: Deps, token: str, *, secret: bytes, ttl: timedelta) -> str | None:
    """The session cookie for the admin holding ``token``; None for anyone else."""
    user = await accounts.authenticate(deps, token)
    if user is None or not user.is_admin:
        return None
    expires = int((deps.clock.now() + ttl).timestamp())
    head = f"{user.id}.{expires}"
    return f"{head}.{_sign(secret, f'{head}.{accounts.hash_token(token)}')}"


async def session_user(deps: Deps, cookie: str, *, secret: bytes) -> User | None:
    """The admin a session cookie names, if it is intact, unexpired and the admin's token is
    the one it was opened with."""
    user = await _signed_user(deps, cookie, secret, "")
    return user if user is not None and user.is_admin else None


async def open_gate_session(deps: Deps, token: str, *, secret: bytes, ttl: timedelta) -> str | None:
    """The gate session cookie of the user holding the personal ``token``; None for no user."""
    user = await accounts.authenticate(deps, token)
    if user is None:
        return None
    expires = int((deps.clock.now() + ttl).timestamp())
    head = f"{user.id}.{expires}"
    return f"{head}.{_sign(secret, f'{GATE}{head}.{accounts.hash_token(token)}')}"


async def gate_user(deps: Deps, cookie: str, *, secret: bytes) -> User | None:
    """The user a gate session cookie names, if it is intact, unexpired and the user's token
    is the one it was opened with."""
    return await _signed_user(deps, cookie, secret, GATE)


async def _signed_user(deps: Deps, cookie: str, secret: bytes, purpose: str) -> User | None:
    parts = COOKIE.fullmatch(cookie)
    if parts is None:
        return None
    user_id, expires, signature = int(parts[1]), int(parts[2]), parts[3]
    if expires < deps.clock.now().timestamp():
        return None
    async with deps.db.read() as conn:
        row = await users.by_id(conn, user_id)
    if row is None:
        return None
    expected = _sign(secret, f"{purpose}{user_id}.{expires}.{row.token_hash}")
    if not hmac.compare_digest(expected, signature):
        return None
    return User(row.id, row.name, row.is_admin)


def csrf_token(cookie: str, *, secret: bytes) -> str:
    """The CSRF token that forms of this session must carry."""
    return _sign(secret, f"csrf:{cookie}")


def csrf_ok(cookie: str, token: str, *, secret: bytes) -> bool:
    """Whether ``token`` is this session's CSRF token."""
    if TOKEN.fullmatch(token) is None:
        return False
    return hmac.compare_digest(csrf_token(cookie, secret=secret), token)

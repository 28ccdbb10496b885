"""Service keys: the credentials a host application's back end calls dueflow with, acting for
the host's own users (named by the host's ids) within the scopes the key was given.

A key's secret (``dfk_live_`` and 43 URL-safe characters of 32 random bytes) is shown once, when
the key is made or rotated, and stored as its SHA-256. Rotating makes a new key (a row of its own,
``rotated_from`` the old one, with its name, scopes and expiry): both secrets work until the old
key is revoked, and each event names the one that acted. Revoking takes effect at the next
request in every process: each request reads its key (nothing is cached across requests).

Authenticating a key's request is one statement, which also reads the user acted for
(:func:`authenticate`); that user is created on first use (one INSERT, once per user).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Row

from dueflow.exceptions import (
    Conflict,
    InvalidInput,
    MissingScope,
    NotFound,
    Unauthenticated,
)
from dueflow.service import lists
from dueflow.service.accounts import User, hash_token
from dueflow.service.deps import Deps
from dueflow.store import keys, users

log = logging.getLogger(__name__)

#: Every scope, and what it opens (docs/design.md, "Service keys").
SCOPES = ("orders", "catalog", "payments", "events", "admin")
#: How every secret starts (so a credential is told from a personal token by its first bytes).
SECRET_START = "dfk_live_"  # noqa: S105 (how secrets start, not one)
#: The public part of a secret shown in lists: its start and 6 characters more.
PREFIX_LENGTH = len(SECRET_START) + 6
#: The longest external id and display name a host may send.
MAX_EXTERNAL = 255


def is_key(credential: str) -> bool:
    """Whether a bearer credential is a service key's secret (else: a personal token)."""
    return credential.startswith(SECRET_START)


@dataclass(frozen=True)
class ActAs:
    """The host's user a key's request acts for: its id in the host and, optionally, its name."""

    external_id: str
    display_name: str | None = None


@dataclass(frozen=True)
class Acting:
    """A service key's request: the key, its scopes and the user it acts for (None: nobody)."""

    key_id: int
    scopes: frozenset[str]
    user: User | None


def act_as(external_id: str | None, display_name: str | None) -> ActAs | None:
    """The user named by the ``Dueflow-Act-As`` and ``Dueflow-Act-As-Name`` headers' values
    (None when neither was sent).

    Raises:
        InvalidInput: a value empty, over 255 characters or holding control characters, or a
            name with no id.
    """
    if external_id is None:
        if display_name is not None:
            raise InvalidInput(
                "Dueflow-Act-As-Name: only with Dueflow-Act-As", field="Dueflow-Act-As-Name"
            )
        return None
    _check_external("Dueflow-Act-As", external_id)
    if display_name is not None:
        _check_external("Dueflow-Act-As-Name", display_name)
    return ActAs(external_id, display_name)


def _check_external(header: str, value: str) -> None:
    if not 1 <= len(value) <= MAX_EXTERNAL:
        raise InvalidInput(f"{header}: 1-{MAX_EXTERNAL} characters", field=header)
    if not value.isprintable():
        raise InvalidInput(f"{header}: no control characters", field=header)


async def authenticate(deps: Deps, secret: str, scope: str, who: ActAs | None) -> Acting:
    """The key holding ``secret``, checked for ``scope``, with the user ``who`` names (created on
    first use). One statement when the user exists; one INSERT more the first time.

    Raises:
        Unauthenticated: no key holds ``secret``, or it was revoked or expired.
        MissingScope: the key lacks ``scope`` (nothing is created then).
    """
    async with deps.db.read() as conn:
        external_id = who.external_id if who else None
        row = await keys.key_and_user(conn, hash_token(secret), external_id)
    if row is None:
        raise Unauthenticated("the service key is not valid")
    if row.revoked_at is not None:
        raise Unauthenticated("the service key was revoked")
    if row.expires_at is not None and row.expires_at <= deps.clock.now():
        raise Unauthenticated("the service key expired")
    scopes = frozenset(row.scopes.split())
    if scope not in scopes:
        raise MissingScope(scope)
    if who is None:
        return Acting(row.id, scopes, None)
    if row.user_id is None:
        return Acting(row.id, scopes, await _first_use(deps, who))
    if who.display_name is not None and who.display_name != row.display_name:
        async with deps.db.write() as conn:  # only when the host renamed its user
            await users.set_display_name(conn, row.user_id, who.display_name)
    return Acting(row.id, scopes, User(row.user_id, row.user_name, row.is_admin))


async def _first_use(deps: Deps, who: ActAs) -> User:
    """The user ``who`` names, made now. Its dueflow name is derived from the host's id (``ext:``
    cannot start a name `dueflow users add` takes); its token hash is that of a secret nobody
    was given (no personal token logs in as it)."""
    name = "ext:" + hashlib.sha256(who.external_id.encode()).hexdigest()[:24]
    try:
        async with deps.db.write() as conn:
            user_id = await users.insert_external(
                conn,
                name=name,
                token_hash=hash_token(secrets.token_urlsafe(32)),
                external_id=who.external_id,
                display_name=who.display_name,
                now=deps.clock.now(),
            )
    except Conflict:  # another request's first use of the same id won the race
        async with deps.db.read() as conn:
            found = await users.by_external_id(conn, who.external_id)
        if found is None:
            raise
        return User(found.id, found.name, found.is_admin)
    return User(user_id, name, False)


async def add_key(
    deps: Deps, *, name: str, scopes: Iterable[str], expires_at: datetime | None, by: str
) -> tuple[dict[str, Any], str]:
    """Make a key; returns its view and its secret (shown this once, stored hashed).

    Raises:
        InvalidInput: a name empty, over 64 characters or not printable; no scope or an unknown
            one; an expiry without a time zone or not in the future.
    """
    name, wanted = _name(name), _scopes(scopes)
    if expires_at is not None:
        if expires_at.tzinfo is None:
            raise InvalidInput("expires_at: a time with its offset", field="expires_at")
        if expires_at <= deps.clock.now():
            raise InvalidInput("expires_at: a time in the future", field="expires_at")
    async with deps.db.write() as conn:
        key_id, secret = await _insert(conn, deps, name, wanted, expires_at, None, by)
        row = await keys.get(conn, key_id)
    log.info("service key %d %r made by %s, scopes %s", key_id, name, by, wanted)
    return view(row, deps.clock.now()), secret


async def _insert(
    conn: Any,
    deps: Deps,
    name: str,
    scopes: str,
    expires_at: datetime | None,
    rotated_from: int | None,
    by: str,
) -> tuple[int, str]:
    secret = SECRET_START + secrets.token_urlsafe(32)
    key_id = await keys.insert_key(
        conn,
        name=name,
        prefix=secret[:PREFIX_LENGTH],
        secret_hash=hash_token(secret),
        scopes=scopes,
        created_by=by,
        expires_at=expires_at,
        rotated_from=rotated_from,
        now=deps.clock.now(),
    )
    return key_id, secret


def _name(name: str) -> str:
    if not isinstance(name, str):
        raise InvalidInput("name: text", field="name")
    name = name.strip()
    if not 1 <= len(name) <= 64 or not name.isprintable():
        raise InvalidInput("name: 1-64 printable characters", field="name")
    return name


def _scopes(scopes: Iterable[str]) -> str:
    """The scopes as stored: known ones, each once, in :data:`SCOPES` order."""
    wanted = set(scopes)
    unknown = sorted(str(s) for s in wanted - set(SCOPES))
    if unknown:
        raise InvalidInput(
            f"scopes: unknown {', '.join(unknown)} (known: {', '.join(SCOPES)})", field="scopes"
        )
    if not wanted:
        raise InvalidInput(f"scopes: at least one of {', '.join(SCOPES)}", field="scopes")
    return " ".join(s for s in SCOPES if s in wanted)


async def rotate(deps: Deps, key_id: int, *, by: str) -> tuple[dict[str, Any], str]:
    """A new key replacing ``key_id`` (same name, scopes and expiry); returns its view and
    secret. The old key keeps working until it is revoked.

    Raises:
        NotFound: no such key.
        Conflict: the key is revoked or expired.
    """
    now = deps.clock.now()
    async with deps.db.write() as conn:
        old = await _live(conn, key_id, now, "rotate")
        new_id, secret = await _insert(conn, deps, old.name, old.scopes, old.expires_at, old.id, by)
        row = await keys.get(conn, new_id)
    log.info("service key %d rotated by %s: key %d replaces it", key_id, by, new_id)
    return view(row, now), secret


async def revoke(deps: Deps, key_id: int, *, by: str) -> dict[str, Any]:
    """Revoke a key: its next request is refused (401), in every process.

    Raises:
        NotFound: no such key.
        Conflict: it was revoked already.
    """
    now = deps.clock.now()
    async with deps.db.write() as conn:
        if await keys.get(conn, key_id) is None:
            raise NotFound(f"no service key {key_id}")
        if not await keys.revoke(conn, key_id, now):
            raise Conflict(f"service key {key_id} is revoked already")
        row = await keys.get(conn, key_id)
    log.info("service key %d revoked by %s", key_id, by)
    return view(row, now)


async def _live(conn: Any, key_id: int, now: datetime, doing: str) -> Row[Any]:
    row = await keys.get(conn, key_id, for_update=True)
    if row is None:
        raise NotFound(f"no service key {key_id}")
    state = _state(row, now)
    if state != "active":
        raise Conflict(f"cannot {doing} service key {key_id}: it is {state}")
    return row


async def get_key(deps: Deps, key_id: int) -> dict[str, Any]:
    """The key's view (never its secret)."""
    async with deps.db.read() as conn:
        row = await keys.get(conn, key_id)
    if row is None:
        raise NotFound(f"no service key {key_id}")
    return view(row, deps.clock.now())


async def keys_page(deps: Deps, *, after: str | None, limit: int) -> lists.Page:
    """A page of keys, newest first, revoked and expired ones too."""
    scope = {"list": "keys"}
    rows = await _rows(deps, lists.read_cursor(after, scope), limit)
    now = deps.clock.now()
    items = [view(row, now) for row in rows[:limit]]
    last = items[-1]["id"] if len(rows) > limit else None
    return lists.Page(items, None if last is None else lists.make_cursor(last, scope))


async def _rows(deps: Deps, after: int | None, limit: int) -> Sequence[Row[Any]]:
    async with deps.db.read() as conn:
        return await keys.page(conn, after=after, limit=limit)


def _state(row: Row[Any], now: datetime) -> str:
    if row.revoked_at is not None:
        return "revoked"
    if row.expires_at is not None and row.expires_at <= now:
        return "expired"
    return "active"


def view(row: Row[Any] | None, now: datetime) -> dict[str, Any]:
    """A key as answers show it: never its secret nor its hash."""
    assert row is not None
    found = dict(row._mapping)
    found["scopes"] = row.scopes.split()
    found["state"] = _state(row, now)
    return found

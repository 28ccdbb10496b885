"""Statements on service keys (``api_keys``), and the one that authenticates a key's request."""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypedDict, Unpack

from sqlalchemy import Row, Select, bindparam, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.store import _rows, hot
from dueflow.store.schema import api_keys, users

#: What a key's list, show and answers read (never its secret's hash).
PUBLIC = (
    api_keys.c.id,
    api_keys.c.name,
    api_keys.c.prefix,
    api_keys.c.scopes,
    api_keys.c.created_at,
    api_keys.c.created_by,
    api_keys.c.expires_at,
    api_keys.c.revoked_at,
    api_keys.c.rotated_from,
)


class NewKey(TypedDict):
    """A new key's columns as its maker gives them (the secret only as its hash)."""

    name: str
    prefix: str
    secret_hash: str
    scopes: str
    created_by: str
    expires_at: datetime | None
    rotated_from: int | None


async def insert_key(conn: AsyncConnection, *, now: datetime, **key: Unpack[NewKey]) -> int:
    """Add a key; returns its id."""
    return await _rows.add(conn, api_keys, key, created_at=now)


async def get(conn: AsyncConnection, key_id: int, *, for_update: bool = False) -> Row[Any] | None:
    """The key with this id (its public columns)."""
    query: Select[Any] = select(*PUBLIC).where(api_keys.c.id == key_id)
    return await _rows.first(conn, query, for_update=for_update)


async def page(conn: AsyncConnection, *, after: int | None, limit: int) -> list[Row[Any]]:
    """Up to ``limit + 1`` keys below id ``after``, newest first (revoked ones too). One
    statement, a range read of the primary key."""
    query: Select[Any] = select(*PUBLIC).order_by(api_keys.c.id.desc()).limit(limit + 1)
    if after is not None:
        query = query.where(api_keys.c.id < after)
    return list((await conn.execute(query)).all())


async def revoke(conn: AsyncConnection, key_id: int, now: datetime) -> int:
    """Revoke a live key (its next request is refused); 0 when it was revoked already."""
    result = await conn.execute(
        update(api_keys)
        .where(api_keys.c.id == key_id, api_keys.c.revoked_at.is_(None))
        .values(revoked_at=now)
    )
    return int(result.rowcount)


#: A key's request's first statement, built once and run hot (as the token's is, store/users.py):
#: the key whose secret hashes to ``secret_hash`` and, in the same read, the user the host names
#: ``external_id`` (NULL columns when there is none yet, or when no user is named: ``= NULL``
#: matches nothing).
_KEY_AND_USER = hot.Hot(
    select(
        api_keys.c.id,
        api_keys.c.scopes,
        api_keys.c.expires_at,
        api_keys.c.revoked_at,
        users.c.id.label("user_id"),
        users.c.name.label("user_name"),
        users.c.is_admin,
        users.c.display_name,
    )
    .select_from(api_keys.outerjoin(users, users.c.external_id == bindparam("external_id")))
    .where(api_keys.c.secret_hash == bindparam("secret_hash"))
)


async def key_and_user(
    conn: AsyncConnection, secret_hash: str, external_id: str | None
) -> hot.HotRow | None:
    """The key whose secret hashes to ``secret_hash`` (id, scopes, expires_at, revoked_at) and
    the user with ``external_id`` (user_id, user_name, is_admin, display_name: None when none)."""
    return await _KEY_AND_USER.first(conn, secret_hash=secret_hash, external_id=external_id)

"""Statements on users."""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypedDict, Unpack

from sqlalchemy import Row, bindparam, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.store import _rows, hot
from dueflow.store.schema import users


class NewUser(TypedDict):
    """A new user's columns as its maker gives them (its token only as the token's hash)."""

    name: str
    token_hash: str


class NewExternalUser(NewUser):
    """A new user a host names: the host's id for it and the name the host shows."""

    external_id: str
    display_name: str | None


async def insert_user(
    conn: AsyncConnection, *, is_admin: bool, now: datetime, **user: Unpack[NewUser]
) -> int:
    """Add a user; returns its id."""
    return await _rows.add(conn, users, user, is_admin=is_admin, created_at=now)


async def by_id(conn: AsyncConnection, user_id: int) -> Row[Any] | None:
    """The user with this id."""
    result = await conn.execute(select(users).where(users.c.id == user_id))
    return result.first()


async def by_name(conn: AsyncConnection, name: str) -> Row[Any] | None:
    """The user with this name."""
    result = await conn.execute(select(users).where(users.c.name == name))
    return result.first()


#: Every request's first statement, built once and run hot (docs/architecture.md, "How hot
#: statements run"): who holds the token (what a caller needs).
_BY_TOKEN_HASH = hot.Hot(
    select(users.c.id, users.c.name, users.c.is_admin).where(
        users.c.token_hash == bindparam("token_hash")
    )
)


async def by_token_hash(conn: AsyncConnection, token_hash: str) -> hot.HotRow | None:
    """The user whose token hashes to ``token_hash``: its id, name and is_admin."""
    return await _BY_TOKEN_HASH.first(conn, token_hash=token_hash)


async def set_token_hash(conn: AsyncConnection, user_id: int, token_hash: str) -> int:
    """Replace the user's token (the old one stops working)."""
    result = await conn.execute(
        update(users).where(users.c.id == user_id).values(token_hash=token_hash)
    )
    return int(result.rowcount)


async def insert_external(
    conn: AsyncConnection, *, now: datetime, **user: Unpack[NewExternalUser]
) -> int:
    """Add the user a host names ``external_id`` (never an admin); returns its id."""
    return await _rows.add(conn, users, user, is_admin=False, created_at=now)


async def by_external_id(conn: AsyncConnection, external_id: str) -> Row[Any] | None:
    """The user a host names ``external_id``."""
    result = await conn.execute(select(users).where(users.c.external_id == external_id))
    return result.first()


async def set_display_name(conn: AsyncConnection, user_id: int, display_name: str) -> int:
    """Rename the user as its host now names it."""
    result = await conn.execute(
        update(users).where(users.c.id == user_id).values(display_name=display_name)
    )
    return int(result.rowcount)

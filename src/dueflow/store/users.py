"""Statements on users."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Row, bindparam, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.store import hot
from dueflow.store.schema import users


async def insert_user(
    conn: AsyncConnection, *, name: str, token_hash: str, is_admin: bool, now: datetime
) -> int:
    """Add a user; returns its id."""
    result = await conn.execute(
        insert(users).values(name=name, token_hash=token_hash, is_admin=is_admin, created_at=now)
    )
    return int(result.inserted_primary_key[0])  # type: ignore[index]


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
    conn: AsyncConnection,
    *,
    name: str,
    token_hash: str,
    external_id: str,
    display_name: str | None,
    now: datetime,
) -> int:
    """Add the user a host names ``external_id``; returns its id."""
    result = await conn.execute(
        insert(users).values(
            name=name,
            token_hash=token_hash,
            is_admin=False,
            external_id=external_id,
            display_name=display_name,
            created_at=now,
        )
    )
    return int(result.inserted_primary_key[0])  # type: ignore[index]


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

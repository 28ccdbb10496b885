"""Users and their goods."""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from dueflow.domain.money import parse_yuan
from dueflow.exceptions import Conflict, InvalidInput, NotFound
from dueflow.service.deps import Deps
from dueflow.store import goods, users

NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclass(frozen=True)
class User:
    """A person who buys, sells, or operates."""

    id: int
    name: str
    is_admin: bool


def hash_token(token: str) -> str:
    """Tokens are stored only as their SHA-256."""
    return hashlib.sha256(token.encode()).hexdigest()


async def add_user(deps: Deps, name: str, *, admin: bool = False) -> tuple[User, str]:
    """Create a user; returns it and its bearer token (shown once, stored hashed).

    Raises:
        InvalidInput: the name is malformed or taken.
    """
    if not NAME.fullmatch(name):
        raise InvalidInput("a user name is 1-64 letters, digits, '_', '.' or '-'", field="name")
    token = secrets.token_urlsafe(24)
    try:
        async with deps.db.write() as conn:
            if await users.by_name(conn, name) is not None:
                raise InvalidInput(f"user {name!r} already exists", field="name")
            user_id = await users.insert_user(
                conn, name=name, token_hash=hash_token(token), is_admin=admin, now=deps.clock.now()
            )
    except Conflict:  # the same name taken meanwhile
        raise InvalidInput(f"user {name!r} already exists", field="name") from None
    return User(user_id, name, admin), token


async def authenticate(deps: Deps, token: str) -> User | None:
    """The user holding ``token``, or None (one statement: the caller is not read again by
    what it does next)."""
    async with deps.db.read() as conn:
        row = await users.by_token_hash(conn, hash_token(token))
    return User(row.id, row.name, row.is_admin) if row else None


async def get_user(deps: Deps, user_id: int | str) -> User:
    """The user with this id, or with this name when given a string."""
    async with deps.db.read() as conn:
        if isinstance(user_id, str):
            row = await users.by_name(conn, user_id)
        else:
            row = await users.by_id(conn, user_id)
    if row is None:
        raise NotFound(f"no user {user_id!r}" if isinstance(user_id, str) else f"no user {user_id}")
    return User(row.id, row.name, row.is_admin)


async def add_goods(deps: Deps, *, seller_id: int, title: str, price: str | Decimal) -> int:
    """Put goods on sale; returns their id.

    Raises:
        InvalidInput: empty or long title, bad price.
        NotFound: no such seller.
    """
    title = title.strip()
    if not 1 <= len(title) <= 200:
        raise InvalidInput("a title is 1-200 characters", field="title")
    amount = parse_yuan(price, field="price")
    async with deps.db.write() as conn:
        if await users.by_id(conn, seller_id) is None:
            raise NotFound(f"no user {seller_id}")
        return await goods.insert_goods(
            conn, seller_id=seller_id, title=title, price=amount, now=deps.clock.now()
        )


async def get_goods(deps: Deps, goods_id: int) -> dict[str, Any]:
    """The goods as a plain dict."""
    async with deps.db.read() as conn:
        row = await goods.get(conn, goods_id)
    if row is None:
        raise NotFound(f"no goods {goods_id}")
    return dict(row._mapping)


async def issue_token(deps: Deps, name: str, *, admin: bool = False) -> tuple[User, str]:
    """A fresh token for the user ``name``, created if missing (``dueflow serve --dev-users``
    prints ready logins at every start: tokens are stored hashed, so an old one cannot be shown
    again). An existing user keeps its role; its old token stops working.

    Raises:
        InvalidInput: the name is malformed.
    """
    async with deps.db.read() as conn:
        row = await users.by_name(conn, name)
    if row is None:
        return await add_user(deps, name, admin=admin)
    token = secrets.token_urlsafe(24)
    async with deps.db.write() as conn:
        await users.set_token_hash(conn, row.id, hash_token(token))
    return User(row.id, row.name, row.is_admin), token

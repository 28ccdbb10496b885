"""Idempotent requests: the first answer to a caller's ``Idempotency-Key``, given again.

Placing ties its key to the order in the placing transaction (:func:`replay` finds it). Every
other route claims its key before it runs (:func:`claim`), keeps its answer after
(:func:`keep`) or lets the key go when refused (:func:`release`): same key and request, the
first answer; another request, :class:`~dueflow.exceptions.IdempotencyKeyReused`; a repeat
while the first is still running, :class:`~dueflow.exceptions.IdempotencyKeyInUse`; a repeat
after the first died unanswered (its lease over), the route runs again."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.exceptions import Conflict, IdempotencyKeyInUse, IdempotencyKeyReused
from dueflow.service import orders as order_service
from dueflow.service.deps import Deps
from dueflow.store import idempotency

#: A caller's ``Idempotency-Key`` with the request it came with.
Key = idempotency.Key


def request_hash(request: Any) -> str:
    """SHA-256 of ``request`` (JSON values; times and other values as their text) as JSON with
    sorted keys: the same request with its fields in another order is the same request."""
    text = json.dumps(request, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def key_for(
    buyer_id: int,
    key: str,
    request: Mapping[str, Any],
    answer: Callable[[Mapping[str, Any]], str] | None = None,
) -> Key:
    """The :data:`Key` of a placing request: ``request`` (its body as JSON values) hashed, so
    the same key with another body is told apart; ``answer`` writes the first answer kept."""
    return idempotency.Key(user(buyer_id), key, request_hash(request), answer=answer)


def user(user_id: int) -> str:
    """The principal a user calling for themself is: ``user:<id>``."""
    return f"user:{user_id}"


@dataclass(frozen=True)
class Replay:
    """What to answer a repeated request: the first answer as sent (``body``), or, when a
    placing key kept no answer (its placer gave no
    :attr:`~dueflow.store.idempotency.Key.answer`), the order as it is now (``view``)."""

    status_code: int
    body: str | None = None
    view: dict[str, Any] | None = None


#: A key claimed for its request.
Claim = idempotency.Claim


def _reused() -> IdempotencyKeyReused:
    return IdempotencyKeyReused("this Idempotency-Key was used for another request; use a new key")


async def replay(deps: Deps, key: idempotency.Key) -> Replay | None:
    """The answer for a placing key already used by this caller within 24 h, or None for a new
    key (one statement).

    Raises:
        IdempotencyKeyReused: the key came with another request.
    """
    now = deps.clock.now()
    async with deps.db.read() as conn:
        row = await idempotency.find(conn, key.principal, key.key, now)
        if row is None:
            return None
        if not key.same_request(row):
            raise _reused()
        if row.body is not None:
            return Replay(int(row.status_code), body=str(row.body))
        if row.order_id is None:  # another route's claim, still running
            raise IdempotencyKeyInUse("a request with this Idempotency-Key is still running")
        return Replay(201, view=await order_service.view_in(conn, int(row.order_id)))


async def claim(deps: Deps, key: Key) -> Claim | Replay:
    """Claim ``key`` for its request, or the first answer when it was answered already. A new
    key costs one statement; a repeat, two.

    Raises:
        IdempotencyKeyReused: the key came with another request (method, route, path or body).
        IdempotencyKeyInUse: a request with the key is running (or died less than
            :data:`~dueflow.store.idempotency.LEASE` ago).
    """
    now = deps.clock.now()
    for first in (True, False):
        try:
            async with deps.db.write() as conn:
                if not first:
                    await idempotency.forget_stale(conn, key, now)
                return Claim(await idempotency.claim(conn, key, now), key)
        except Conflict:
            pass  # the key is held: see by what
        async with deps.db.write() as conn:
            row = await idempotency.find(conn, key.principal, key.key, now)
            if row is not None:
                return await _held(conn, key, row, now)
        # Held by a row older than a day (or one just let go): its place is free.
    raise IdempotencyKeyInUse("a request with this Idempotency-Key is starting; try again")


async def _held(conn: AsyncConnection, key: Key, row: Row[Any], now: Any) -> Claim | Replay:
    """What a key held by ``row`` means for this request."""
    if not key.same_request(row):
        raise _reused()
    if row.status_code is not None:
        return Replay(int(row.status_code), body=str(row.body))
    if row.locked_until is not None and await idempotency.take_over(conn, row.id, now):
        return Claim(int(row.id), key, effect_id=row.effect_id)
    raise IdempotencyKeyInUse(
        "a request with this Idempotency-Key is still running; try again shortly"
    )


async def keep(deps: Deps, claim: Claim, status_code: int, body: bytes) -> None:
    """The claim's answer, kept for its repeats."""
    async with deps.db.write() as conn:
        await idempotency.keep(conn, claim.id, status_code, body.decode())


async def release(deps: Deps, claim: Claim) -> None:
    """The claim's request was refused or failed: its key may come again (with another request
    too, unless something was made that a repeat must resume)."""
    async with deps.db.write() as conn:
        await idempotency.release(conn, claim.id, deps.clock.now())

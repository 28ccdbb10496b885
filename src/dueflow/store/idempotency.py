"""Statements on ``Idempotency-Key`` rows: one per (principal, key), naming the request it came
with (method, route template, the request's hash) and, once answered, the answer.

A key is kept one of two ways. Placing ties it in the placing transaction with the first answer
(:func:`tie`), so an order, its key and the answer to repeat commit together or not at all.
Every other route claims it first, in a transaction of its own, with a lease (:func:`claim`);
keeps the answer once it has it (:func:`keep`), or lets the key go when refused
(:func:`release`). A claim whose lease ran out with no answer (its request died) is taken over
by the next repeat (:func:`take_over`), which runs the route again: the route's own state guard
keeps one effect, and a route whose effect spans a provider call finds what its first run made
(:func:`note`) and resumes it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Row, delete, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.store import _rows
from dueflow.store.schema import idempotency_keys

#: How long a key answers with its first answer.
KEEP = timedelta(hours=24)
#: How long a claim holds its key with no answer yet: longer than any request runs (a provider
#: call times out well within it), short enough that a repeat after a crash soon runs again.
LEASE = timedelta(seconds=60)
#: The request placing's keys name (its rows predate the other routes' keys).
PLACING = ("POST", "/api/orders")


@dataclass(frozen=True)
class Key:
    """An ``Idempotency-Key`` of a ``principal`` (who called: ``user:<id>``), the request it came
    with (``method``, ``route`` template, ``request_hash``), and, for placing, how the first
    answer is written for its repeats (the API's JSON of the new order's view; without it the
    row keeps no answer and a repeat is answered with the order as it is then)."""

    principal: str
    key: str
    request_hash: str
    answer: Callable[[Mapping[str, Any]], str] | None = None
    method: str = PLACING[0]
    route: str = PLACING[1]

    def columns(self) -> dict[str, str]:
        """The columns of this key's row that name it and its request."""
        return {
            "principal": self.principal,
            "key": self.key,
            "method": self.method,
            "route": self.route,
            "request_hash": self.request_hash,
        }

    def same_request(self, row: Row[Any]) -> bool:
        """``row`` (of this key) was written for this very request."""
        return (row.method, row.route, row.request_hash) == (
            self.method,
            self.route,
            self.request_hash,
        )


@dataclass(frozen=True)
class Claim:
    """A key claimed for its request (row ``id``). ``effect_id``: what an earlier run of the
    same request made before it died unanswered (a payment attempt), for the route to resume;
    None for a first run."""

    id: int
    key: Key
    effect_id: int | None = None


_c = idempotency_keys.c


async def find(conn: AsyncConnection, principal: str, key: str, now: datetime) -> Row[Any] | None:
    """The principal's live row for ``key`` (younger than :data:`KEEP`)."""
    query = select(idempotency_keys).where(
        _c.principal == principal, _c.key == key, _c.created_at > now - KEEP
    )
    return (await conn.execute(query)).first()


async def purge(conn: AsyncConnection, now: datetime) -> int:
    """Forget keys older than :data:`KEEP`."""
    result = await conn.execute(delete(idempotency_keys).where(_c.created_at <= now - KEEP))
    return int(result.rowcount)


async def forget_stale(conn: AsyncConnection, key: Key, now: datetime) -> None:
    """Forget the principal's row of ``key`` if older than :data:`KEEP` (its place is free)."""
    await conn.execute(
        delete(idempotency_keys).where(
            _c.principal == key.principal, _c.key == key.key, _c.created_at <= now - KEEP
        )
    )


async def tie(
    conn: AsyncConnection, key: Key | None, view: Mapping[str, Any], now: datetime
) -> None:
    """Last in a placing transaction: tie the request's key, if any, to the new order whose
    ``view`` is the answer (kept as the key's :attr:`Key.answer` writes it; a stale row of the
    same key is replaced). No key, no statement. Two requests racing with one key: the unique
    key lets one insert; the other's transaction fails (a Conflict) and takes nothing."""
    if key is None:
        return
    await forget_stale(conn, key, now)
    await conn.execute(
        insert(idempotency_keys).values(
            **key.columns(),
            order_id=int(view["id"]),
            status_code=201 if key.answer is not None else None,
            body=key.answer(view) if key.answer is not None else None,
            created_at=now,
        )
    )


async def claim(conn: AsyncConnection, key: Key, now: datetime) -> int:
    """Claim ``key`` for its request until ``now`` + :data:`LEASE`; returns the row's id. A key
    already held (live, stale, or claimed at this instant by a repeat) fails on the unique key
    (a Conflict when the transaction ends)."""
    return await _rows.add(
        conn, idempotency_keys, key.columns(), locked_until=now + LEASE, created_at=now
    )


async def take_over(conn: AsyncConnection, row_id: int, now: datetime) -> bool:
    """Claim again a row whose lease ran out with no answer (its request died, or failed after
    an effect); False when another repeat took it first or it was answered meanwhile."""
    result = await conn.execute(
        update(idempotency_keys)
        .where(
            _c.id == row_id,
            _c.status_code.is_(None),
            _c.locked_until.is_not(None),
            _c.locked_until <= now,
        )
        .values(locked_until=now + LEASE)
    )
    return bool(result.rowcount == 1)


async def note(conn: AsyncConnection, row_id: int, effect_id: int) -> None:
    """In the effect's own transaction: what the claim's request made (a payment attempt's
    id), for a re-run after a crash to resume."""
    await conn.execute(update(idempotency_keys).where(_c.id == row_id).values(effect_id=effect_id))


async def keep(conn: AsyncConnection, row_id: int, status_code: int, body: str) -> None:
    """The claim's answer, kept for its repeats; the lease ends."""
    await conn.execute(
        update(idempotency_keys)
        .where(_c.id == row_id)
        .values(status_code=status_code, body=body, locked_until=None)
    )


async def release(conn: AsyncConnection, row_id: int, now: datetime) -> None:
    """The claim's request was refused or failed: the key is free again. A claim with no noted
    effect is forgotten (the key may come with another request); one with an effect stays,
    its lease ended, so that a repeat resumes what was made."""
    gone = await conn.execute(
        delete(idempotency_keys).where(_c.id == row_id, _c.effect_id.is_(None))
    )
    if gone.rowcount == 0:
        await conn.execute(update(idempotency_keys).where(_c.id == row_id).values(locked_until=now))

"""Statements on ``Idempotency-Key``\\ s of placed orders: one row per (buyer, key), written in
the placing transaction with the first answer, so an order, its key and the answer to repeat
commit together or not at all."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Row, delete, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.store.schema import idempotency_keys

#: How long a key answers with its first order.
KEEP = timedelta(hours=24)


@dataclass(frozen=True)
class Key:
    """A buyer's ``Idempotency-Key``, the hash of the request it came with, and how the first
    answer is written for its repeats (the API's JSON of the new order's view; without it the
    row keeps no answer and a repeat is answered with the order as it is then)."""

    buyer_id: int
    key: str
    request_hash: str
    answer: Callable[[Mapping[str, Any]], str] | None = None


async def find(conn: AsyncConnection, buyer_id: int, key: str, now: datetime) -> Row[Any] | None:
    """The buyer's live row for ``key`` (younger than :data:`KEEP`)."""
    c = idempotency_keys.c
    query = select(idempotency_keys).where(
        c.buyer_id == buyer_id, c.key == key, c.created_at > now - KEEP
    )
    return (await conn.execute(query)).first()


async def purge(conn: AsyncConnection, now: datetime) -> int:
    """Forget keys older than :data:`KEEP`."""
    c = idempotency_keys.c
    result = await conn.execute(delete(idempotency_keys).where(c.created_at <= now - KEEP))
    return int(result.rowcount)


async def tie(
    conn: AsyncConnection, key: Key | None, view: Mapping[str, Any], now: datetime
) -> None:
    """Last in a placing transaction: tie the request's key, if any, to the new order whose
    ``view`` is the answer (kept as the key's :attr:`Key.answer` writes it; a stale row of the
    same key is replaced). No key, no statement. Two requests racing with one key: the unique
    key lets one insert; the other's transaction fails (a Conflict) and takes nothing."""
    if key is None:
        return
    c = idempotency_keys.c
    await conn.execute(
        delete(idempotency_keys).where(
            c.buyer_id == key.buyer_id, c.key == key.key, c.created_at <= now - KEEP
        )
    )
    await conn.execute(
        insert(idempotency_keys).values(
            buyer_id=key.buyer_id,
            key=key.key,
            request_hash=key.request_hash,
            order_id=int(view["id"]),
            status_code=201 if key.answer is not None else None,
            body=key.answer(view) if key.answer is not None else None,
            created_at=now,
        )
    )

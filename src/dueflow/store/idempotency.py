"""Statements on ``Idempotency-Key``\\ s of placed orders: one row per (buyer, key), written in
the placing transaction, so an order and its key commit together or not at all."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Row, delete, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.store.schema import idempotency_keys

#: How long a key answers with its first order.
KEEP = timedelta(hours=24)


@dataclass(frozen=True)
class Key:
    """A buyer's ``Idempotency-Key`` and the hash of the request it came with."""

    buyer_id: int
    key: str
    request_hash: str


async def find(conn: AsyncConnection, buyer_id: int, key: str, now: datetime) -> Row[Any] | None:
    """The buyer's live row for ``key`` (younger than :data:`KEEP`)."""
    c = idempotency_keys.c
    query = select(idempotency_keys).where(
        c.buyer_id == buyer_id, c.key == key, c.created_at > now - KEEP
    )
    return (await conn.execute(query)).first()


async def claim(
    conn: AsyncConnection,
    *,
    buyer_id: int,
    key: str,
    request_hash: str,
    order_id: int,
    now: datetime,
) -> None:
    """Tie ``key`` to the order being placed (a stale row of the same key is replaced). Two
    requests racing with one key: the unique key lets one insert; the other's transaction
    fails (a Conflict) and takes nothing."""
    c = idempotency_keys.c
    await conn.execute(
        delete(idempotency_keys).where(
            c.buyer_id == buyer_id, c.key == key, c.created_at <= now - KEEP
        )
    )
    await conn.execute(
        insert(idempotency_keys).values(
            buyer_id=buyer_id,
            key=key,
            request_hash=request_hash,
            order_id=order_id,
            created_at=now,
        )
    )


async def record_answer(
    conn: AsyncConnection, *, buyer_id: int, key: str, status_code: int, body: str
) -> None:
    """The first answer, to give again to a retry."""
    c = idempotency_keys.c
    await conn.execute(
        update(idempotency_keys)
        .where(c.buyer_id == buyer_id, c.key == key, c.status_code.is_(None))
        .values(status_code=status_code, body=body)
    )


async def purge(conn: AsyncConnection, now: datetime) -> int:
    """Forget keys older than :data:`KEEP`."""
    c = idempotency_keys.c
    result = await conn.execute(delete(idempotency_keys).where(c.created_at <= now - KEEP))
    return int(result.rowcount)


async def tie(conn: AsyncConnection, key: Key | None, order_id: int, now: datetime) -> None:
    """In a placing transaction: tie the request's key, if any, to the new order."""
    if key is not None:
        await claim(
            conn,
            buyer_id=key.buyer_id,
            key=key.key,
            request_hash=key.request_hash,
            order_id=order_id,
            now=now,
        )

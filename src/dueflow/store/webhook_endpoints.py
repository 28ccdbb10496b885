"""Statements on the webhook endpoints made over the API (their streams are cursors in
``event_deliveries``, :mod:`dueflow.store.events`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, TypedDict, Unpack

from sqlalchemy import Row, delete, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.store import _rows
from dueflow.store.schema import event_deliveries, webhook_endpoints

w = webhook_endpoints.c


def types_text(types: Sequence[str] | None) -> str | None:
    """The stored form of an event-type filter (None: every event)."""
    return " ".join(sorted(set(types))) if types else None


def types_of(row: Row[Any]) -> tuple[str, ...] | None:
    """An endpoint's event-type filter (None: every event)."""
    return tuple(row.event_types.split()) if row.event_types else None


class NewEndpoint(TypedDict):
    """A new endpoint's URL, signing secret and note, as its maker gives them."""

    url: str
    secret: str
    description: str | None


async def add(
    conn: AsyncConnection,
    *,
    types: Sequence[str] | None,
    by: str,
    now: datetime,
    **endpoint: Unpack[NewEndpoint],
) -> int:
    """A new enabled endpoint; returns its id."""
    return await _rows.add(
        conn,
        webhook_endpoints,
        endpoint,
        event_types=types_text(types),
        enabled=True,
        created_by=by,
        created_at=now,
        updated_at=now,
    )


async def get(conn: AsyncConnection, endpoint_id: int) -> Row[Any] | None:
    """One endpoint, or None."""
    return (await conn.execute(select(webhook_endpoints).where(w.id == endpoint_id))).first()


async def page(conn: AsyncConnection, *, below: int | None, limit: int) -> list[Row[Any]]:
    """Endpoints newest first, below id ``below``: ``limit`` + 1 (the last says more follow)."""
    query = select(webhook_endpoints).order_by(w.id.desc()).limit(limit + 1)
    if below is not None:
        query = query.where(w.id < below)
    return list((await conn.execute(query)).all())


async def enabled(conn: AsyncConnection) -> list[Row[Any]]:
    """Every enabled endpoint, oldest first."""
    query = select(webhook_endpoints).where(w.enabled.is_(True)).order_by(w.id)
    return list((await conn.execute(query)).all())


async def change(conn: AsyncConnection, endpoint_id: int, now: datetime, **values: Any) -> bool:
    """Set ``values`` (url, event_types, enabled, description) on one endpoint; False when
    there is none."""
    result = await conn.execute(
        update(webhook_endpoints).where(w.id == endpoint_id).values(updated_at=now, **values)
    )
    return result.rowcount == 1


async def rotate(
    conn: AsyncConnection,
    endpoint_id: int,
    *,
    secret: str,
    keep_old_until: datetime | None,
    now: datetime,
) -> bool:
    """Sign with ``secret`` from now on; the old secret signs too until ``keep_old_until``
    (None: at once no more). False when there is no such endpoint.

    The old secret is copied before the new one is set, in that order: MariaDB gives a later
    assignment the values of the earlier ones (``previous_secret = secret`` after
    ``secret = :new`` would keep the new secret twice)."""
    result = await conn.execute(
        update(webhook_endpoints)
        .where(w.id == endpoint_id)
        .ordered_values(
            (w.previous_secret, w.secret if keep_old_until is not None else None),
            (w.previous_until, keep_old_until),
            (w.secret, secret),
            (w.updated_at, now),
        )
    )
    return result.rowcount == 1


async def remove(conn: AsyncConnection, endpoint_id: int) -> bool:
    """Delete an endpoint and its streams; False when there is none."""
    await conn.execute(
        delete(event_deliveries).where(event_deliveries.c.endpoint_id == endpoint_id)
    )
    result = await conn.execute(delete(webhook_endpoints).where(w.id == endpoint_id))
    return result.rowcount == 1

"""Statements on the notification inbox: every raw notification, kept before it is judged."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Row, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.store.schema import notifications


async def store(
    conn: AsyncConnection,
    *,
    provider: str,
    body: bytes,
    truncated: bool,
    headers: Mapping[str, str],
    now: datetime,
) -> int:
    """Keep a raw notification as received; returns its inbox id."""
    result = await conn.execute(
        insert(notifications).values(
            provider=provider,
            received_at=now,
            headers=json.dumps(dict(headers), ensure_ascii=False, sort_keys=True),
            body=body,
            body_truncated=truncated,
            verified=False,
            outcome="received",
        )
    )
    return int(result.inserted_primary_key[0])  # type: ignore[index]


async def judge(
    conn: AsyncConnection,
    inbox_id: int,
    *,
    verified: bool,
    outcome: str,
    error: str | None = None,
    pay_no: str | None = None,
    event: str | None = None,
) -> None:
    """Record what became of a notification."""
    await conn.execute(
        update(notifications)
        .where(notifications.c.id == inbox_id)
        .values(
            verified=verified,
            outcome=outcome,
            error=error[:2000] if error else None,
            pay_no=pay_no[:32] if pay_no else None,
            event=event,
        )
    )


async def get(conn: AsyncConnection, inbox_id: int) -> Row[Any] | None:
    """One inbox row."""
    return (await conn.execute(select(notifications).where(notifications.c.id == inbox_id))).first()

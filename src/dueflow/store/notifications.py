"""Statements on the notification inbox: every raw notification, kept before it is judged."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Row, bindparam, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.store import hot
from dueflow.store.schema import notifications


def _param(name: str) -> Any:
    """A bind parameter ``p_<name>`` typed like the inbox column ``name`` (a parameter may not
    share its column's name in VALUES or SET)."""
    return bindparam(f"p_{name}", type_=notifications.c[name].type)


# Built once (every notification runs both): building and keying a statement per call costs
# more than executing it on SQLite. The verdict runs hot (store/hot.py); the insert stays Core,
# which gives back the new row's id on every dialect.
_STORE = insert(notifications).values(
    provider=_param("provider"),
    received_at=_param("received_at"),
    headers=_param("headers"),
    body=_param("body"),
    body_truncated=_param("body_truncated"),
    verified=False,
    outcome="received",
)
_JUDGE = hot.Hot(
    update(notifications)
    .where(notifications.c.id == bindparam("p_id", type_=notifications.c.id.type))
    .values(
        verified=_param("verified"),
        outcome=_param("outcome"),
        error=_param("error"),
        pay_no=_param("pay_no"),
        event=_param("event"),
    )
)


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
        _STORE,
        {
            "p_provider": provider,
            "p_received_at": now,
            "p_headers": json.dumps(dict(headers), ensure_ascii=False, sort_keys=True),
            "p_body": body,
            "p_body_truncated": truncated,
        },
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
    await _JUDGE.rowcount(
        conn,
        p_id=inbox_id,
        p_verified=verified,
        p_outcome=outcome,
        p_error=error[:2000] if error else None,
        p_pay_no=pay_no[:32] if pay_no else None,
        p_event=event,
    )


async def get(conn: AsyncConnection, inbox_id: int) -> Row[Any] | None:
    """One inbox row."""
    return (await conn.execute(select(notifications).where(notifications.c.id == inbox_id))).first()

"""Statements on the notification inbox: every raw notification, kept with its verdict."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Row, bindparam, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.store.schema import notifications


def _param(name: str) -> Any:
    """A bind parameter ``p_<name>`` typed like the inbox column ``name`` (a parameter may not
    share its column's name in VALUES or SET)."""
    return bindparam(f"p_{name}", type_=notifications.c[name].type)


@dataclass(frozen=True)
class Received:
    """A raw notification as it came: what its inbox row keeps besides its verdict."""

    provider: str
    body: bytes
    truncated: bool
    headers: Mapping[str, str]
    at: datetime


# Built once (every notification runs it): building and keying a statement per call costs
# more than executing it on SQLite. It stays Core, which gives back the new row's id on every
# dialect.
_KEEP = insert(notifications).values(
    provider=_param("provider"),
    received_at=_param("received_at"),
    headers=_param("headers"),
    body=_param("body"),
    body_truncated=_param("body_truncated"),
    verified=_param("verified"),
    outcome=_param("outcome"),
    error=_param("error"),
    pay_no=_param("pay_no"),
    event=_param("event"),
)


async def keep(
    conn: AsyncConnection,
    received: Received,
    *,
    verified: bool,
    outcome: str,
    error: str | None = None,
    pay_no: str | None = None,
    event: str | None = None,
) -> int:
    """Keep a raw notification with what became of it (in the transaction of what it caused,
    or on its own when it caused nothing); returns its inbox id."""
    result = await conn.execute(
        _KEEP,
        {
            "p_provider": received.provider,
            "p_received_at": received.at,
            "p_headers": json.dumps(dict(received.headers), ensure_ascii=False, sort_keys=True),
            "p_body": received.body,
            "p_body_truncated": received.truncated,
            "p_verified": verified,
            "p_outcome": outcome,
            "p_error": error[:2000] if error else None,
            "p_pay_no": pay_no[:32] if pay_no else None,
            "p_event": event,
        },
    )
    return int(result.inserted_primary_key[0])  # type: ignore[index]


async def get(conn: AsyncConnection, inbox_id: int) -> Row[Any] | None:
    """One inbox row."""
    return (await conn.execute(select(notifications).where(notifications.c.id == inbox_id))).first()

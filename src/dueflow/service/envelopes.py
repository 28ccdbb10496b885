"""The envelope: one shape for every order event (the feed, the events webhook) and every buyer
notice (the notifier), docs/events.md:

``{"id", "type", "version", "created_at", "actor", "data", "order"}``

- ``id``: ``evt_<seq>`` for an event, ``ntc_<reminder id>`` for a notice (the same on every
  retry and replay: receivers drop repeats by it);
- ``type``: :class:`~dueflow.domain.events.EventType`; ``version``: the envelope's;
- ``actor``: who did it (:func:`~dueflow.domain.events.actor_of`);
- ``data``: what is particular to the type, structured, stored with the event when it was
  written (a move adds ``from_status`` and ``to_status``; a cancel its ``reason``);
- ``order``: the order after the event, as ``GET /api/orders/{id}`` shows it (its fields,
  lines, tickets, payments and refunds), stored with the event in its transaction; null only
  for events written before the envelope existed.

Every value is JSON already (the webhook bodies are encoded with :mod:`json`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import Row

from dueflow.domain.events import CANCEL_TYPES, ENVELOPE_VERSION, EventType, actor_of
from dueflow.store import snapshots

#: The actor of a buyer notice: the notifier sends it on its own.
NOTIFIER = "notifier"


def event_id(seq: int) -> str:
    """An event's id in the feed and the webhook (prefixed, so it never equals a notice's)."""
    return f"evt_{seq}"


def notice_id(reminder_id: int) -> str:
    """A buyer notice's id (the same on every resend of it)."""
    return f"ntc_{reminder_id}"


def envelope(row: Row[Any]) -> dict[str, Any]:
    """The envelope of a numbered order event (a row of ``order_events``)."""
    data: dict[str, Any] = orjson.loads(row.data) if row.data else {}
    if row.from_status is not None:
        data["from_status"] = row.from_status
    if row.to_status is not None:
        data["to_status"] = row.to_status
    if row.event in CANCEL_TYPES:
        data["reason"] = row.event
    return {
        "id": event_id(row.seq),
        "type": row.event,
        "version": ENVELOPE_VERSION,
        "created_at": row.at.isoformat(),
        "actor": actor_of(row.actor),
        "data": data,
        "order": orjson.loads(row.snapshot) if row.snapshot else None,
    }


def notice(
    *,
    reminder_id: int,
    kind: str,
    created_at: datetime,
    order: Mapping[str, Any],
    data: Mapping[str, Any],
) -> dict[str, Any]:
    """The envelope of a buyer notice (``pay_reminder``, ``order_closed``) about ``order`` (its
    snapshot as the notice is sent). ``data`` and ``order`` become JSON values in one encode
    and one decode (a herd sends thousands of notices a second)."""
    native = orjson.loads(snapshots.encode({"data": data, "order": order}))
    return {
        "id": notice_id(reminder_id),
        "type": EventType(kind).value,
        "version": ENVELOPE_VERSION,
        "created_at": created_at.isoformat(),
        "actor": actor_of(NOTIFIER),
        "data": native["data"],
        "order": native["order"],
    }

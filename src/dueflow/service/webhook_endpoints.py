"""Webhook endpoints made over the API, the CLI or the admin page: each with its URL, its own
``whsec_`` secret, a filter of event types (none: every event), enabled or not, and its own
delivery stream (position, backlog, failures, next try, last error) that
:mod:`dueflow.service.webhooks` delivers.

A new endpoint receives the events numbered after it was made (its stream starts at the last
seq); older ones reach it by a replay. Its secret is shown once, in the answer that made it (at
creation and at each rotation); it is kept as given, since it signs every send, and never
logged or shown again. After a rotation the old secret signs too for a while (both signatures in
``webhook-signature``), so a receiver moves to the new one without refusing a message.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.domain.events import NOTICE_TYPES, EventType
from dueflow.exceptions import InvalidInput, NotFound
from dueflow.notifiers import addresses, signing
from dueflow.service import lists, webhooks
from dueflow.service.deps import Deps
from dueflow.store import events as event_store
from dueflow.store import webhook_endpoints as store

log = logging.getLogger(__name__)

#: The types an endpoint's filter may name: every order event type (the buyer notices are not
#: sent to endpoints: the notifier sends them).
FILTER_TYPES = frozenset(t.value for t in EventType if t not in NOTICE_TYPES)
MAX_TYPES = 50
#: How long the old secret signs beside the new one after a rotation, unless told otherwise.
ROTATION_OVERLAP = timedelta(hours=24)
MAX_OVERLAP = timedelta(days=7)
MAX_DESCRIPTION = 200


def checked_types(types: Sequence[str] | None) -> tuple[str, ...] | None:
    """An event-type filter as stored: None (or empty) for every event.

    Raises:
        InvalidInput: a type that is not an order event's
            (:class:`~dueflow.domain.events.EventType`, a buyer notice's neither), or over 50
            of them.
    """
    if not types:
        return None
    if len(types) > MAX_TYPES:
        raise InvalidInput(f"event_types: at most {MAX_TYPES}", field="event_types")
    found = set()
    for n, name in enumerate(types):
        at = f"event_types[{n}]"
        if not isinstance(name, str):
            raise InvalidInput(f"event_types: {name!a} is not an event type", field=at)
        value = str(name)  # an EventType's value
        if value in NOTICE_TYPES:
            raise InvalidInput(
                f"event_types: {value!a} is a buyer notice (the notifier sends it), "
                "not an order event",
                field=at,
            )
        if value not in FILTER_TYPES:
            raise InvalidInput(
                f"event_types: {value!a} is not an order event type (docs/events.md lists them)",
                field=at,
            )
        found.add(value)
    return tuple(sorted(found))


def _description(text: str | None) -> str | None:
    if text is not None and (len(text) > MAX_DESCRIPTION or not text.isprintable()):
        raise InvalidInput(
            f"description: one line of at most {MAX_DESCRIPTION} characters", field="description"
        )
    return text or None


def view(row: Row[Any], now: datetime) -> dict[str, Any]:
    """An endpoint as the API shows it: never its secret."""
    rotating = row.previous_secret is not None and row.previous_until is not None
    return {
        "id": row.id,
        "url": row.url,
        "event_types": list(store.types_of(row) or []) or None,
        "enabled": bool(row.enabled),
        "description": row.description,
        "created_by": row.created_by,
        "created_at": row.created_at,
        "updated_at": row.updated_at,
        "previous_secret_until": row.previous_until
        if rotating and row.previous_until > now
        else None,
    }


async def _stream(conn: AsyncConnection, row: Row[Any]) -> dict[str, Any]:
    """Where an endpoint's deliveries stand."""
    live = await event_store.live_cursor(conn, row.id)
    replays = [r for r in await event_store.cursor_rows(conn, row.id) if r.until_seq is not None]
    return {
        "delivered_seq": int(live.delivered_seq) if live is not None else 0,
        "backlog": await event_store.backlog(conn, row.id, store.types_of(row)),
        "failures": int(live.failures) if live is not None else 0,
        "retry_at": live.retry_at if live is not None else None,
        "last_error": live.last_error if live is not None else None,
        "last_error_at": live.last_error_at if live is not None else None,
        "replays": len(replays),
    }


async def _found(conn: AsyncConnection, endpoint_id: int) -> Row[Any]:
    row = await store.get(conn, endpoint_id)
    if row is None:
        raise NotFound(f"no webhook endpoint {endpoint_id}")
    return row


async def create(
    deps: Deps,
    *,
    url: str,
    event_types: Sequence[str] | None = None,
    description: str | None = None,
    actor: str,
) -> dict[str, Any]:
    """Make an endpoint; the answer holds its secret (shown only here).

    Raises:
        UnsafeURL: not http(s), or it names or resolves to a private, loopback, link-local or
            reserved address (unless allowed); nothing is made.
        InvalidInput: a bad event type or description; nothing is made.
    """
    types = checked_types(event_types)
    text = _description(description)
    await addresses.check_url(url, allow_private=deps.webhook_allow_private)
    secret = signing.new_secret()
    now = deps.clock.now()
    async with deps.db.write() as conn:
        endpoint_id = await store.add(
            conn, url=url, secret=secret, types=types, description=text, by=actor, now=now
        )
        start = await event_store.last_seq(conn)
        await event_store.ensure_live(conn, now, endpoint_id, start=start)
        row = await _found(conn, endpoint_id)
    log.info("webhook endpoint %s made by %s", endpoint_id, actor)
    return {**view(row, now), "secret": secret}


async def show(deps: Deps, endpoint_id: int) -> dict[str, Any]:
    """One endpoint and where its deliveries stand.

    Raises:
        NotFound: no such endpoint.
    """
    async with deps.db.report() as conn:
        row = await _found(conn, endpoint_id)
        return {**view(row, deps.clock.now()), "status": await _stream(conn, row)}


async def page(deps: Deps, *, after: str | None, limit: int) -> lists.Page:
    """Endpoints newest first, each with where its deliveries stand; paged by cursor."""
    if not 1 <= limit <= lists.MAX_LIMIT:
        raise InvalidInput(f"limit: from 1 to {lists.MAX_LIMIT}", field="limit")
    scope = {"list": "webhook_endpoints"}
    below = lists.read_cursor(after, scope)
    now = deps.clock.now()
    async with deps.db.report() as conn:
        rows = await store.page(conn, below=below, limit=limit)
        items = [{**view(r, now), "status": await _stream(conn, r)} for r in rows[:limit]]
    more = len(rows) > limit
    return lists.Page(items, lists.make_cursor(items[-1]["id"], scope) if more else None)


async def update(
    deps: Deps,
    endpoint_id: int,
    *,
    changes: dict[str, Any],
    actor: str,
) -> dict[str, Any]:
    """Change an endpoint's ``url``, ``event_types`` (None or empty: every event),
    ``enabled`` or ``description`` (only the keys given).

    Raises:
        NotFound: no such endpoint.
        UnsafeURL, InvalidInput: a bad value; nothing is changed.
    """
    values: dict[str, Any] = {}
    if "event_types" in changes:
        values["event_types"] = store.types_text(checked_types(changes["event_types"]))
    if "description" in changes:
        values["description"] = _description(changes["description"])
    if changes.get("enabled") is not None:
        values["enabled"] = bool(changes["enabled"])
    if changes.get("url") is not None:
        values["url"] = await addresses.check_url(
            str(changes["url"]), allow_private=deps.webhook_allow_private
        )
    now = deps.clock.now()
    async with deps.db.write() as conn:
        await _found(conn, endpoint_id)
        if values:
            await store.change(conn, endpoint_id, now, **values)
        row = await _found(conn, endpoint_id)
    log.info("webhook endpoint %s changed by %s: %s", endpoint_id, actor, ", ".join(values))
    return view(row, now)


async def rotate(
    deps: Deps, endpoint_id: int, *, keep_old_for: timedelta = ROTATION_OVERLAP, actor: str
) -> dict[str, Any]:
    """Give an endpoint a new secret (in the answer, shown only there); the old one signs too
    for ``keep_old_for`` (0: no more at once).

    Raises:
        NotFound: no such endpoint.
        InvalidInput: ``keep_old_for`` below 0 or over 7 days.
    """
    if not timedelta(0) <= keep_old_for <= MAX_OVERLAP:
        raise InvalidInput("keep_old_for: from 0 to 7 days")
    secret = signing.new_secret()
    now = deps.clock.now()
    until = now + keep_old_for if keep_old_for else None
    async with deps.db.write() as conn:
        await _found(conn, endpoint_id)
        await store.rotate(conn, endpoint_id, secret=secret, keep_old_until=until, now=now)
        row = await _found(conn, endpoint_id)
    log.info("webhook endpoint %s: secret rotated by %s", endpoint_id, actor)
    return {**view(row, now), "secret": secret}


async def delete(deps: Deps, endpoint_id: int, *, actor: str) -> None:
    """Delete an endpoint and its streams (what it has not delivered is not sent).

    Raises:
        NotFound: no such endpoint.
    """
    async with deps.db.write() as conn:
        if not await store.remove(conn, endpoint_id):
            raise NotFound(f"no webhook endpoint {endpoint_id}")
    log.info("webhook endpoint %s deleted by %s", endpoint_id, actor)


async def replay(
    deps: Deps, endpoint_id: int, *, first: int, last: int | None = None, actor: str
) -> str:
    """Deliver the events ``first`` to ``last`` again to this endpoint
    (:func:`dueflow.service.webhooks.replay`)."""
    return await webhooks.replay(deps, first=first, last=last, actor=actor, endpoint_id=endpoint_id)

"""Order events out: the sequencer that numbers them in commit order and the feed
(docs/events.md tells the host's side). The webhook's deliveries are in
:mod:`dueflow.service.webhooks`, which also starts the sequencer's loop.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Row

from dueflow.service import envelopes
from dueflow.service.deps import Deps
from dueflow.store import events as store

log = logging.getLogger(__name__)

#: Events numbered per sequencer transaction (a bounded, short lock on the counter). A herd
#: writes two events a cancel, thousands a second: at 500 the sequencer took a write
#: transaction (four statements) per 250 cancels; the numbering is one UPDATE by one array
#: parameter either way, so a larger batch costs the same per event and fewer transactions.
SEQUENCE_BATCH = 2000
#: Pauses of both loops: short while there was work, growing to the idle one without.
BUSY_PAUSE = timedelta(milliseconds=100)
IDLE_PAUSE = timedelta(seconds=1)
#: A failed delivery is tried again after 1 s, doubling up to 60 s, until it is delivered.
FIRST_RETRY = timedelta(seconds=1)
MAX_RETRY = timedelta(seconds=60)


def delivery_id(seq: int) -> str:
    """An event's id in the feed and the webhook's ``X-Dueflow-Delivery`` (prefixed, so it
    never equals a notice's id at a receiver that takes both)."""
    return envelopes.event_id(seq)


def event_json(row: Row[Any]) -> dict[str, Any]:
    """An event as the feed and the webhook send it: its envelope
    (:func:`dueflow.service.envelopes.envelope`)."""
    return envelopes.envelope(row)


def backoff(failures: int) -> timedelta:
    """The wait before the next try of an event that failed ``failures + 1`` times in a row."""
    return min(MAX_RETRY, FIRST_RETRY * (1 << min(failures, 16)))


# --- the sequencer ---------------------------------------------------------------------------


async def sequence(deps: Deps, *, limit: int = SEQUENCE_BATCH) -> int:
    """Number up to ``limit`` committed events in commit order; returns how many. With none to
    number it is one read (no write lock taken)."""
    async with deps.db.read() as conn:
        if not await store.unnumbered(conn):
            return 0
    async with deps.db.write() as conn:
        return await store.number_committed(conn, limit=limit)


async def run_sequencer(
    deps: Deps, stop: asyncio.Event, wake: asyncio.Event, numbered: asyncio.Event | None = None
) -> None:
    """Number events until ``stop``: every 100 ms while there are some, backing off to every
    second without; ``numbered`` is set after each run that numbered some."""
    pause = BUSY_PAUSE
    errors = 0
    while not stop.is_set():
        try:
            count = await sequence(deps)
        except Exception as exc:
            errors += 1
            log_failure("numbering order events", exc, errors)
            await pause_until(deps, deps.clock.now() + backoff(errors - 1), wake, stop)
            continue
        errors = 0
        if count and numbered is not None:
            numbered.set()
        if count >= SEQUENCE_BATCH:
            continue
        pause = BUSY_PAUSE if count else min(IDLE_PAUSE, pause * 2)
        await pause_until(deps, deps.clock.now() + pause, wake, stop)


def log_failure(doing: str, exc: Exception, errors: int) -> None:
    """The first failure in a row with its traceback, the rest in one line each (a database
    that is down for an hour must not fill the log with the same traceback every second)."""
    if errors == 1:
        log.exception("%s failed; trying again with backoff", doing)
    else:
        log.warning("%s failed %d times in a row: %s: %s", doing, errors, type(exc).__name__, exc)


async def pause_until(
    deps: Deps, until: datetime, wake: asyncio.Event, stop: asyncio.Event
) -> None:
    """Wait until ``until`` or ``wake`` (which :func:`start` also sets at ``stop``)."""
    if not wake.is_set():
        await deps.clock.sleep_until(until, wake)
    if not stop.is_set():
        wake.clear()


# --- the feed --------------------------------------------------------------------------------


async def feed(
    deps: Deps, *, after: int, limit: int, user_id: int | None = None
) -> list[dict[str, Any]]:
    """The numbered events after seq ``after``, in seq order; with ``user_id`` only those of
    that user's orders (as buyer or seller). One indexed read."""
    found, _ = await feed_page(deps, after=after, limit=limit, user_id=user_id)
    return found


async def feed_page(
    deps: Deps, *, after: int, limit: int, user_id: int | None = None
) -> tuple[list[dict[str, Any]], int]:
    """:func:`feed`, and the seq to read after next time. A short page moves that past every
    event numbered when the read began, even others' (scoped) or none: every seq up to the
    counter read first is visible to the read that follows it, so nothing is skipped, and a
    reader with few events does not scan the same stretch of the table on every poll."""
    async with deps.db.read() as conn:
        numbered = await store.last_seq(conn)
        rows = await store.after(conn, after, limit=limit, user_id=user_id)
    found = [event_json(r) for r in rows]
    last = int(rows[-1].seq) if rows else after
    if len(found) < limit:
        last = max(last, numbered)
    return found, last

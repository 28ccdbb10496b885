"""The webhook's deliveries with their retries and replays (docs/events.md tells the host's
side).

Every process that runs the worker runs :func:`start`: the sequencer loop
(:func:`dueflow.service.events.run_sequencer`), and with a webhook URL the delivery loop. Both
survive errors (logged, tried again) and stop with the worker.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow import tracing
from dueflow.exceptions import BackendUnavailable, InvalidInput, InvalidTransition, NotFound
from dueflow.notifiers.event_webhook import EventWebhook, Target
from dueflow.service import events
from dueflow.service.deps import Deps
from dueflow.store import events as store
from dueflow.store import orders
from dueflow.store import webhook_endpoints as endpoint_store

log = logging.getLogger(__name__)

#: Events one delivery pass sends per stream before it looks at the others again.
DELIVERY_BATCH = 50
#: How long the delivering process keeps the right to deliver without renewing it (it renews
#: after every event; a send times out well within it).
LEASE = timedelta(seconds=30)


# --- webhook deliveries ----------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """One endpoint a pass delivers to: the settings' one (``id`` None) or one made over the
    API, with its event-type filter (None: every event)."""

    id: int | None
    target: Target
    types: tuple[str, ...] | None = None

    @property
    def label(self) -> str:
        """How the log names it (never by its URL, which may carry a token)."""
        return "events webhook" if self.id is None else f"webhook endpoint {self.id}"


@dataclass
class Stream:
    """Where one delivery stream stands while a pass works on it."""

    id: int
    name: str
    delivered_seq: int
    until_seq: int | None
    failures: int

    @classmethod
    def of(cls, row: Row[Any]) -> Stream:
        """The stream of a cursor row."""
        return cls(row.id, row.name, row.delivered_seq, row.until_seq, row.failures)

    @property
    def replay(self) -> bool:
        """An operator's replay (not the live stream)."""
        return self.until_seq is not None


class _LeaseLost(Exception):
    """Another process took over the deliveries (this one stalled past its lease)."""


def endpoint_of(row: Row[Any], now: datetime) -> Endpoint:
    """An API-made endpoint as a pass delivers to it: signed by its secret and, for a while
    after a rotation, by the previous one too; its addresses checked at every send."""
    keys = [row.secret]
    if row.previous_secret and row.previous_until is not None and row.previous_until > now:
        keys.append(row.previous_secret)
    target = Target(row.url, tuple(keys), checked=True)
    return Endpoint(row.id, target, endpoint_store.types_of(row))


class Deliverer:
    """Delivers the events to every endpoint in seq order, one at a time per endpoint, each
    until delivered; the endpoints apart, so one that is down holds up no other. One process
    delivers to an endpoint at a time (a lease on its live cursor); the others stand by."""

    def __init__(self, deps: Deps, webhook: EventWebhook) -> None:
        self.deps = deps
        self.webhook = webhook
        self.name = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"[:64]
        #: Set by :meth:`run`'s ``stop``: a pass ends after the event in flight.
        self._stop: asyncio.Event | None = None

    async def run(self, stop: asyncio.Event, wake: asyncio.Event) -> None:
        """Deliver until ``stop``; woken by ``wake`` when new events were numbered."""
        self._stop = stop
        errors = 0
        try:
            while not stop.is_set():
                try:
                    until = await self.deliver_once()
                    errors = 0
                except Exception as exc:
                    errors += 1
                    events.log_failure("delivering order events", exc, errors)
                    until = self.deps.clock.now() + events.backoff(errors - 1)
                if until is not None:
                    await events.pause_until(self.deps, until, wake, stop)
        finally:
            await self._step_down()

    async def endpoints(self, now: datetime) -> list[Endpoint]:
        """The settings' endpoint (if any) and the enabled ones made over the API (one read)."""
        found = []
        if self.webhook.configured is not None:
            found.append(Endpoint(None, self.webhook.configured))
        async with self.deps.db.read() as conn:
            rows = await endpoint_store.enabled(conn)
        return found + [endpoint_of(row, now) for row in rows]

    async def deliver_once(self) -> datetime | None:
        """One pass over every endpoint's streams; returns when to look again (None: at once,
        more is waiting). Nothing to deliver to is one read."""
        now = self.deps.clock.now()
        idle = now + events.IDLE_PAUSE
        endpoints = await self.endpoints(now)
        if not endpoints:
            return idle
        held: list[tuple[Endpoint, list[Row[Any]]]] = []
        async with self.deps.db.write() as conn:
            if endpoints[0].id is None:
                await store.ensure_live(conn, now)
            for endpoint in endpoints:
                if await store.take_lease(
                    conn, self.name, now=now, lease=LEASE, endpoint_id=endpoint.id
                ):
                    held.append((endpoint, await store.cursor_rows(conn, endpoint.id)))
        found = await asyncio.gather(*(self._deliver(e, rows, now) for e, rows in held))
        if None in found:
            return None
        return min([idle, *(at for at in found if at is not None)])

    async def _deliver(
        self, endpoint: Endpoint, rows: list[Row[Any]], now: datetime
    ) -> datetime | None:
        """Send one endpoint's streams (its live one first, then its replays); when to look
        again (None: at once)."""
        wake_at = now + events.IDLE_PAUSE
        more = False
        for row in rows:
            if row.retry_at is not None and row.retry_at > now:
                wake_at = min(wake_at, row.retry_at)
                continue
            try:
                sent, retry_at = await self._send_stream(endpoint, Stream.of(row))
            except _LeaseLost:
                return now + events.IDLE_PAUSE
            more = more or sent == DELIVERY_BATCH
            if retry_at is not None:
                wake_at = min(wake_at, retry_at)
        return None if more else wake_at

    async def _send_stream(self, endpoint: Endpoint, stream: Stream) -> tuple[int, datetime | None]:
        """Send the stream's next events (those of the endpoint's types) in order; stops at the
        first failure. Returns how many were delivered and, after a failure, when to try
        again. A short read moves the stream past every event numbered before it (the ones the
        filter left out, and the end of a replay's range)."""
        async with self.deps.db.read() as conn:
            numbered = await store.last_seq(conn)
            rows = await store.after(
                conn,
                stream.delivered_seq,
                limit=DELIVERY_BATCH,
                until=stream.until_seq,
                types=endpoint.types,
            )
        for sent, row in enumerate(rows):
            if self._stop is not None and self._stop.is_set():
                return sent, None  # stopping: the rest waits for the next process
            try:
                with tracing.span(
                    "webhook deliver",
                    kind=tracing.CLIENT,
                    attributes={"dueflow.event.seq": row.seq, "dueflow.webhook": endpoint.label},
                    links=(row.trace_parent,),
                    root=True,
                ):  # a failed delivery ends it with the error
                    await self.webhook.deliver(
                        events.event_json(row), replay=stream.replay, target=endpoint.target
                    )
            except BackendUnavailable as exc:
                return sent, await self._failed(endpoint, stream, row.seq, exc.message)
            await self._advance(endpoint, stream, row.seq)
            self.deps.metrics.event_deliveries.labels(
                "replayed" if stream.replay else "delivered"
            ).inc()
        if len(rows) < DELIVERY_BATCH:
            end = numbered if stream.until_seq is None else min(numbered, stream.until_seq)
            if end > stream.delivered_seq:
                await self._advance(endpoint, stream, end)
        return len(rows), None

    async def _advance(self, endpoint: Endpoint, stream: Stream, seq: int) -> None:
        now = self.deps.clock.now()
        async with self.deps.db.write() as conn:
            if not await store.take_lease(
                conn, self.name, now=now, lease=LEASE, endpoint_id=endpoint.id
            ):
                raise _LeaseLost
            if not await store.advance(
                conn,
                stream.id,
                from_seq=stream.delivered_seq,
                to_seq=seq,
                until_seq=stream.until_seq,
                now=now,
            ):
                raise _LeaseLost
        stream.delivered_seq, stream.failures = seq, 0

    async def _failed(self, endpoint: Endpoint, stream: Stream, seq: int, error: str) -> datetime:
        self.deps.metrics.event_deliveries.labels("failed").inc()
        now = self.deps.clock.now()
        retry_at = now + events.backoff(stream.failures)
        log.warning(
            "%s: %s not delivered (%s); next try in %s",
            endpoint.label,
            events.delivery_id(seq),
            error,
            retry_at - now,
        )
        async with self.deps.db.write() as conn:
            await store.failed(
                conn,
                stream.id,
                at_seq=stream.delivered_seq,
                error=error,
                retry_at=retry_at,
                now=now,
            )
        return retry_at

    async def _step_down(self) -> None:
        """Give the leases back (another process takes over at once) and close the client."""
        try:
            async with self.deps.db.write() as conn:
                await store.give_up_lease(conn, self.name)
        except Exception as exc:  # the leases then simply run out
            log.warning("could not give back the events leases: %s", exc)
        await self.webhook.close()


def start(deps: Deps, webhook: EventWebhook | None, stop: asyncio.Event) -> list[asyncio.Task[Any]]:
    """The event loops of a process that runs the worker: the sequencer and, with a webhook,
    the deliveries (woken when events are numbered). They end once ``stop`` is set."""
    numbered = asyncio.Event()
    wake = asyncio.Event()
    tasks = [asyncio.create_task(events.run_sequencer(deps, stop, wake, numbered))]
    if webhook is not None:
        tasks.append(asyncio.create_task(Deliverer(deps, webhook).run(stop, numbered)))
    tasks.append(asyncio.create_task(_wake_at_stop(stop, (wake, numbered))))
    return tasks


async def _wake_at_stop(stop: asyncio.Event, wakes: tuple[asyncio.Event, ...]) -> None:
    await stop.wait()
    for event in wakes:
        event.set()


# --- operators -------------------------------------------------------------------------------


async def replay(
    deps: Deps, *, first: int, last: int | None = None, actor: str, endpoint_id: int | None = None
) -> str:
    """Deliver the events ``first`` to ``last`` (by seq; one event without ``last``) again to
    one endpoint (None: the settings' one), as separate deliveries with the same ids; those
    its filter leaves out are not sent. Returns what was queued.

    Raises:
        InvalidInput: an empty range, or one past the last numbered event.
        NotFound: no such endpoint.
    """
    at = "first" if last is None else "last"
    last = first if last is None else last
    if not 1 <= first <= last:
        raise InvalidInput(
            "a replay goes from a first event to a last one, both from 1 up", field=at
        )
    now = deps.clock.now()
    async with deps.db.write() as conn:
        await _endpoint_row(conn, endpoint_id)
        newest = await store.last_seq(conn)
        if last > newest:
            raise InvalidInput(
                f"there is no event {events.delivery_id(last)} yet (the last is {newest})",
                field=at,
            )
        name = f"replay-{now:%Y%m%d%H%M%S}-{secrets.token_hex(4)}"
        await store.add_replay(conn, name, first, last, by=actor, now=now, endpoint_id=endpoint_id)
    what = (
        events.delivery_id(first)
        if first == last
        else f"{events.delivery_id(first)} to {events.delivery_id(last)}"
    )
    return f"{what} queued to be delivered again"


async def _endpoint_row(conn: AsyncConnection, endpoint_id: int | None) -> Row[Any] | None:
    """The API-made endpoint ``endpoint_id`` (None for the settings' one).

    Raises:
        NotFound: there is no such endpoint.
    """
    if endpoint_id is None:
        return None
    row = await endpoint_store.get(conn, endpoint_id)
    if row is None:
        raise NotFound(f"no webhook endpoint {endpoint_id}")
    return row


async def skip(deps: Deps, *, seq: int, actor: str, endpoint_id: int | None = None) -> str:
    """Give up on the event the webhook is stuck on (a host that refuses it for good would hold
    every later event back forever): the live position moves past it. The event stays in the
    feed and can be replayed; the skip is logged and written as an ``event_skipped`` event of
    its order, which the host is sent next. Returns what was done.

    Raises:
        InvalidTransition: no webhook stream, or ``seq`` is not the event it waits on (it was
            delivered meanwhile, or another is first).
        NotFound: no such endpoint.
    """
    now = deps.clock.now()
    async with deps.db.write() as conn:
        row = await _endpoint_row(conn, endpoint_id)
        live = await store.live_cursor(conn, endpoint_id)
        if live is None:
            raise InvalidTransition("no events webhook has delivered anything to skip in")
        types = endpoint_store.types_of(row) if row is not None else None
        waiting = await store.after(conn, int(live.delivered_seq), limit=1, types=types)
        if not waiting or waiting[0].seq != seq:
            first = events.delivery_id(waiting[0].seq) if waiting else "nothing"
            raise InvalidTransition(f"the webhook waits on {first}, not {events.delivery_id(seq)}")
        moved = await store.advance(
            conn, live.id, from_seq=int(live.delivered_seq), to_seq=seq, until_seq=None, now=now
        )
        if not moved:
            raise InvalidTransition(f"{events.delivery_id(seq)} was delivered meanwhile")
        detail = f"{events.delivery_id(seq)} skipped by the events webhook"
        await orders.record_events(
            conn, [waiting[0].order_id], event="event_skipped", actor=actor, now=now, detail=detail
        )
    log.warning("events webhook: %s skipped by %s", events.delivery_id(seq), actor)
    return f"{events.delivery_id(seq)} skipped; the webhook goes on with the next event."


@dataclass
class DeliveryStatus:
    """Where the webhook's deliveries stand, for the admin pages."""

    live: dict[str, Any] | None
    last_seq: int
    unnumbered: int
    backlog: int
    replays: list[dict[str, Any]] = field(default_factory=list)


async def delivery_status(deps: Deps) -> DeliveryStatus:
    """The live stream's cursor (None: no process has had a webhook URL), the pending replays,
    the last seq and the backlog."""
    async with deps.db.report() as conn:
        rows = await store.cursor_rows(conn)
        live = await store.live_cursor(conn)
        return DeliveryStatus(
            live=dict(live._mapping) if live is not None else None,
            last_seq=await store.last_seq(conn),
            unnumbered=await store.count_unnumbered(conn),
            backlog=await store.backlog(conn),
            replays=[dict(r._mapping) for r in rows if r.name != store.LIVE],
        )

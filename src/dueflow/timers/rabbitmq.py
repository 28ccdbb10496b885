"""The ``rabbitmq`` trigger: delay-level queues with a fixed TTL, dead-lettered to a due queue.

Topology (declared idempotently on first use, all durable)::

    {prefix}.delay.{ms}   one per level, x-message-ttl = ms, dead-lettered ("" exchange) to
    {prefix}.due          what the workers consume

Classic queues by default; ``?queues=quorum`` declares replicated quorum queues instead
(RabbitMQ 3.10+), whose levels dead-letter at least once (``x-dead-letter-strategy``, with
``x-overflow=reject-publish`` as RabbitMQ requires for it). A queue's type cannot change: where a
queue of the same name exists as the other kind, declaring fails with an error naming the queue
and what to do (delete the prefix's queues, or use another prefix).

A timer due in ``remaining`` is published, as a persistent message ``{"id", "due_at"}``, to the
largest level not above ``remaining`` (straight to the due queue when it is below the smallest
level). Every message of a level queue has the same TTL, so they expire in order and no message
ever waits behind a longer one. When a message reaches the due queue early, the consumer
re-publishes a fresh copy to the largest level that fits what is left and acks the original:
hops are explicit re-publishes, never dead-letter chains (which RabbitMQ may drop as cycles).

What is left below the smallest level (under 100 ms) is neither re-published (that would spin
through the due queue) nor sent to the 100 ms level (up to 100 ms late): the consumer holds the
message un-acked and hands the id over when its due time comes, so lateness stays at the
broker's TTL precision. Held and handed-over messages stay un-acked until :meth:`ack`: a worker
killed before that loses nothing, RabbitMQ redelivers them (the database claim drops repeats).
Ids handed over and not acked within ``redeliver_after`` (a worker loop that failed before its
ack) are given back to RabbitMQ, so that they cannot use up the prefetch and stall the trigger.

A batch of timers is published concurrently, straight on the AMQP channel (no socket drain
between messages), and its publisher confirms are awaited together. Acks go out in as few
frames as can be: one ``multiple`` ack for the settled deliveries below every delivery still
held, in flight or not yet seen, single acks for the rest (see ``_Tags``).

Only timers due within ``horizon`` are published; the feeder hands over the rest as they come
near. Losing the queues costs lateness, never a deadline: the scanner fires what was lost.

URL: ``amqp://user:pass@host:5672/vhost?prefix=dueflow&horizon=2h&connect_timeout=5s``, with
``&queues=quorum`` for quorum queues (``amqps://`` for TLS; other query options go to aio-pika).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime, timedelta

from aio_pika.abc import AbstractIncomingMessage
from aio_pika.exceptions import ChannelInvalidStateError
from aiormq.abc import AbstractChannel

from dueflow.clock import Clock
from dueflow.exceptions import BackendUnavailable
from dueflow.timers._rabbitmq_link import BROKER_ERRORS, TROUBLE, RabbitLink

# The settings' defaults, re-exported.
from dueflow.timers._rabbitmq_link import DEFAULT_HORIZON as DEFAULT_HORIZON
from dueflow.timers._rabbitmq_link import DEFAULT_PREFIX as DEFAULT_PREFIX
from dueflow.timers._rabbitmq_link import DEFAULT_QUEUES as DEFAULT_QUEUES
from dueflow.timers._rabbitmq_link import DEFAULT_URL as DEFAULT_URL
from dueflow.timers._rabbitmq_link import PUBLISH_CHUNK as PUBLISH_CHUNK
from dueflow.timers._rabbitmq_link import RETRY_AFTER as RETRY_AFTER

# The wire and the URL options, re-exported (``rabbitmq.choose_level``, ``rabbitmq.LEVELS_MS``).
from dueflow.timers._rabbitmq_url import parse_url
from dueflow.timers._rabbitmq_wire import LEVELS_MS as LEVELS_MS
from dueflow.timers._rabbitmq_wire import _Held
from dueflow.timers._rabbitmq_wire import _Tags as _Tags
from dueflow.timers._rabbitmq_wire import choose_level as choose_level
from dueflow.timers._rabbitmq_wire import decode as decode
from dueflow.timers._rabbitmq_wire import encode as encode

log = logging.getLogger(__name__)
#: How long ``wait`` pauses after trouble before returning nothing (the scanner covers).
ERROR_PAUSE = timedelta(milliseconds=500)


class RabbitTrigger(RabbitLink):
    """Fixed-TTL delay-level queues on RabbitMQ, hopping down by explicit re-publish.

    The connection, topology and publishing are :class:`RabbitLink`'s; this class consumes:
    it sorts deliveries, holds and hands over due ids, and settles the messages."""

    scheme = "amqp"
    polls_database = False

    @classmethod
    def from_url(cls, url: str, *, clock: Clock | None = None) -> RabbitTrigger:
        """``amqp[s]://user:pass@host:port/vhost?prefix=..&horizon=2h&connect_timeout=5s``;
        ``prefetch`` and ``batch`` take counts, ``queues`` is ``classic`` (the default) or
        ``quorum``; other query options go to aio-pika.

        Raises:
            ConfigError: Not an amqp:// URL, or a malformed option.
        """
        plain, options = parse_url(url)
        return cls(url=plain, clock=clock, **options)

    # -- consuming -----------------------------------------------------------------------------

    def _notify(self) -> None:
        """Wake every pending wait (a message arrived, or wake())."""
        event, self._changed = self._changed, asyncio.Event()
        if event is not None:
            event.set()

    async def _ensure_consumer(self) -> None:
        if self._consumer is not None:
            return
        await self._channel()  # connects and declares the topology
        assert self._lock is not None and self._connection is not None
        async with self._lock:
            if self._consumer is not None:
                return
            channel = await self._connection.channel(publisher_confirms=False)
            try:
                await channel.set_qos(prefetch_count=self.prefetch)
                queue = await channel.declare_queue(
                    self.due_queue, durable=True, arguments=self.due_arguments()
                )
                await queue.consume(self._on_message, no_ack=False)
            except BaseException:
                with contextlib.suppress(*BROKER_ERRORS):
                    await channel.close()
                raise
            self._consumer = channel

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        """Sort a delivery: due (keep for a worker), due within the smallest level (hold until
        due), or further away (re-publish to the level that fits, then ack)."""
        self._delivered(message)
        try:
            timer = decode(message.body)
        except ValueError:
            log.warning("dropping a message that is not a timer: %r", message.body[:80])
            await self._reject([message], requeue=False)
            return
        now = self._consumer_clock.now()
        level = choose_level(timer.due_at - now)
        if level is None:
            if timer.due_at <= now:
                self._ready.append((timer.id, message))
            else:
                heapq.heappush(self._held, _Held(timer.due_at, next(self._seq), timer.id, message))
            self._notify()
            return
        try:
            channel = await self._underlay()
            await self._publish(channel, timer, self.level_queue(level))
        except Exception as exc:
            # Keep it un-acked and hand it over when due: late by nothing, held in memory
            # only while RabbitMQ is in trouble (and bounded by the prefetch).
            log.warning("could not re-arm timer %d (%s); holding it until due", timer.id, exc)
            heapq.heappush(self._held, _Held(timer.due_at, next(self._seq), timer.id, message))
            self._notify()
            return
        # Acked with the others re-armed at about the same time, in as few frames as can be.
        self._rearmed.append(message)
        if self._rearm_acks is None or self._rearm_acks.done():
            self._rearm_acks = asyncio.create_task(self._ack_rearmed())

    async def _ack_rearmed(self) -> None:
        await asyncio.sleep(0)  # let the confirms that came in together join
        while self._rearmed:
            messages, self._rearmed = self._rearmed, []
            errors = await self._ack_all(messages)
            if errors:
                log.info(
                    "could not ack %d re-armed timers (%s): they come back as duplicates",
                    len(messages),
                    errors[0],
                )

    # -- settling deliveries -------------------------------------------------------------------

    def _delivered(self, message: AbstractIncomingMessage) -> None:
        try:
            channel = message.channel
        except ChannelInvalidStateError:
            return
        tags = self._tags.get(channel)
        if tags is None:
            for closed in [c for c in self._tags if c.is_closed]:
                del self._tags[closed]
            tags = self._tags[channel] = _Tags()
        assert message.delivery_tag is not None
        tags.delivered(message.delivery_tag)

    def _settling(self) -> asyncio.Lock:
        if self._settle_lock is None:
            self._settle_lock = asyncio.Lock()
        return self._settle_lock

    async def _ack_all(self, messages: Iterable[AbstractIncomingMessage]) -> list[Exception]:
        """Ack these deliveries, many in one ``multiple`` ack where that is safe; the errors.

        A delivery whose channel closed is skipped: RabbitMQ has already put it back."""
        by_channel: dict[AbstractChannel, set[int]] = defaultdict(set)
        for message in messages:
            try:
                channel = message.channel
            except ChannelInvalidStateError:
                continue
            assert message.delivery_tag is not None
            by_channel[channel].add(message.delivery_tag)
        errors: list[Exception] = []
        async with self._settling():
            for channel, tags in by_channel.items():
                known = self._tags.get(channel)
                frames = known.ack_frames(tags) if known else [(t, False) for t in sorted(tags)]
                for tag, multiple in frames:
                    try:
                        await channel.basic_ack(tag, multiple=multiple, wait=False)
                    except ChannelInvalidStateError:
                        break  # its channel closed: RabbitMQ has already put them back
                    except Exception as exc:
                        errors.append(exc)
        return errors

    async def _reject(self, messages: Iterable[AbstractIncomingMessage], *, requeue: bool) -> None:
        """Give deliveries back (``requeue``) or drop them, one by one; trouble is ignored (a
        channel in trouble closes, and RabbitMQ puts its deliveries back)."""
        async with self._settling():
            for message in messages:
                try:
                    known = self._tags.get(message.channel)
                except ChannelInvalidStateError:
                    continue
                tag = message.delivery_tag
                if known is not None and tag is not None:
                    if tag not in known.unsettled:
                        continue  # settled already
                    known.unsettled.discard(tag)
                with contextlib.suppress(*BROKER_ERRORS):
                    await message.reject(requeue=requeue)

    def _take_ready(self, now: datetime) -> list[int]:
        while self._held and self._held[0].due_at <= now:
            held = heapq.heappop(self._held)
            self._ready.append((held.timer_id, held.message))
        ids: list[int] = []
        while self._ready and len(ids) < self.batch:
            timer_id, message = self._ready.popleft()
            handed = self._handed.get(timer_id)
            if handed is None:
                self._handed[timer_id] = [message]
                self._handed_at[timer_id] = time.monotonic()
                ids.append(timer_id)
            else:  # a repeat (armed and fed, or redelivered): acked with the first
                handed.append(message)
        return ids

    def _forget(self, timer_ids: Iterable[int]) -> Iterator[AbstractIncomingMessage]:
        """Take these ids off the handed-over list; their messages."""
        for timer_id in set(timer_ids):
            self._handed_at.pop(timer_id, None)
            yield from self._handed.pop(timer_id, ())

    async def _give_back_stale(self) -> None:
        """Give back (requeue) what was handed over and not acked within ``redeliver_after``."""
        cutoff = time.monotonic() - self.redeliver_after
        stale = [timer_id for timer_id, at in self._handed_at.items() if at <= cutoff]
        if not stale:
            return
        log.warning("%d timers handed over were not acked; giving them back", len(stale))
        await self._reject(list(self._forget(stale)), requeue=True)

    async def wait(self, clock: Clock, until: datetime) -> Sequence[int] | None:
        """Hand over the ids of timers that are due, as soon as there are some (up to
        ``batch``); else wait until ``until`` or :meth:`wake` and return []. Never raises for
        RabbitMQ trouble: it logs, pauses briefly and returns [] (the scanner covers)."""
        self._consumer_clock = clock
        start_gen = self._wake_seen
        try:
            return await self._wait(clock, until, start_gen)
        except Exception as exc:
            self._handled_error("wait")
            if isinstance(exc, TROUBLE):
                log.warning("rabbitmq trigger cannot consume: %s", exc)
            else:
                log.exception("rabbitmq trigger failed while waiting")
            await clock.sleep_until(min(until, clock.now() + ERROR_PAUSE), None)
            return []

    async def _wait(self, clock: Clock, until: datetime, start_gen: int) -> list[int]:
        await self._ensure_consumer()
        await self._give_back_stale()
        while True:
            if self._changed is None:
                self._changed = asyncio.Event()
            changed = self._changed
            now = clock.now()
            ids = self._take_ready(now)
            if ids:
                return ids
            if self._wake_gen != start_gen:
                self._wake_seen = self._wake_gen
                return []
            if now >= until or self._closed:
                return []
            wake_at = min(until, self._held[0].due_at) if self._held else until
            await clock.sleep_until(wake_at, changed)

    def wake(self) -> None:
        """Release every pending wait now; with none pending, the next one returns at once."""
        self._wake_gen += 1
        self._notify()

    async def ack(self, timer_ids: Sequence[int]) -> None:
        """Ack the messages of handed-over timers (repeats included).

        Raises:
            BackendUnavailable: an ack could not be sent (the message comes back later).
        """
        messages = list(self._forget(timer_ids))
        if not messages:
            return
        errors = await self._ack_all(messages)
        if errors:
            first = errors[0]
            raise BackendUnavailable(
                f"could not ack {len(errors)} timer messages: {type(first).__name__}: {first}"
            ) from first

    async def close(self) -> None:
        """Close the channels and the connection; un-acked messages go back to RabbitMQ."""
        self._closed = True
        connection, self._connection = self._connection, None
        channels = [self._consumer, self._publisher]
        self._consumer = self._publisher = None
        self._ready.clear()
        self._held.clear()
        self._handed.clear()
        self._handed_at.clear()
        self._rearmed.clear()
        self._tags.clear()
        rearm_acks, self._rearm_acks = self._rearm_acks, None
        if rearm_acks is not None:
            rearm_acks.cancel()
        for channel in channels:
            if channel is not None:
                with contextlib.suppress(*BROKER_ERRORS):
                    await channel.close()
        if connection is not None:
            with contextlib.suppress(*BROKER_ERRORS):
                await connection.close()
        self._notify()

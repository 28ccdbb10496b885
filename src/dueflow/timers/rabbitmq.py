"""The ``rabbitmq`` trigger: delay-level queues with a fixed TTL, dead-lettered to a due queue.

Topology (declared idempotently on first use, all durable)::

    {prefix}.delay.{ms}   one per level, x-message-ttl = ms, dead-lettered ("" exchange) to
    {prefix}.due          what the workers consume

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

URL: ``amqp://user:pass@host:5672/vhost?prefix=dueflow&horizon=2h&connect_timeout=5s``
(``amqps://`` for TLS; other query options go to aio-pika).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import re
import time
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime, timedelta

import aio_pika
from aio_pika.abc import (
    AbstractIncomingMessage,
    AbstractRobustChannel,
    AbstractRobustConnection,
)
from aio_pika.exceptions import CONNECTION_EXCEPTIONS, ChannelInvalidStateError
from aiormq import Channel as AmqpChannel
from aiormq.abc import AbstractChannel, DeliveredMessage
from pamqp.commands import Basic

from dueflow.clock import Clock, SystemClock
from dueflow.exceptions import BackendUnavailable, ConfigError
from dueflow.store.timers import Armed

# The wire and the URL options, re-exported (``rabbitmq.choose_level``, ``rabbitmq.LEVELS_MS``).
from dueflow.timers._rabbitmq_url import parse_url, safe_url
from dueflow.timers._rabbitmq_wire import LEVELS_MS as LEVELS_MS
from dueflow.timers._rabbitmq_wire import _Held
from dueflow.timers._rabbitmq_wire import _Tags as _Tags
from dueflow.timers._rabbitmq_wire import choose_level as choose_level
from dueflow.timers._rabbitmq_wire import decode as decode
from dueflow.timers._rabbitmq_wire import encode as encode
from dueflow.timers.base import Trigger

log = logging.getLogger(__name__)


DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"
DEFAULT_PREFIX = "dueflow"
DEFAULT_HORIZON = timedelta(hours=2)
#: After a failed connection attempt, calls fail at once for this long instead of each waiting
#: for the connection timeout (a black-holed broker must not slow every request down).
RETRY_AFTER = 1.0
#: How long ``wait`` pauses after trouble before returning nothing (the scanner covers).
ERROR_PAUSE = timedelta(milliseconds=500)
_PREFIX = re.compile(r"[A-Za-z0-9_.:-]{1,200}")
#: Publishes awaiting their confirms at once; a feed of thousands goes in chunks of this many.
PUBLISH_CHUNK = 500
_ERRORS: tuple[type[BaseException], ...] = (*CONNECTION_EXCEPTIONS, TimeoutError)
_TROUBLE: tuple[type[BaseException], ...] = (*_ERRORS, BackendUnavailable)


class RabbitTrigger(Trigger):
    """Fixed-TTL delay-level queues on RabbitMQ, hopping down by explicit re-publish."""

    scheme = "amqp"
    polls_database = False

    def __init__(
        self,
        *,
        url: str = DEFAULT_URL,
        prefix: str = DEFAULT_PREFIX,
        horizon: timedelta = DEFAULT_HORIZON,
        connect_timeout: float = 5.0,
        publish_timeout: float = 5.0,
        prefetch: int = 2000,
        batch: int = 1000,
        redeliver_after: timedelta = timedelta(seconds=60),
        clock: Clock | None = None,
    ) -> None:
        """``clock`` tells the publishing side the time (``wait`` uses the clock it is given)."""
        if not _PREFIX.fullmatch(prefix):
            raise ConfigError(
                f"bad rabbitmq trigger prefix {prefix!r}: use letters, digits and _ . : -"
            )
        if horizon <= timedelta(0):
            raise ConfigError("the rabbitmq trigger's horizon must be positive")
        if prefetch < 1 or batch < 1:
            raise ConfigError("the rabbitmq trigger's prefetch and batch must be positive")
        self.url = url
        self.prefix = prefix
        self.horizon: timedelta | None = horizon
        self.connect_timeout = connect_timeout
        self.publish_timeout = publish_timeout
        self.prefetch = prefetch
        self.batch = batch
        self.redeliver_after = redeliver_after.total_seconds()
        self.clock: Clock = clock or SystemClock()
        self.due_queue = f"{prefix}.due"

        self._connection: AbstractRobustConnection | None = None
        self._publisher: AbstractRobustChannel | None = None
        self._consumer: AbstractRobustChannel | None = None
        self._lock: asyncio.Lock | None = None
        self._down_until = 0.0  # monotonic; fail fast until then after a failed connect
        self._closed = False
        # Consuming: the clock of the latest wait, messages due now (in arrival order), messages
        # due within the smallest level (by due time), and what was handed over, by timer id.
        self._consumer_clock: Clock = self.clock
        self._ready: deque[tuple[int, AbstractIncomingMessage]] = deque()
        self._held: list[_Held] = []
        self._handed: dict[int, list[AbstractIncomingMessage]] = {}
        self._handed_at: dict[int, float] = {}  # monotonic
        self._seq = itertools.count()
        # Settling (see _Tags): per consuming AMQP channel, its deliveries; acks are sent under
        # one lock so that a multiple ack never overtakes a single one it would cover.
        self._tags: dict[AbstractChannel, _Tags] = {}
        self._settle_lock: asyncio.Lock | None = None
        # Re-armed deliveries waiting to be acked together, and the task acking them.
        self._rearmed: list[AbstractIncomingMessage] = []
        self._rearm_acks: asyncio.Task[None] | None = None
        self._changed: asyncio.Event | None = None
        self._wake_gen = 0
        self._wake_seen = 0

    @classmethod
    def from_url(cls, url: str, *, clock: Clock | None = None) -> RabbitTrigger:
        """``amqp[s]://user:pass@host:port/vhost?prefix=..&horizon=2h&connect_timeout=5s``;
        ``prefetch`` and ``batch`` take counts; other query options go to aio-pika.

        Raises:
            ConfigError: Not an amqp:// URL, or a malformed option.
        """
        plain, options = parse_url(url)
        return cls(url=plain, clock=clock, **options)

    # -- topology ------------------------------------------------------------------------------

    def level_queue(self, level_ms: int) -> str:
        """The name of the queue for ``level_ms``."""
        return f"{self.prefix}.delay.{level_ms}"

    @property
    def queue_names(self) -> list[str]:
        """Every queue this trigger declares: the due queue, then the levels."""
        return [self.due_queue, *(self.level_queue(ms) for ms in LEVELS_MS)]

    def _queue_for(self, timer: Armed, now: datetime) -> str:
        level = choose_level(timer.due_at - now)
        return self.due_queue if level is None else self.level_queue(level)

    async def _declare(self, channel: AbstractRobustChannel) -> None:
        # The due queue first, so that nothing expires into a queue that is not there yet.
        await channel.declare_queue(self.due_queue, durable=True)
        for ms in LEVELS_MS:
            await channel.declare_queue(
                self.level_queue(ms),
                durable=True,
                arguments={
                    "x-message-ttl": ms,
                    "x-dead-letter-exchange": "",
                    "x-dead-letter-routing-key": self.due_queue,
                },
            )

    # -- connection ----------------------------------------------------------------------------

    async def _channel(self) -> AbstractRobustChannel:
        """The publishing channel, connecting and declaring the topology on first use.

        Raises:
            BackendUnavailable: RabbitMQ cannot be reached (or could not be, moments ago).
        """
        if self._publisher is not None:
            return self._publisher
        if self._closed:
            raise BackendUnavailable("the rabbitmq trigger is closed")
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._publisher is not None:
                return self._publisher
            if time.monotonic() < self._down_until:
                raise BackendUnavailable(
                    f"RabbitMQ at {safe_url(self.url)} was unreachable just now"
                )
            connection: AbstractRobustConnection | None = None
            try:
                connection = await aio_pika.connect_robust(self.url, timeout=self.connect_timeout)
                channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
                await self._declare(channel)
            except _ERRORS as exc:
                self._down_until = time.monotonic() + RETRY_AFTER
                if connection is not None:
                    with contextlib.suppress(*_ERRORS):
                        await connection.close()
                raise BackendUnavailable(
                    f"RabbitMQ at {safe_url(self.url)} is unavailable: {type(exc).__name__}: {exc}"
                ) from exc
            self._connection = connection
            self._publisher = channel
            return channel

    # -- publishing ----------------------------------------------------------------------------

    async def _underlay(self) -> AmqpChannel:
        """The open AMQP channel under the publishing channel (bounded by the publish timeout
        while a dropped connection is being restored)."""
        channel = await self._channel()
        if channel.is_closed:
            raise ChannelInvalidStateError("the rabbitmq trigger's publishing channel is closed")
        async with asyncio.timeout(self.publish_timeout):
            underlay = await channel.get_underlay_channel()
        assert isinstance(underlay, AmqpChannel)
        return underlay

    async def _publish(self, channel: AmqpChannel, timer: Armed, queue: str) -> None:
        """Publish one timer (persistent, mandatory) and wait for RabbitMQ's confirm.

        Straight on the AMQP channel, without waiting for the socket to drain between messages:
        the channel lock is held only to queue the frames, so concurrent publishes go out
        back to back and their confirms are awaited together (aio-pika's ``publish`` drains
        after every message while holding the lock, one message per round trip)."""
        properties = Basic.Properties(
            content_type="application/json",
            delivery_mode=2,  # persistent
            message_id=str(timer.id),
        )
        result = await channel.basic_publish(
            encode(timer),
            exchange="",
            routing_key=queue,
            properties=properties,
            mandatory=True,
            timeout=self.publish_timeout,
            wait=False,
        )
        if isinstance(result, DeliveredMessage):  # returned: only if on_return_raises is off
            raise BackendUnavailable(f"RabbitMQ returned timer {timer.id}: no queue {queue!r}")

    async def armed(self, timers: Sequence[Armed]) -> None:
        """Publish the timers due within the horizon, each to the largest level that fits.

        Raises:
            BackendUnavailable: RabbitMQ is unreachable, or refused or returned a message.
        """
        if not timers:
            return
        assert self.horizon is not None
        if all(t.due_at > self.clock.now() + self.horizon for t in timers):
            return
        try:
            channel = await self._underlay()
        except _ERRORS as exc:
            raise BackendUnavailable(
                f"RabbitMQ cannot take timers now: {type(exc).__name__}: {exc}"
            ) from exc
        now = self.clock.now()  # after connecting, which may have taken a while
        limit = now + self.horizon
        todo = [t for t in timers if t.due_at <= limit]
        if not todo:
            return
        results: list[object] = []
        for start in range(0, len(todo), PUBLISH_CHUNK):  # bounded confirms in flight
            results += await asyncio.gather(
                *(
                    self._publish(channel, t, self._queue_for(t, now))
                    for t in todo[start : start + PUBLISH_CHUNK]
                ),
                return_exceptions=True,
            )
        failures = [r for r in results if isinstance(r, BaseException)]
        if not failures:
            return
        for failure in failures:
            if not isinstance(failure, Exception):
                raise failure  # cancelled: not ours to swallow
        first = failures[0]
        if not isinstance(first, _TROUBLE):
            raise first
        raise BackendUnavailable(
            f"RabbitMQ did not take {len(failures)} of {len(todo)} timers: "
            f"{type(first).__name__}: {first}"
        ) from first

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
                queue = await channel.declare_queue(self.due_queue, durable=True)
                await queue.consume(self._on_message, no_ack=False)
            except BaseException:
                with contextlib.suppress(*_ERRORS):
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
                with contextlib.suppress(*_ERRORS):
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
            if isinstance(exc, _TROUBLE):
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

    async def feed(self, timers: Sequence[Armed]) -> None:
        await self.armed(timers)

    async def ping(self) -> None:
        """RabbitMQ holds the publishing channel open (connecting first if need be).

        Raises:
            BackendUnavailable: it cannot be reached, or the channel is closed.
        """
        channel = await self._channel()
        if channel.is_closed:
            raise BackendUnavailable(f"RabbitMQ at {safe_url(self.url)}: the channel is closed")

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
                with contextlib.suppress(*_ERRORS):
                    await channel.close()
        if connection is not None:
            with contextlib.suppress(*_ERRORS):
                await connection.close()
        self._notify()

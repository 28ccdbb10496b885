"""The RabbitMQ trigger's link to the broker: its settings, the connection (failing fast for
``RETRY_AFTER`` after a failed connect), the topology (the due queue and one fixed-TTL queue per
level, classic or quorum queues) and publishing (straight on the AMQP channel, confirms awaited
together), with the state the consumer keeps beside them.

Private to :mod:`dueflow.timers.rabbitmq`, whose :class:`~dueflow.timers.rabbitmq.RabbitTrigger`
consumes on top of it and re-exports the settings' defaults.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import time
from collections import deque
from collections.abc import Sequence
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
from aiormq.exceptions import ChannelPreconditionFailed
from pamqp.commands import Basic

from dueflow.clock import Clock, SystemClock
from dueflow.exceptions import BackendUnavailable, ConfigError
from dueflow.store.timers import Armed
from dueflow.timers._rabbitmq_url import QUEUE_KINDS, queue_kind, safe_url
from dueflow.timers._rabbitmq_wire import LEVELS_MS, _Held, _Tags, choose_level, encode
from dueflow.timers.base import Trigger

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"
DEFAULT_PREFIX = "dueflow"
DEFAULT_HORIZON = timedelta(hours=2)
DEFAULT_QUEUES = QUEUE_KINDS[0]
#: After a failed connection attempt, calls fail at once for this long instead of each waiting
#: for the connection timeout (a black-holed broker must not slow every request down).
RETRY_AFTER = 1.0
_PREFIX = re.compile(r"[A-Za-z0-9_.:-]{1,200}")
#: Publishes awaiting their confirms at once; a feed of thousands goes in chunks of this many.
PUBLISH_CHUNK = 500
BROKER_ERRORS: tuple[type[BaseException], ...] = (*CONNECTION_EXCEPTIONS, TimeoutError)
TROUBLE: tuple[type[BaseException], ...] = (*BROKER_ERRORS, BackendUnavailable)


class RabbitLink(Trigger):
    """Settings, connection, topology and publishing of a RabbitMQ trigger; its consumer's
    state is set up here too, so that every field is declared in one place."""

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
        queues: str = DEFAULT_QUEUES,
        clock: Clock | None = None,
    ) -> None:
        """``queues`` is the kind of queue declared (``classic`` or ``quorum``); ``clock`` tells
        the publishing side the time (``wait`` uses the clock it is given)."""
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
        self.queues = queue_kind(queues)
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
        self._down_because = ""  # why it failed, said again while failing fast
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

    def due_arguments(self) -> dict[str, str | int]:
        """The due queue's arguments: none for a classic queue (as before quorum queues were
        offered, so that queues declared then stay equivalent)."""
        return {"x-queue-type": "quorum"} if self.queues == "quorum" else {}

    def level_arguments(self, level_ms: int) -> dict[str, str | int]:
        """A level queue's arguments: its TTL, dead-lettered to the due queue.

        A quorum queue dead-letters at least once (it keeps an expired message until the due
        queue has confirmed it; at most once, the default, may drop it on the way), which
        RabbitMQ does only where the queue rejects publishes when full rather than drop its
        head. No length limit is set, so nothing is ever rejected."""
        arguments: dict[str, str | int] = {
            **self.due_arguments(),
            "x-message-ttl": level_ms,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": self.due_queue,
        }
        if self.queues == "quorum":
            arguments["x-dead-letter-strategy"] = "at-least-once"
            arguments["x-overflow"] = "reject-publish"
        return arguments

    async def _declare(self, channel: AbstractRobustChannel) -> None:
        # The due queue first, so that nothing expires into a queue that is not there yet.
        await self._declare_queue(channel, self.due_queue, self.due_arguments())
        for ms in LEVELS_MS:
            await self._declare_queue(channel, self.level_queue(ms), self.level_arguments(ms))

    async def _declare_queue(
        self, channel: AbstractRobustChannel, name: str, arguments: dict[str, str | int]
    ) -> None:
        """Declare one durable queue (never exclusive nor auto-deleted: quorum queues refuse
        both).

        Raises:
            BackendUnavailable: RabbitMQ refused it: a queue of that name exists with another
                type or other arguments (a queue's type cannot change).
        """
        try:
            await channel.declare_queue(name, durable=True, arguments=arguments)
        except ChannelPreconditionFailed as exc:
            raise BackendUnavailable(
                f"RabbitMQ refused the {self.queues} queue {name!r}: {exc}. A queue of that name "
                f"exists with another type or other arguments, and a queue's type cannot change: "
                f"delete this prefix's queues once no process uses them (rabbitmqctl "
                f"delete_queue {name}, and the other {self.prefix}.* queues), or give the "
                f"trigger another prefix (?prefix=...). See docs/deploy.md."
            ) from exc

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
                raise BackendUnavailable(f"{self._down_because} (moments ago; not tried again)")
            connection: AbstractRobustConnection | None = None
            try:
                connection = await aio_pika.connect_robust(self.url, timeout=self.connect_timeout)
                channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
                await self._declare(channel)
            except TROUBLE as exc:
                failure = (
                    exc
                    if isinstance(exc, BackendUnavailable)
                    else BackendUnavailable(
                        f"RabbitMQ at {safe_url(self.url)} is unavailable: "
                        f"{type(exc).__name__}: {exc}"
                    )
                )
                self._down_until = time.monotonic() + RETRY_AFTER
                self._down_because = str(failure)
                if connection is not None:
                    with contextlib.suppress(*BROKER_ERRORS):
                        await connection.close()
                raise failure from exc
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
        except BROKER_ERRORS as exc:
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
        if not isinstance(first, TROUBLE):
            raise first
        raise BackendUnavailable(
            f"RabbitMQ did not take {len(failures)} of {len(todo)} timers: "
            f"{type(first).__name__}: {first}"
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

"""The ``redis`` trigger: due times in a sorted set, claimed by one Lua script with a lease.

Keys (``prefix`` defaults to ``dueflow``):

``{prefix}:due``
    sorted set; member = timer id, score = due time in epoch milliseconds (rounded up, so a
    timer Redis calls due is due in the database too).
``{prefix}:processing``
    sorted set; member = timer id, score = when the worker's lease on it runs out (epoch ms).
    A worker that dies between taking ids and acknowledging them leaves them here; the next
    claim after the lease moves them back to ``due``.
``{prefix}:wake``
    a short list of markers. Arming pushes one, so a worker blocked in BLPOP looks again when a
    new, possibly earlier, timer arrives.
``{prefix}:fed``
    a marker the feeders set once: found missing, Redis has lost what it was fed since
    (:meth:`RedisTrigger.lost`), and the feeder that found it so feeds every timer again. Every
    claim looks for it too, so a restart or flush is seen within a claim, not a feeder pass.
``{prefix}:wake:{random}``
    one per trigger instance, blocked on together with the shared list: the instance pushes a
    marker to it to end its own BLPOP early (its clock says the head is due before Redis's
    timeout fires, which can be a server tick late, or :meth:`RedisTrigger.wake` was called),
    without cancelling the command (which would cost a reconnect). It expires by itself.

Only timers due within ``horizon`` (default 1 h) are put into Redis; the feeder hands over the
rest as they come within it. Redis is never the truth: losing every key costs lateness (the
scanner fires what is overdue), never a deadline, and every delivery is claimed again in the
database, which drops timers that are done, cancelled or not yet due.

URL: ``redis://host:6379/0?horizon=1h&prefix=dueflow&lease=60s&batch=1000``; the four options
are taken out, everything else is passed to :meth:`redis.asyncio.Redis.from_url` (keep any
``socket_timeout`` above ``max_idle``: the trigger blocks in BLPOP for up to that long).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.client import Redis
from redis.asyncio.connection import parse_url
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from dueflow.clock import Clock, SystemClock
from dueflow.domain.deadlines import parse_duration
from dueflow.exceptions import BackendUnavailable, ConfigError
from dueflow.store.timers import Armed
from dueflow.timers.base import Trigger

log = logging.getLogger(__name__)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MS = timedelta(milliseconds=1)
#: Wake markers kept in the list: enough to wake a few blocked workers, never a growing list.
WAKE_MARKERS = 4
#: The shortest BLPOP: a timeout of 0 would block forever.
MIN_BLOCK = 0.005
#: How long BLPOP gets to return after its own marker was pushed before it is cancelled (which
#: costs a reconnect).
POP_GRACE = 0.5
#: How long an instance's own marker list outlives its last push.
POKE_TTL_MS = 60_000
#: How long ``wait`` pauses after a Redis error (at most until its ``until``).
ERROR_PAUSE = timedelta(seconds=1)
#: Errors that mean "Redis is not answering".
REDIS_ERRORS = (RedisError, OSError)

#: KEYS: due, processing, wake, the instance's own wake list, fed. ARGV: now (ms), limit, lease
#: expiry (ms). Returns {1 if the fed marker is there else 0, ids}.
#: 1. Up to ``limit`` ids whose lease ran out go back to ``due`` (NX: an id armed again since
#:    keeps its newer score), due now.
#: 2. Up to ``limit`` ids due at ``now`` leave ``due`` for ``processing``, scored by the lease.
#: 3. Nothing taken: the wake markers are stale (a marker only stays in the list when no worker
#:    was blocked to pop it, and this script has just seen what it announced), and so are the
#:    caller's own, so they go; otherwise the caller's next BLPOP would return at once for
#:    nothing.
#: 4. Whether the fed marker is still there: gone, Redis lost what it was fed.
CLAIM_SCRIPT = """
local due, processing, wake, poke, fed = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local now = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local lease_until = tonumber(ARGV[3])
local expired = redis.call('ZRANGEBYSCORE', processing, '-inf', now, 'LIMIT', 0, limit)
for _, id in ipairs(expired) do
  redis.call('ZREM', processing, id)
  redis.call('ZADD', due, 'NX', now, id)
end
local ids = redis.call('ZRANGEBYSCORE', due, '-inf', now, 'LIMIT', 0, limit)
for _, id in ipairs(ids) do
  redis.call('ZREM', due, id)
  redis.call('ZADD', processing, lease_until, id)
end
if #ids == 0 then
  redis.call('DEL', wake, poke)
end
return {redis.call('EXISTS', fed), ids}
"""


def to_ms(when: datetime, *, up: bool = False) -> int:
    """Epoch milliseconds of an aware datetime, rounded down (or up)."""
    if up:
        return -((EPOCH - when) // MS)
    return (when - EPOCH) // MS


def from_ms(ms: float) -> datetime:
    """The aware UTC datetime of epoch milliseconds."""
    return EPOCH + timedelta(milliseconds=ms)


def _positive(name: str, text: str) -> timedelta:
    value = parse_duration(text)
    if value <= timedelta(0):
        raise ConfigError(f"redis trigger: {name} must be positive, not {text!r}")
    return value


class RedisTrigger(Trigger):
    """Due times in a Redis sorted set; workers block on a wake list until the head is due."""

    scheme = "redis"
    polls_database = False
    horizon: timedelta = timedelta(hours=1)

    def __init__(
        self,
        *,
        url: str = "redis://localhost:6379/0",
        prefix: str = "dueflow",
        horizon: timedelta = timedelta(hours=1),
        lease: timedelta = timedelta(seconds=60),
        batch: int = 1000,
        clock: Clock | None = None,
    ) -> None:
        if horizon <= timedelta(0) or lease <= timedelta(0):
            raise ConfigError("redis trigger: horizon and lease must be positive")
        if batch < 1:
            raise ConfigError(f"redis trigger: batch must be at least 1, not {batch}")
        if not prefix:
            raise ConfigError("redis trigger: prefix must not be empty")
        try:
            parse_url(url)
        except ValueError as exc:
            raise ConfigError(f"redis trigger: bad URL {url!r}: {exc}") from None
        self.url = url
        self.prefix = prefix
        self.horizon = horizon
        self.lease = lease
        self.batch = batch
        #: The clock for the horizon check in :meth:`armed` (``wait`` uses the worker's clock).
        self.clock: Clock = clock or SystemClock()
        self.due_key = f"{prefix}:due"
        self.processing_key = f"{prefix}:processing"
        self.wake_key = f"{prefix}:wake"
        self.fed_key = f"{prefix}:fed"
        self.poke_key = f"{prefix}:wake:{uuid.uuid4().hex}"
        #: Redis errors ``wait`` has swallowed (the scanner covered for them).
        self.errors = 0
        #: Redis failed this instance since :meth:`lost` was last answered: timers armed
        #: meanwhile may be missing, so the next answer is True.
        self._failed = False
        #: An arm of this instance failed: the next arm that goes through also deletes the
        #: ``fed`` marker, so the feeder of whichever process claims next feeds every timer
        #: again (an API process has no feeder of its own to tell).
        self._arm_failed = False
        self._client: Redis | None = None
        self._claim: AsyncScript | None = None
        self._wake: asyncio.Event | None = None

    @classmethod
    def from_url(cls, url: str, *, clock: Clock | None = None) -> RedisTrigger:
        """``redis://host:port/db?horizon=1h&prefix=dueflow&lease=60s&batch=1000``.

        Raises:
            ConfigError: a malformed option.
        """
        try:
            parts = urlsplit(url)
        except ValueError as exc:  # an unclosed IPv6 bracket, say
            raise ConfigError(f"redis trigger: bad URL {url!r}: {exc}") from None
        if parts.scheme != cls.scheme:
            raise ConfigError(f"not a redis trigger URL: {url!r}")
        options: dict[str, Any] = {}
        rest: list[tuple[str, str]] = []
        for name, value in parse_qsl(parts.query, keep_blank_values=True):
            if name in ("horizon", "lease"):
                options[name] = _positive(name, value)
            elif name == "prefix":
                options[name] = value
            elif name == "batch":
                try:
                    options[name] = int(value)
                except ValueError:
                    raise ConfigError(
                        f"redis trigger: batch must be a number, not {value!r}"
                    ) from None
            else:
                rest.append((name, value))
        plain = urlunsplit(parts._replace(query=urlencode(rest)))
        return cls(url=plain, clock=clock, **options)

    def _redis(self) -> Redis:
        """The client, made on first use inside the running loop."""
        if self._client is None:
            self._client = aioredis.Redis.from_url(self.url)
        return self._client

    def _script(self) -> AsyncScript:
        if self._claim is None:
            self._claim = self._redis().register_script(CLAIM_SCRIPT)
        return self._claim

    def _event(self) -> asyncio.Event:
        if self._wake is None:
            self._wake = asyncio.Event()
        return self._wake

    # -- arming -------------------------------------------------------------------------------

    async def armed(self, timers: Sequence[Armed]) -> None:
        """Put the timers due within the horizon into ``due`` and wake a blocked worker.

        Raises:
            BackendUnavailable: Redis did not answer (the caller logs it; the scanner covers).
        """
        if not timers:
            return
        limit = self.clock.now() + self.horizon
        mapping = {str(t.id): to_ms(t.due_at, up=True) for t in timers if t.due_at <= limit}
        if not mapping:
            return
        arm_failed = self._arm_failed
        try:
            async with self._redis().pipeline(transaction=True) as pipe:
                pipe.zadd(self.due_key, mapping)
                if arm_failed:
                    pipe.delete(self.fed_key)
                pipe.lpush(self.wake_key, "1")
                pipe.ltrim(self.wake_key, 0, WAKE_MARKERS - 1)
                await pipe.execute()
        except REDIS_ERRORS as exc:
            self._failed = self._arm_failed = True
            raise BackendUnavailable(f"redis trigger cannot arm timers: {exc}") from exc
        if arm_failed:
            self._arm_failed = False
            log.info("redis trigger: an earlier arm failed; the fed marker dropped for a feed")

    async def lost(self) -> bool:
        """True when the ``fed`` marker was missing (and is now set): Redis lost its keys since
        any feeder last asked, or this is the first ask; or when Redis failed this instance
        since its last answer (an arm may have failed). Redis trouble: False (the scanner
        covers due timers meanwhile; the next ask after Redis is back tells)."""
        try:
            fresh = bool(await self._redis().set(self.fed_key, "1", nx=True))
        except REDIS_ERRORS as exc:
            self._failed = True
            self.errors += 1
            self._handled_error("lost")
            log.warning("redis trigger cannot tell whether it lost its timers (%s)", exc)
            return False
        failed, self._failed = self._failed, False
        return fresh or failed

    # -- delivering ---------------------------------------------------------------------------

    async def claim(self, now: datetime) -> list[int]:
        """Run the claim script once: up to ``batch`` due ids, now leased to the caller. The
        ``fed`` marker gone, or Redis answering again after failing this instance, tells the
        feeder at once (:meth:`~dueflow.timers.base.Trigger.watch_lost`): the timers due
        before its next pass would wait for the scanner."""
        fed, ids = await self._script()(
            keys=[self.due_key, self.processing_key, self.wake_key, self.poke_key, self.fed_key],
            args=[to_ms(now), self.batch, to_ms(now + self.lease)],
        )
        if not fed or self._failed:
            self._seen_lost()
        return [int(member) for member in ids]

    async def next_at(self) -> datetime | None:
        """When the next claim could take something: the earliest due time or lease expiry."""
        async with self._redis().pipeline(transaction=False) as pipe:
            pipe.zrange(self.due_key, 0, 0, withscores=True)
            pipe.zrange(self.processing_key, 0, 0, withscores=True)
            heads = await pipe.execute()
        scores = [float(entries[0][1]) for entries in heads if entries]
        return from_ms(min(scores)) if scores else None

    async def wait(self, clock: Clock, until: datetime) -> Sequence[int] | None:
        """Claim what is due; if nothing is, block on the wake list until the head is due (at
        most until ``until``), a timer is armed, or :meth:`wake` is called, then claim again.

        Never raises for Redis trouble: it logs, pauses briefly and returns no ids (the scanner
        covers what is due meanwhile)."""
        event = self._event()
        try:
            if event.is_set():
                return []
            ids = await self.claim(clock.now())
            if ids or event.is_set():
                return ids
            head = await self.next_at()
            target = until if head is None or head > until else head
            if await self._block(clock, target, event):
                return []
            return await self.claim(clock.now())
        except REDIS_ERRORS as exc:
            self._failed = True
            self.errors += 1
            self._handled_error("wait")
            log.warning("redis trigger unavailable (%s); the scanner covers due timers", exc)
            await clock.sleep_until(min(until, clock.now() + ERROR_PAUSE), event)
            return []
        finally:
            event.clear()

    async def _block(self, clock: Clock, target: datetime, event: asyncio.Event) -> bool:
        """Block until ``target``, a wake marker or the event; True when the event woke us.

        BLPOP waits on the shared wake list and this instance's own one; its timeout (real
        seconds) is only the backstop. The clock's own sleep runs beside it: once that ends (the
        head is due by the clock, which a scaled or fake clock reaches sooner and Redis's timeout
        up to a server tick later, or :meth:`wake` was called), a marker pushed to the instance's
        own list ends the BLPOP at once."""
        seconds = max((target - clock.now()).total_seconds(), 0.0)
        seconds = max(round(seconds + 0.0005, 3), MIN_BLOCK)  # whole ms, never early
        keys = [self.wake_key, self.poke_key]
        pop = asyncio.ensure_future(self._redis().blpop(keys, timeout=seconds))
        sleeper = asyncio.ensure_future(clock.sleep_until(target, event))
        try:
            await asyncio.wait({pop, sleeper}, return_when=asyncio.FIRST_COMPLETED)
            if not pop.done():
                try:
                    await self._poke()
                except REDIS_ERRORS:
                    pass  # the BLPOP is cancelled below; the next claim reports the trouble
                else:
                    await asyncio.wait({pop}, timeout=POP_GRACE)
            if pop.done():
                pop.result()  # raise its error, if any
        finally:
            for task in (pop, sleeper):
                task.cancel()
            await asyncio.gather(pop, sleeper, return_exceptions=True)
        return event.is_set()

    async def _poke(self) -> None:
        """End this instance's pending BLPOP: a marker on its own wake list."""
        async with self._redis().pipeline(transaction=True) as pipe:
            pipe.lpush(self.poke_key, "1")
            pipe.pexpire(self.poke_key, POKE_TTL_MS)
            await pipe.execute()

    def wake(self) -> None:
        self._event().set()

    async def ack(self, timer_ids: Sequence[int]) -> None:
        """Forget delivered timers (handled, or dropped by the database claim).

        Raises:
            BackendUnavailable: Redis did not answer (their lease runs out and they come back;
                the database claim drops them then).
        """
        if not timer_ids:
            return
        try:
            await self._redis().zrem(self.processing_key, *(str(i) for i in timer_ids))
        except REDIS_ERRORS as exc:
            raise BackendUnavailable(f"redis trigger cannot acknowledge timers: {exc}") from exc

    async def ping(self) -> None:
        """Redis answers PING.

        Raises:
            BackendUnavailable: it does not.
        """
        try:
            await self._redis().ping()
        except REDIS_ERRORS as exc:
            raise BackendUnavailable(f"redis trigger unreachable: {exc}") from exc

    async def close(self) -> None:
        client, self._client, self._claim = self._client, None, None
        if client is not None:
            await client.aclose()

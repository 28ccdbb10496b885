"""The ``redis`` trigger: due times in sorted sets, claimed by one Lua script with a lease, on
one Redis server or spread over a Redis Cluster.

Keys, per shard (:mod:`dueflow.timers._redis_shards` names them; ``prefix`` defaults to
``dueflow``; one shard on one server: ``{prefix}:due`` and so on, shard ``k`` of several:
``{prefix:k}:due``, hash-tagged so a script's keys share a cluster slot):

``due``
    sorted set; member = timer id, score = due time in epoch milliseconds (rounded up, so a
    timer Redis calls due is due in the database too). A timer goes to shard ``id mod S``.
``processing``
    sorted set; member = timer id, score = when the worker's lease on it runs out (epoch ms).
    A worker that dies between taking ids and acknowledging them leaves them here; the next
    claim after the lease moves them back to ``due``.
``wake``
    a short list of markers. Arming pushes one, so a worker blocked in BLPOP looks again when a
    new, possibly earlier, timer arrives.
``fed``
    a marker the feeders set once: found missing, Redis has lost what it was fed since
    (:meth:`RedisTrigger.lost`), and the feeder that found it so feeds every timer again. Every
    claim looks for it too, so a restart, a flush or a failover that lost writes is seen within
    a claim, not a feeder pass.
``wake:{random}``
    one per trigger instance, blocked on together with the shared list: the instance pushes a
    marker to it to end its own BLPOP early (its clock says the head is due before Redis's
    timeout fires, which can be a server tick late, or :meth:`RedisTrigger.wake` was called),
    without cancelling the command (which would cost a reconnect). It expires by itself.

A worker claims every shard, or with ``?own=i/n`` the shards whose index mod n is i or i + 1
(at most ``ceil(batch / shards claimed)`` ids from each at once, all in one round trip of concurrent
scripts), and blocks on their wake lists at once (one BLPOP per shard: BLPOP takes several keys
only within one slot). A shard whose node fails makes only its own timers late: the others are
claimed meanwhile, and the scanner fires what is overdue.

Only timers due within ``horizon`` (default 1 h) are put into Redis; the feeder hands over the
rest as they come within it. Redis is never the truth: losing every key costs lateness (the
scanner fires what is overdue), never a deadline, and every delivery is claimed again in the
database, which drops timers that are done, cancelled or not yet due.

URL: ``redis://host:6379/0?horizon=1h&prefix=dueflow&lease=60s&batch=1000`` for one server,
``redis+cluster://host1:7000,host2:7001/?shards=8`` for a cluster (:mod:`dueflow.redis_url`;
``shards`` defaults to 1 on one server, 8 on a cluster). The trigger's options are taken out,
everything else is passed to redis-py (keep any ``socket_timeout`` above ``max_idle``: the
trigger blocks in BLPOP for up to that long). Changing ``shards`` is safe at any time: the
feeder feeds live timers under the new mapping, and stale ids in old shards are dropped by the
database claim.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from redis.commands.core import AsyncScript
from redis.exceptions import RedisClusterException, RedisError

from dueflow import redis_url
from dueflow.clock import Clock, SystemClock
from dueflow.exceptions import BackendUnavailable, ConfigError
from dueflow.store.timers import Armed
from dueflow.timers._redis_shards import (
    ARM_SCRIPT,
    CLAIM_SCRIPT,
    CLUSTER_SHARDS,
    MAX_SHARDS,
    Shard,
    from_ms,
    gather_all,
    owned_shards,
    split_url,
    to_ms,
)
from dueflow.timers.base import Trigger

__all__ = ["RedisTrigger", "from_ms", "to_ms"]

log = logging.getLogger(__name__)

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
REDIS_ERRORS = (RedisError, RedisClusterException, OSError)


class RedisTrigger(Trigger):
    """Due times in Redis sorted sets; workers block on wake lists until the head is due."""

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
        shards: int | None = None,
        own: tuple[int, int] | None = None,
        clock: Clock | None = None,
    ) -> None:
        if horizon <= timedelta(0) or lease <= timedelta(0):
            raise ConfigError("redis trigger: horizon and lease must be positive")
        if batch < 1:
            raise ConfigError(f"redis trigger: batch must be at least 1, not {batch}")
        if not prefix:
            raise ConfigError("redis trigger: prefix must not be empty")
        self.cluster = redis_url.is_cluster(url)
        count = shards if shards is not None else CLUSTER_SHARDS if self.cluster else 1
        if not 1 <= count <= MAX_SHARDS:
            raise ConfigError(f"redis trigger: shards must be 1 to {MAX_SHARDS}, not {count}")
        redis_url.check(url, "redis trigger")
        self.url = url
        self.prefix = prefix
        self.horizon = horizon
        self.lease = lease
        self.batch = batch
        #: The clock for the horizon check in :meth:`armed` (``wait`` uses the worker's clock).
        self.clock: Clock = clock or SystemClock()
        instance = uuid.uuid4().hex
        self.shards = tuple(
            Shard.named(prefix, k, count, cluster=self.cluster, instance=instance)
            for k in range(count)
        )
        #: The shards this instance claims and blocks on: all, or with ``own=(i, n)`` those
        #: whose index mod n is i or i + 1 (each shard claimed by two of n workers).
        self.owned = owned_shards(self.shards, own)
        #: Ids taken from each owned shard by one claim: the batch shared out.
        self.per_shard = math.ceil(batch / len(self.owned))
        #: Redis errors ``wait`` has swallowed (the scanner covered for them).
        self.errors = 0
        #: Redis failed this instance since :meth:`lost` was last answered: timers armed
        #: meanwhile may be missing, so the next answer is True.
        self._failed = False
        #: An arm of this instance failed: the next arm that goes through also deletes the
        #: ``fed`` markers of the shards it writes, so the feeder of whichever process claims
        #: next feeds every timer again (an API process has no feeder of its own to tell).
        self._arm_failed = False
        self._client: redis_url.Client | None = None
        self._claim: AsyncScript | None = None
        self._arm: AsyncScript | None = None
        self._wake: asyncio.Event | None = None
        self._logged_at = float("-inf")

    @classmethod
    def from_url(cls, url: str, *, clock: Clock | None = None) -> RedisTrigger:
        """``redis://host:port/db?horizon=1h&prefix=dueflow&lease=60s&batch=1000`` or
        ``redis+cluster://host:port,host:port/?shards=8&...``.

        Raises:
            ConfigError: a malformed option.
        """
        plain, options = split_url(url)
        return cls(url=plain, clock=clock, **options)

    @property
    def poke_key(self) -> str:
        """This instance's own wake list on the first shard (the one a single shard has)."""
        return self.shards[0].poke

    def shard_of(self, timer_id: int) -> Shard:
        return self.shards[timer_id % len(self.shards)]

    def _redis(self) -> redis_url.Client:
        """The client, made on first use inside the running loop."""
        if self._client is None:
            self._client = redis_url.connect(self.url)
        return self._client

    def _scripts(self) -> tuple[AsyncScript, AsyncScript]:
        if self._claim is None or self._arm is None:
            self._claim = self._redis().register_script(CLAIM_SCRIPT)
            self._arm = self._redis().register_script(ARM_SCRIPT)
        return self._claim, self._arm

    def _event(self) -> asyncio.Event:
        if self._wake is None:
            self._wake = asyncio.Event()
        return self._wake

    # -- arming -------------------------------------------------------------------------------

    async def armed(self, timers: Sequence[Armed]) -> None:
        """Put the timers due within the horizon into their shards' ``due`` and wake a blocked
        worker on each shard written (one script a shard, the shards at once).

        Raises:
            BackendUnavailable: Redis did not answer (the caller logs it; the scanner covers).
        """
        limit = self.clock.now() + self.horizon
        by_shard: dict[Shard, list[Any]] = {}
        for t in timers:
            if t.due_at <= limit:
                by_shard.setdefault(self.shard_of(t.id), []).extend(
                    (to_ms(t.due_at, up=True), str(t.id))
                )
        if not by_shard:
            return
        arm_failed = self._arm_failed
        _, arm = self._scripts()
        drop = "1" if arm_failed else "0"
        calls = [
            arm(keys=[s.due, s.wake, s.fed], args=[drop, WAKE_MARKERS, *pairs])
            for s, pairs in by_shard.items()
        ]
        try:
            await gather_all(calls)
        except REDIS_ERRORS as exc:
            self._failed = self._arm_failed = True
            raise BackendUnavailable(f"redis trigger cannot arm timers: {exc}") from exc
        if arm_failed:
            self._arm_failed = False
            log.info("redis trigger: an earlier arm failed; the fed marker dropped for a feed")

    async def lost(self) -> bool:
        """True when a shard's ``fed`` marker was missing (and is now set): Redis lost its keys
        since any feeder last asked, or this is the first ask; or when Redis failed this
        instance since its last answer (an arm may have failed). Redis trouble: False (the
        scanner covers due timers meanwhile; the next ask after Redis is back tells)."""
        client = self._redis()
        try:
            fresh = await gather_all([client.set(s.fed, "1", nx=True) for s in self.shards])
        except REDIS_ERRORS as exc:
            self._failed = True
            self.errors += 1
            self._handled_error("lost")
            log.warning("redis trigger cannot tell whether it lost its timers (%s)", exc)
            return False
        failed, self._failed = self._failed, False
        return any(fresh) or failed

    # -- delivering ---------------------------------------------------------------------------

    async def claim(self, now: datetime) -> list[int]:
        """Run the claim script on every shard at once: up to ``batch`` due ids in all, now
        leased to the caller. A shard's ``fed`` marker gone, or Redis answering again after
        failing this instance, tells the feeder at once
        (:meth:`~dueflow.timers.base.Trigger.watch_lost`): the timers due before its next pass
        would wait for the scanner.

        Raises:
            RedisError: every shard failed; where only some did, the others' ids are returned
                and the failure is logged and counted.
        """
        script, _ = self._scripts()
        args = [to_ms(now), self.per_shard, to_ms(now + self.lease)]
        answers = await asyncio.gather(
            *(
                script(keys=[s.due, s.processing, s.wake, s.poke, s.fed], args=args)
                for s in self.owned
            ),
            return_exceptions=True,
        )
        failures = [a for a in answers if isinstance(a, BaseException)]
        if len(failures) == len(answers):
            raise failures[0]
        # Some shards failed: the feeder is told once all of them answer again (a full feed
        # now would fail on the same shards).
        lost = self._failed and not failures
        if failures:
            self._failed = True
            self.errors += 1
            self._handled_error("claim")
            self._log_shards_down(len(failures), failures[0])
        ids: list[int] = []
        for answer in answers:
            if isinstance(answer, BaseException):
                continue
            fed, members = answer
            lost = lost or not fed
            ids.extend(int(member) for member in members)
        if lost:
            self._seen_lost()
        return ids

    def _log_shards_down(self, count: int, error: BaseException) -> None:
        """Log failed shards once per :data:`ERROR_PAUSE` (a claim runs many times a second)."""
        now = time.monotonic()
        if now - self._logged_at >= ERROR_PAUSE.total_seconds():
            self._logged_at = now
            log.warning("redis trigger: %d shards unavailable (%s)", count, error)

    async def next_at(self) -> datetime | None:
        """When the next claim could take something: the earliest due time or lease expiry."""
        async with self._redis().pipeline(transaction=False) as pipe:
            for s in self.owned:
                pipe.zrange(s.due, 0, 0, withscores=True)
                pipe.zrange(s.processing, 0, 0, withscores=True)
            heads = await pipe.execute()
        scores = [float(entries[0][1]) for entries in heads if entries]
        return from_ms(min(scores)) if scores else None

    async def wait(self, clock: Clock, until: datetime) -> Sequence[int] | None:
        """Claim what is due; if nothing is, block on the wake lists until the head is due (at
        most until ``until``), a timer is armed, or :meth:`wake` is called, then claim again.

        Never raises for Redis trouble: it logs, pauses briefly and returns no ids (the scanner
        covers what is due meanwhile)."""
        event = self._event()
        try:
            if event.is_set():
                return []
            errors = self.errors
            ids = await self.claim(clock.now())
            if ids or event.is_set():
                return ids
            if self.errors != errors:  # a shard failed: no blocking on it, a pause instead
                await clock.sleep_until(min(until, clock.now() + ERROR_PAUSE), event)
                return []
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

        One BLPOP per shard waits on the shard's shared wake list and this instance's own one;
        its timeout (real seconds) is only the backstop. The clock's own sleep runs beside them:
        once the first of them ends (a marker on one shard, the head due by the clock, which a
        scaled or fake clock reaches sooner and Redis's timeout up to a server tick later, or
        :meth:`wake` was called), a marker pushed to the instance's own lists ends the other
        BLPOPs at once."""
        seconds = max((target - clock.now()).total_seconds(), 0.0)
        seconds = max(round(seconds + 0.0005, 3), MIN_BLOCK)  # whole ms, never early
        client = self._redis()
        pops = {
            s: asyncio.ensure_future(client.blpop([s.wake, s.poke], timeout=seconds))
            for s in self.owned
        }
        sleeper = asyncio.ensure_future(clock.sleep_until(target, event))
        try:
            await asyncio.wait({*pops.values(), sleeper}, return_when=asyncio.FIRST_COMPLETED)
            pending = [s for s, pop in pops.items() if not pop.done()]
            if pending:
                try:
                    await self._poke(pending)
                except REDIS_ERRORS:
                    pass  # the BLPOPs are cancelled below; the next claim reports the trouble
                else:
                    await asyncio.wait([pops[s] for s in pending], timeout=POP_GRACE)
            for pop in pops.values():
                if pop.done():
                    pop.result()  # raise its error, if any
        finally:
            for task in (*pops.values(), sleeper):
                task.cancel()
            await asyncio.gather(*pops.values(), sleeper, return_exceptions=True)
        return event.is_set()

    async def _poke(self, shards: Sequence[Shard]) -> None:
        """End this instance's pending BLPOPs: a marker on its own wake list of each shard."""
        client = self._redis()
        await gather_all(
            [client.lpush(s.poke, "1") for s in shards]
            + [client.pexpire(s.poke, POKE_TTL_MS) for s in shards]
        )

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
        by_shard: dict[Shard, list[str]] = {}
        for timer_id in timer_ids:
            by_shard.setdefault(self.shard_of(timer_id), []).append(str(timer_id))
        client = self._redis()
        try:
            await gather_all([client.zrem(s.processing, *ids) for s, ids in by_shard.items()])
        except REDIS_ERRORS as exc:
            raise BackendUnavailable(f"redis trigger cannot acknowledge timers: {exc}") from exc

    async def ping(self) -> None:
        """Redis answers PING (on a cluster: every master does).

        Raises:
            BackendUnavailable: it does not.
        """
        try:
            await self._redis().ping()
        except REDIS_ERRORS as exc:
            raise BackendUnavailable(f"redis trigger unreachable: {exc}") from exc

    async def close(self) -> None:
        client, self._client, self._claim, self._arm = self._client, None, None, None
        if client is not None:
            await client.aclose()

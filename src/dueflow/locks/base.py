"""Short-lived named locks: the port, :func:`held`, and the no-op adapter (the Redis one is
:mod:`dueflow.locks.redis`).

Where they go: around the use cases where many callers contend for one thing, so that they
take turns before any database work instead of piling up on the database's row locks:

* ``place_order``: ``held(locks, f"goods:{goods_id}", ttl)`` while the goods are being held for
  a new order (many buyers clicking "buy" on one item);
* ``confirm_payment`` / payment notifications: ``held(locks, f"order:{order_id}", ttl)`` while
  the payment is recorded and the order moves on (a notification racing the pay-timeout timer
  or a duplicate notification).

:func:`held` waits briefly (``wait``, a couple of seconds) for a key someone else holds, since
holders finish in milliseconds: three copies of one notification then take turns and the later
ones find the payment applied. Only a key held for the whole wait answers
:class:`~dueflow.exceptions.Busy` ("try again").

A lock is only an optimisation, never the guard: the database's conditional updates and row
locks decide every race, so an expired lock (a TTL shorter than the work) or no lock at all
(:class:`NoLocks`, used when there is no Redis) can never cause a double effect. Hence a lock
store that cannot be reached never refuses anyone either: :func:`held` runs the block without
the lock, counted and logged by :class:`Bypasses`, and the Redis client reconnects by itself
(one retry on a fresh connection after a restart, a health check on idle connections). Keep
TTLs a few seconds: a crashed holder frees the lock when its TTL runs out.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

from prometheus_client import Counter

from dueflow.exceptions import BackendUnavailable, Busy

log = logging.getLogger(__name__)

#: How long :func:`held` waits for a key someone else holds (Redis locks; DUEFLOW_LOCK_WAIT).
DEFAULT_WAIT = timedelta(seconds=2)
#: The pause between tries while waiting starts short (most holders are done within a few
#: milliseconds) and doubles up to the longest, in seconds.
FIRST_STEP = 0.005
LONGEST_STEP = 0.05
#: An outage is logged when it starts, then at most this often.
LOG_EVERY = timedelta(minutes=1)


def new_token() -> str:
    """A fresh owner token."""
    return secrets.token_hex(16)


class Bypasses:
    """The blocks :func:`held` ran without their lock because the lock store was unreachable.

    Each is counted (``counter``: dueflow_lock_bypassed_total); the outage is logged when it
    starts, then at most once per ``log_every`` with how many went ahead meanwhile (a flood of
    one line per request would hide everything else), and once more when locks are taken again.
    """

    def __init__(self, counter: Counter | None = None, *, log_every: timedelta = LOG_EVERY) -> None:
        self.counter = counter
        self.log_every = log_every.total_seconds()
        self.count = 0
        self._unlogged = 0
        self._logged_at: float | None = None
        self._reported = False

    def went_ahead(self, key: str, error: BackendUnavailable) -> None:
        """The block for ``key`` runs without its lock."""
        self.count += 1
        self._unlogged += 1
        if self.counter is not None:
            self.counter.inc()
        now = time.monotonic()
        if self._logged_at is not None and now - self._logged_at < self.log_every:
            return
        log.warning(
            "locks unreachable (%s): %d blocks went ahead without their lock, the latest %s; "
            "the database's guarded updates decide alone",
            error.message,
            self._unlogged,
            key,
        )
        self._logged_at, self._unlogged, self._reported = now, 0, True

    def reachable(self) -> None:
        """A lock was taken again: say so when the outage was reported."""
        if self._reported:
            log.warning("locks reachable again (%d more went ahead unlocked)", self._unlogged)
            self._reported, self._unlogged = False, 0


class Locks(ABC):
    """Named locks with an owner token and a time to live."""

    #: Whether holding a key keeps other holders out. When it does not, a caller may skip work
    #: whose only use is finding the key (a lookup before the lock).
    excludes: bool = True
    #: How long :func:`held` waits for a key someone else holds before Busy.
    wait: timedelta = timedelta(0)
    #: Counts and logs the blocks :func:`held` ran without their lock. An adapter that can be
    #: unreachable gives each instance its own (with the Prometheus counter); this shared one
    #: only serves adapters that never are.
    bypasses: Bypasses = Bypasses()

    @abstractmethod
    async def acquire(self, key: str, ttl: timedelta) -> str | None:
        """Take ``key`` for ``ttl``; returns the owner token, or None when someone holds it.

        Raises:
            BackendUnavailable: the lock store cannot be reached.
        """

    @abstractmethod
    async def release(self, key: str, token: str) -> bool:
        """Free ``key`` if ``token`` still owns it; False when it does not (expired, taken over).

        Raises:
            BackendUnavailable: the lock store cannot be reached.
        """

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""


async def acquire_within(locks: Locks, key: str, ttl: timedelta) -> str:
    """Take ``key``, trying again in short, growing steps for up to ``locks.wait``.

    The wait is measured in real (monotonic) time, not by the service clock: it is about
    another holder's work in progress, which runs in real time whatever the clock says.

    Raises:
        Busy: someone else held it for the whole wait.
        BackendUnavailable: the lock store cannot be reached.
    """
    give_up = time.monotonic() + locks.wait.total_seconds()
    step = FIRST_STEP
    while (token := await locks.acquire(key, ttl)) is None:
        left = give_up - time.monotonic()
        if left <= 0:
            raise Busy(f"{key} is busy; try again")
        await asyncio.sleep(min(step, left))
        step = min(step * 2, LONGEST_STEP)
    return token


@asynccontextmanager
async def held(
    locks: Locks, key: str, ttl: timedelta, *, busy_goes_ahead: bool = False
) -> AsyncIterator[str | None]:
    """Hold ``key`` for the block, waiting up to ``locks.wait`` for it; yields the owner token,
    or None when the lock store is unreachable and the block runs without the lock (the
    database's guarded updates decide alone; counted and logged by ``locks.bypasses``).

    With ``busy_goes_ahead`` a key still held after the wait is gone past too (yielding None):
    for work that must happen by a deadline (a timer's confirm of a trade found paid), where a
    holder that died keeps the key until its TTL (``DUEFLOW_LOCK_TTL``, 10 s) and waiting that
    out would make the deadline late. The lock only saves the database some contention.

    Raises:
        Busy: someone else held it for the whole wait; try again (not with ``busy_goes_ahead``).
    """
    try:
        token: str | None = await acquire_within(locks, key, ttl)
    except BackendUnavailable as exc:
        locks.bypasses.went_ahead(key, exc)
        token = None
    except Busy:
        if not busy_goes_ahead:
            raise
        log.warning("lock %s still held after the wait; going ahead without it", key)
        token = None
    else:
        locks.bypasses.reachable()
    if token is None:
        yield None
        return
    try:
        yield token
    finally:
        try:
            if not await locks.release(key, token):
                log.warning("lock %s expired before its holder finished", key)
        except BackendUnavailable:
            # Nothing to undo: the TTL frees it.
            log.warning("could not release lock %s; it expires by itself", key)


class NoLocks(Locks):
    """Always acquires (no Redis): the database's conditional updates and row locks decide."""

    excludes = False

    async def acquire(self, key: str, ttl: timedelta) -> str | None:
        return new_token()

    async def release(self, key: str, token: str) -> bool:
        return True

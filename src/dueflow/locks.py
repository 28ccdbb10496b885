"""Short-lived named locks: a port with a Redis adapter and a no-op one.

Where they go: around the use cases where many callers contend for one thing, to turn a
pile-up into a quick :class:`~dueflow.exceptions.Busy` ("try again") before any database work:

* ``place_order``: ``held(locks, f"goods:{goods_id}", ttl)`` while the goods are being held for
  a new order (many buyers clicking "buy" on one item);
* ``confirm_payment`` / payment notifications: ``held(locks, f"order:{order_id}", ttl)`` while
  the payment is recorded and the order moves on (a notification racing the pay-timeout timer
  or a duplicate notification).

A lock is only an optimisation, never the guard: the database's conditional updates and row
locks decide every race, so an expired lock (a TTL shorter than the work) or no lock at all
(:class:`NoLocks`, used when there is no Redis) can never cause a double effect. Keep TTLs a
few seconds: a crashed holder frees the lock when its TTL runs out.
"""

from __future__ import annotations

import logging
import secrets
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

import redis.asyncio as aioredis
from redis.asyncio.client import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from dueflow.exceptions import BackendUnavailable, Busy, ConfigError

log = logging.getLogger(__name__)

#: Delete the key only while it still holds the caller's token.
RELEASE_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
REDIS_ERRORS = (RedisError, OSError)


def new_token() -> str:
    """A fresh owner token."""
    return secrets.token_hex(16)


class Locks(ABC):
    """Named locks with an owner token and a time to live."""

    #: Whether holding a key keeps other holders out. When it does not, a caller may skip work
    #: whose only use is finding the key (a lookup before the lock).
    excludes: bool = True

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


@asynccontextmanager
async def held(locks: Locks, key: str, ttl: timedelta) -> AsyncIterator[str]:
    """Hold ``key`` for the block; yields the owner token.

    Raises:
        Busy: someone else holds it; try again.
        BackendUnavailable: the lock store cannot be reached.
    """
    token = await locks.acquire(key, ttl)
    if token is None:
        raise Busy(f"{key} is busy; try again")
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


class RedisLocks(Locks):
    """``SET key token NX PX ttl``; released by a compare-and-delete script."""

    def __init__(
        self, *, url: str = "redis://localhost:6379/0", prefix: str = "dueflow:lock"
    ) -> None:
        if not prefix:
            raise ConfigError("redis locks: prefix must not be empty")
        self.url = url
        self.prefix = prefix
        self._client: Redis | None = None
        self._release: AsyncScript | None = None

    @classmethod
    def from_url(cls, url: str, *, prefix: str = "dueflow:lock") -> RedisLocks:
        return cls(url=url, prefix=prefix)

    def _redis(self) -> Redis:
        """The client, made on first use inside the running loop."""
        if self._client is None:
            self._client = aioredis.Redis.from_url(self.url)
        return self._client

    def _key(self, key: str) -> str:
        return f"{self.prefix}:{key}"

    async def acquire(self, key: str, ttl: timedelta) -> str | None:
        ms = max(1, int(ttl / timedelta(milliseconds=1)))
        token = new_token()
        try:
            taken = await self._redis().set(self._key(key), token, nx=True, px=ms)
        except REDIS_ERRORS as exc:
            raise BackendUnavailable(f"redis locks cannot acquire {key}: {exc}") from exc
        return token if taken else None

    async def release(self, key: str, token: str) -> bool:
        if self._release is None:
            self._release = self._redis().register_script(RELEASE_SCRIPT)
        try:
            deleted = await self._release(keys=[self._key(key)], args=[token])
        except REDIS_ERRORS as exc:
            raise BackendUnavailable(f"redis locks cannot release {key}: {exc}") from exc
        return bool(deleted)

    async def close(self) -> None:
        client, self._client, self._release = self._client, None, None
        if client is not None:
            await client.aclose()

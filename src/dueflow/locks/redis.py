"""Named locks in Redis: an owner token per key with a TTL, taken and released by scripts (the
port and :func:`~dueflow.locks.base.held` are in :mod:`dueflow.locks.base`)."""

from __future__ import annotations

import time
from datetime import timedelta

from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError

from dueflow import redis_url
from dueflow.exceptions import BackendUnavailable, ConfigError
from dueflow.locks.base import DEFAULT_WAIT, Bypasses, Locks, new_token

#: Delete the key only while it still holds the caller's token.
RELEASE_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
#: Take the key for the caller's token, or find it already the caller's: a SET whose reply was
#: lost on a broken connection is retried by the client, and must not then lock out its owner.
ACQUIRE_SCRIPT = """
local held = redis.call('GET', KEYS[1])
if not held then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if held == ARGV[1] then
  return 1
end
return 0
"""
REDIS_ERRORS = (RedisError, RedisClusterException, OSError)
#: After Redis could not be reached, locks are skipped without asking it for this long, so an
#: outage costs at most one connect timeout per this interval, not one per request.
RECHECK_AFTER = timedelta(seconds=1)


class RedisLocks(Locks):
    """Taken by a script that sets the key with a TTL unless someone else's token is in it;
    released by a compare-and-delete script.

    The client gives up quickly (a lock is one short round trip; a Redis that does not answer
    within a second is treated as away) and retries a command once on a fresh connection when
    the pooled one was broken (Redis restarted since it was last used). After a failure,
    acquiring answers BackendUnavailable at once for :data:`RECHECK_AFTER`.
    """

    def __init__(
        self,
        *,
        url: str = "redis://localhost:6379/0",
        prefix: str = "dueflow:lock",
        wait: timedelta = DEFAULT_WAIT,
        bypasses: Bypasses | None = None,
    ) -> None:
        if not prefix:
            raise ConfigError("redis locks: prefix must not be empty")
        self.url = url
        self.wait = wait
        self.bypasses = bypasses or Bypasses()
        self.prefix = prefix
        self._client: redis_url.Client | None = None
        self._release: AsyncScript | None = None
        self._acquire: AsyncScript | None = None
        self._away_until = 0.0

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = "dueflow:lock",
        wait: timedelta = DEFAULT_WAIT,
        bypasses: Bypasses | None = None,
    ) -> RedisLocks:
        return cls(url=url, prefix=prefix, wait=wait, bypasses=bypasses)

    def _redis(self) -> redis_url.Client:
        """The client, made on first use inside the running loop."""
        if self._client is None:
            self._client = redis_url.connect(
                self.url,
                socket_connect_timeout=0.5,
                socket_timeout=1.0,
                # A URL-built client retries nothing unless told: without this, the first
                # command after a Redis restart fails on the dead pooled connection. Only a
                # broken connection is retried (a timed-out SET NX may have been applied).
                retry=Retry(ExponentialBackoff(cap=0.05, base=0.01), 1, (RedisConnectionError,)),
                health_check_interval=30,
            )
        return self._client

    def _key(self, key: str) -> str:
        return f"{self.prefix}:{key}"

    def _unreachable(self, doing: str, exc: Exception) -> BackendUnavailable:
        self._away_until = time.monotonic() + RECHECK_AFTER.total_seconds()
        return BackendUnavailable(f"redis locks cannot {doing}: {exc}")

    async def acquire(self, key: str, ttl: timedelta) -> str | None:
        if time.monotonic() < self._away_until:
            raise BackendUnavailable("redis locks were unreachable a moment ago")
        ms = max(1, int(ttl / timedelta(milliseconds=1)))
        token = new_token()
        if self._acquire is None:
            self._acquire = self._redis().register_script(ACQUIRE_SCRIPT)
        try:
            taken = await self._acquire(keys=[self._key(key)], args=[token, ms])
        except REDIS_ERRORS as exc:
            raise self._unreachable(f"acquire {key}", exc) from exc
        return token if taken else None

    async def release(self, key: str, token: str) -> bool:
        if self._release is None:
            self._release = self._redis().register_script(RELEASE_SCRIPT)
        try:
            deleted = await self._release(keys=[self._key(key)], args=[token])
        except REDIS_ERRORS as exc:
            raise self._unreachable(f"release {key}", exc) from exc
        return bool(deleted)

    async def close(self) -> None:
        client, self._client, self._release, self._acquire = self._client, None, None, None
        if client is not None:
            await client.aclose()

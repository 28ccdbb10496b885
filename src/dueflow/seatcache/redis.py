"""The seat cache in Redis: one hash per show, written by scripts that move a seat only from the
state they expect.

Keys (``prefix`` defaults to ``dueflow``): ``{prefix}:seats:{show_id}``, a hash of seat label
-> ``held`` | ``sold`` for the show's taken seats, plus the field :data:`LOADED` that says the
hash holds the whole show (a free seat is a label that is not there). A show without that field
is not cached: the seat map and the pre-check read the database, and moves leave it alone (a
hash built from moves alone would say "free" of every seat taken before it).

Every Redis error is caught here: reads answer None (the database decides), writes are logged
and counted, and after an error the cache is not asked again for :data:`RECHECK_AFTER`, so an
outage costs a request at most one short timeout a second. Nothing a buyer does fails because
Redis is away, and nothing is ever sold twice: the unique key on live seat holds decides.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from prometheus_client import Counter
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError

from dueflow import redis_url
from dueflow.exceptions import ConfigError
from dueflow.seatcache.base import SeatCache
from dueflow.store.shows import FREE, SeatMove

log = logging.getLogger(__name__)

#: The hash field that marks a show as loaded (no seat label can be spelt so).
LOADED = "_loaded"
#: A hash not loaded again for this long goes away by itself: the reconciler reloads every
#: show on sale each interval, so only shows long past (or a cache nobody reconciles) expire,
#: and an expired show is read from the database and loaded again.
KEEP_FOR = timedelta(days=1)
#: After an error the cache is skipped (answers "cannot say") for this long.
RECHECK_AFTER = timedelta(seconds=1)
#: An outage is logged when it starts, then at most this often.
LOG_EVERY = timedelta(minutes=1)
REDIS_ERRORS = (RedisError, RedisClusterException, OSError)

#: Move seats ARGV[3..] of a loaded show from ARGV[1] to ARGV[2], each only where the hash has it
#: in ARGV[1] (free: not there). Returns how many moved.
MOVE_SCRIPT = """
if redis.call('HEXISTS', KEYS[1], ARGV[4]) == 0 then
  return 0
end
local before, after, moved = ARGV[1], ARGV[2], 0
for i = 5, #ARGV do
  local now = redis.call('HGET', KEYS[1], ARGV[i])
  if before == ARGV[3] then
    if not now then
      redis.call('HSET', KEYS[1], ARGV[i], after)
      moved = moved + 1
    end
  elseif now == before then
    if after == ARGV[3] then
      redis.call('HDEL', KEYS[1], ARGV[i])
    else
      redis.call('HSET', KEYS[1], ARGV[i], after)
    end
    moved = moved + 1
  end
end
return moved
"""
#: Make the hash exactly the pairs ARGV[3..] (label, state), loaded, kept for ARGV[2] ms.
#: Returns how many labels differed, 0 when the show was not loaded (nothing was claimed).
LOAD_SCRIPT = """
local key, marker = KEYS[1], ARGV[1]
local was_loaded = redis.call('HEXISTS', key, marker) == 1
local wanted = {}
for i = 3, #ARGV, 2 do
  wanted[ARGV[i]] = ARGV[i + 1]
end
local differed = 0
local current = redis.call('HGETALL', key)
for i = 1, #current, 2 do
  local label, state = current[i], current[i + 1]
  if label ~= marker then
    if wanted[label] == nil then
      redis.call('HDEL', key, label)
      differed = differed + 1
    elseif wanted[label] ~= state then
      redis.call('HSET', key, label, wanted[label])
      differed = differed + 1
    end
    wanted[label] = nil
  end
end
for label, state in pairs(wanted) do
  redis.call('HSET', key, label, state)
  differed = differed + 1
end
redis.call('HSET', key, marker, '1')
redis.call('PEXPIRE', key, ARGV[2])
if was_loaded then
  return differed
end
return 0
"""


class RedisSeatCache(SeatCache):
    """Seat states in one Redis hash per show (see the module docstring)."""

    def __init__(
        self,
        *,
        url: str = "redis://localhost:6379/0",
        prefix: str = "dueflow",
        errors: Counter | None = None,
    ) -> None:
        if not prefix:
            raise ConfigError("redis seat cache: prefix must not be empty")
        self.url = url
        self.prefix = prefix
        self.errors_counter = errors
        #: Operations that failed since the start (also in ``dueflow_seat_cache_errors_total``).
        self.errors = 0
        self._client: redis_url.Client | None = None
        self._move: AsyncScript | None = None
        self._load: AsyncScript | None = None
        self._away_until = 0.0
        self._logged_at: float | None = None
        self._unlogged = 0

    @classmethod
    def from_url(cls, url: str, *, errors: Counter | None = None) -> RedisSeatCache:
        """``redis://host:port/db?prefix=dueflow`` (the one option: the keys' prefix).

        Raises:
            ConfigError: an option other than ``prefix``.
        """
        try:
            parts = urlsplit(url)
        except ValueError as exc:  # an unclosed IPv6 bracket, say
            raise ConfigError(f"redis seat cache: bad URL {url!r}: {exc}") from None
        options = dict(parse_qsl(parts.query, keep_blank_values=True))
        unknown = sorted(set(options) - {"prefix"})
        if unknown:
            raise ConfigError(f"redis seat cache: unknown option {', '.join(unknown)}")
        bare = urlunsplit(parts._replace(query=""))
        return cls(url=bare, prefix=options.get("prefix", "dueflow"), errors=errors)

    def key(self, show_id: int) -> str:
        """The hash of the show's seats."""
        return f"{self.prefix}:seats:{show_id}"

    def _redis(self) -> redis_url.Client:
        """The client, made on first use inside the running loop."""
        if self._client is None:
            self._client = redis_url.connect(
                self.url,
                decode_responses=True,
                socket_connect_timeout=0.5,
                socket_timeout=0.5,
                # A command on a broken pooled connection (Redis restarted since it was last
                # used) is tried once more on a fresh one; every command here is harmless to
                # repeat. A timeout is not retried: an outage must not hold a request twice.
                retry=Retry(ExponentialBackoff(cap=0.05, base=0.01), 1, (RedisConnectionError,)),
                health_check_interval=30,
            )
        return self._client

    def _away(self) -> bool:
        return time.monotonic() < self._away_until

    def _count(self, doing: str) -> None:
        self.errors += 1
        self._unlogged += 1
        if self.errors_counter is not None:
            self.errors_counter.labels(doing).inc()

    def _failed(self, doing: str, exc: Exception) -> None:
        """Count the failure, stop asking for a moment, log the outage (not every request)."""
        self._count(doing)
        now = time.monotonic()
        self._away_until = now + RECHECK_AFTER.total_seconds()
        if self._logged_at is not None and now - self._logged_at < LOG_EVERY.total_seconds():
            return
        log.warning(
            "seat cache unreachable (%s: %s): %d operations skipped, the database decides",
            doing,
            type(exc).__name__,
            self._unlogged,
        )
        self._logged_at, self._unlogged = now, 0

    async def moved(self, moves: Sequence[SeatMove]) -> None:
        """One script per move; a failure is logged and counted (the reconciler repairs)."""
        if self._away():
            self._count("moved")  # a move lost: counted, left to the reconciler
            return
        if self._move is None:
            self._move = self._redis().register_script(MOVE_SCRIPT)
        try:
            for move in moves:
                await self._move(
                    keys=[self.key(move.show_id)],
                    args=[move.before, move.after, FREE, LOADED, *move.labels],
                )
        except REDIS_ERRORS as exc:
            self._failed("moved", exc)

    async def states(self, show_id: int) -> Mapping[str, str] | None:
        if self._away():
            return None
        try:
            raw = await self._redis().hgetall(self.key(show_id))
        except REDIS_ERRORS as exc:
            self._failed("states", exc)
            return None
        # decode_responses: every key and value is a str already.
        found = {str(label): str(state) for label, state in raw.items()}
        if found.pop(LOADED, None) is None:
            return None
        return found

    async def taken(self, show_id: int, labels: Sequence[str]) -> set[str] | None:
        if self._away() or not labels:
            return None
        try:
            found = await self._redis().hmget(self.key(show_id), [LOADED, *labels])
        except REDIS_ERRORS as exc:
            self._failed("taken", exc)
            return None
        if found[0] is None:
            return None
        return {label for label, state in zip(labels, found[1:], strict=True) if state}

    async def load(self, show_id: int, states: Mapping[str, str]) -> int:
        """Replace the show's hash by ``states`` in one script; repairs counted only where the
        show was loaded (a show the cache did not have was not wrong). 0 when Redis is away."""
        if self._away():
            return 0
        if self._load is None:
            self._load = self._redis().register_script(LOAD_SCRIPT)
        pairs = [item for label_state in sorted(states.items()) for item in label_state]
        keep_ms = int(KEEP_FOR / timedelta(milliseconds=1))
        try:
            differed = await self._load(keys=[self.key(show_id)], args=[LOADED, keep_ms, *pairs])
        except REDIS_ERRORS as exc:
            self._failed("load", exc)
            return 0
        return int(differed)

    async def close(self) -> None:
        client, self._client, self._move, self._load = self._client, None, None, None
        if client is not None:
            await client.aclose()

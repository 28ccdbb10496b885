"""The Redis trigger's shards: their keys, the scripts that run on one shard, its URL options.

A shard is a set of keys a script may touch together, so in a Redis Cluster they share one hash
slot: shard ``k`` of ``S`` keeps ``{prefix:k}:due``, ``{prefix:k}:processing``,
``{prefix:k}:wake``, ``{prefix:k}:fed`` and the instances' own ``{prefix:k}:wake:{random}``.
One shard on one server keeps the names it always had (``prefix:due``, ...). A timer lives in
shard ``timer_id mod S``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from dueflow import redis_url
from dueflow.domain.deadlines import parse_duration
from dueflow.exceptions import ConfigError

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MS = timedelta(milliseconds=1)
#: Shards on a cluster unless the URL says (``?shards=``): enough to spread over a few masters.
CLUSTER_SHARDS = 8
#: The most shards a URL may ask for (each costs a blocked connection per worker).
MAX_SHARDS = 256

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

#: KEYS: due, wake, fed. ARGV: 1 to delete the fed marker (an earlier arm failed) else 0, how
#: many wake markers to keep, then score, id pairs. Adds the ids (a re-armed id moves) and
#: pushes a wake marker, all at once (as MULTI did when there was one shard).
ARM_SCRIPT = """
local due, wake, fed = KEYS[1], KEYS[2], KEYS[3]
if ARGV[1] == '1' then
  redis.call('DEL', fed)
end
local chunk = {}
for i = 3, #ARGV do
  chunk[#chunk + 1] = ARGV[i]
  if #chunk == 1000 then
    redis.call('ZADD', due, unpack(chunk))
    chunk = {}
  end
end
if #chunk > 0 then
  redis.call('ZADD', due, unpack(chunk))
end
redis.call('LPUSH', wake, '1')
redis.call('LTRIM', wake, 0, tonumber(ARGV[2]) - 1)
return 1
"""


@dataclass(frozen=True)
class Shard:
    """The keys of one shard (see the module docstring)."""

    index: int
    due: str
    processing: str
    wake: str
    fed: str
    #: This trigger instance's own wake list on the shard.
    poke: str

    @classmethod
    def named(cls, prefix: str, index: int, count: int, *, cluster: bool, instance: str) -> Shard:
        base = prefix if count == 1 and not cluster else f"{{{prefix}:{index}}}"
        return cls(
            index=index,
            due=f"{base}:due",
            processing=f"{base}:processing",
            wake=f"{base}:wake",
            fed=f"{base}:fed",
            poke=f"{base}:wake:{instance}",
        )


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


def _count(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"redis trigger: {name} must be a number, not {value!r}") from None


def split_url(url: str) -> tuple[str, dict[str, Any]]:
    """The URL without the trigger's options, and those options as keyword arguments.

    ``horizon``, ``lease`` (durations), ``prefix``, ``batch``, ``shards`` and ``own`` (``i/n``:
    this process is worker i of n, see :func:`~dueflow.timers.redis.owned_shards`) are the
    trigger's; everything else is left for redis-py.

    Raises:
        ConfigError: a malformed option or URL, or a scheme that is not Redis's.
    """
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # an unclosed IPv6 bracket, say
        raise ConfigError(f"redis trigger: bad URL {url!r}: {exc}") from None
    if not redis_url.is_redis(url):
        raise ConfigError(f"not a redis trigger URL: {url!r}")
    options: dict[str, Any] = {}
    rest: list[tuple[str, str]] = []
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name in ("horizon", "lease"):
            options[name] = _positive(name, value)
        elif name == "prefix":
            options[name] = value
        elif name in ("batch", "shards"):
            options[name] = _count(name, value)
        elif name == "own":
            mine, slash, workers = value.partition("/")
            if not slash:
                raise ConfigError(f"redis trigger: own must be i/n, not {value!r}")
            options[name] = (_count(name, mine), _count(name, workers))
        else:
            rest.append((name, value))
    return urlunsplit(parts._replace(query=urlencode(rest))), options


def owned_shards(shards: tuple[Shard, ...], own: tuple[int, int] | None) -> tuple[Shard, ...]:
    """The shards worker ``i`` of ``n`` claims: index mod n is i or i + 1 (all with no ``own``).

    Raises:
        ConfigError: ``i`` not below ``n``, or a worker left with no shard.
    """
    if own is None:
        return shards
    mine, workers = own
    if not 0 <= mine < workers:
        raise ConfigError(f"redis trigger: own must be i/n with 0 <= i < n, not {mine}/{workers}")
    picked = {mine, (mine + 1) % workers}
    owned = tuple(s for s in shards if s.index % workers in picked)
    if not owned:
        raise ConfigError(f"redis trigger: worker {mine}/{workers} owns none of the shards")
    return owned


async def gather_all(calls: Sequence[Awaitable[Any]]) -> list[Any]:
    """Await the calls at once; the first error is raised once every call has ended (none is
    left running)."""
    answers = await asyncio.gather(*calls, return_exceptions=True)
    for answer in answers:
        if isinstance(answer, BaseException):
            raise answer
    return list(answers)

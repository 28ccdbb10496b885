"""Redis URLs for the trigger, the locks and the seat cache: one server or a Redis Cluster.

``redis://host:6379/0`` (or ``rediss://``) is one server, as redis-py reads it.
``redis+cluster://host1:7000,host2:7001/`` (or ``rediss+cluster://``) is a cluster: the hosts
are startup nodes (one that answers is enough: the client learns the rest from it), the
database must be 0 (a cluster has no other), and every other query option is redis-py's, as
for one server (``?socket_timeout=5``). Callers take their own options out first.

Every key a Lua script touches must hash to one slot in a cluster: the adapters keep them so
with a hash tag, or by touching one key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias
from urllib.parse import urlsplit, urlunsplit

from dueflow.exceptions import ConfigError

if TYPE_CHECKING:  # redis-py takes a while to import: only the processes that use it do
    from redis.asyncio.client import Redis
    from redis.asyncio.cluster import ClusterNode, RedisCluster

#: The cluster schemes, with the scheme of one node's URL.
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
#: Every scheme this module reads.
SCHEMES = ("redis", "rediss", *CLUSTER_SCHEMES)

#: The longest pause between two tries of a command on a cluster (seconds).
CLUSTER_BACKOFF_CAP = 0.25

#: A client for one server or for a cluster; both take the commands the adapters send.
Client: TypeAlias = "Redis | RedisCluster"


def scheme(url: str) -> str:
    """The URL's scheme, lower case ("" when there is none)."""
    return url.split("://", 1)[0].lower() if "://" in url else ""


def is_redis(url: str) -> bool:
    """A URL of one Redis server or of a cluster."""
    return scheme(url) in SCHEMES


def is_cluster(url: str) -> bool:
    """A ``redis+cluster://`` (or ``rediss+cluster://``) URL."""
    return scheme(url) in CLUSTER_SCHEMES


def check(url: str, what: str) -> None:
    """Raise ConfigError unless ``url`` names one server or a cluster that a client can use.

    Raises:
        ConfigError: a bad URL, naming ``what`` (``redis trigger``, say).
    """
    from redis.asyncio.connection import parse_url

    try:
        if is_cluster(url):
            _cluster_options(url)
        else:
            parse_url(url)
    except (ValueError, ConfigError) as exc:
        raise ConfigError(f"{what}: bad URL {url!r}: {exc}") from None


def connect(url: str, **options: Any) -> Client:
    """A client for ``url`` (made lazily: nothing connects until the first command).

    ``options`` are passed to the client (timeouts, retries, ``decode_responses``); options
    in the URL's query win, as redis-py has it.

    Raises:
        ConfigError: a bad cluster URL.
    """
    from redis.asyncio.client import Redis
    from redis.asyncio.cluster import RedisCluster

    if not is_cluster(url):
        return Redis.from_url(url, **options)
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialBackoff

    nodes, from_query = _cluster_options(url)
    # redis-py's default backs off for up to 10 s between tries on a node that is down: a
    # failed master would hold every claim that long. A few quick tries ride out a failover
    # (the topology is read again between them); past that the caller's fallback covers.
    defaults: dict[str, Any] = {
        "retry": Retry(ExponentialBackoff(cap=CLUSTER_BACKOFF_CAP, base=0.05), 3),
        "socket_connect_timeout": 1.0,
    }
    return RedisCluster(startup_nodes=nodes, **{**defaults, **options, **from_query})


def _cluster_options(url: str) -> tuple[list[ClusterNode], dict[str, Any]]:
    """The startup nodes and the client options of a cluster URL."""
    from redis.asyncio.cluster import ClusterNode
    from redis.asyncio.connection import parse_url

    parts = urlsplit(url)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    if not hosts:
        raise ConfigError("a cluster URL names at least one host:port")
    nodes: list[ClusterNode] = []
    options: dict[str, Any] = {}
    for host in hosts.split(","):
        netloc = f"{userinfo}@{host}" if userinfo else host
        one = urlunsplit((CLUSTER_SCHEMES[parts.scheme.lower()], netloc, parts.path, "", ""))
        parsed: dict[str, Any] = dict(parse_url(one))  # ValueError: a bad port
        if parsed.get("db", 0) != 0:
            raise ConfigError("a cluster has only database 0")
        nodes.append(ClusterNode(parsed.pop("host"), parsed.pop("port", 6379)))
        parsed.pop("db", None)
        options.update(parsed)
    if parts.query:
        query = urlunsplit(("redis", "localhost", "", parts.query, ""))
        extra: dict[str, Any] = dict(parse_url(query))
        for name in ("host", "port", "db"):
            extra.pop(name, None)
        options.update(extra)
    if options.pop("connection_class", None) is not None and parts.scheme.lower().startswith(
        "rediss"
    ):
        options["ssl"] = True
    return nodes, options

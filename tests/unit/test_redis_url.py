"""Redis URLs: one server or a cluster, read without connecting."""

from __future__ import annotations

import pytest
from redis.asyncio.client import Redis
from redis.asyncio.cluster import RedisCluster

from dueflow import redis_url
from dueflow.exceptions import ConfigError


def test_schemes_tell_a_cluster_from_one_server() -> None:
    assert redis_url.is_redis("redis://h:1/0") and not redis_url.is_cluster("redis://h:1/0")
    assert redis_url.is_cluster("redis+cluster://h:1/") and redis_url.is_redis(
        "REDIS+CLUSTER://h:1/"
    )
    assert redis_url.is_cluster("rediss+cluster://h:1/")
    assert not redis_url.is_redis("db") and not redis_url.is_redis("amqp://h/")


async def test_a_cluster_url_names_its_startup_nodes_and_passes_options_on() -> None:
    client = redis_url.connect(
        "redis+cluster://:secret@10.0.0.1:7000,10.0.0.2:7001/?socket_timeout=7",
        decode_responses=True,
    )
    assert isinstance(client, RedisCluster)
    nodes = client.nodes_manager.startup_nodes
    assert sorted(nodes) == ["10.0.0.1:7000", "10.0.0.2:7001"]
    kwargs = next(iter(nodes.values())).connection_kwargs
    assert kwargs["password"] == "secret"
    assert kwargs["socket_timeout"] == 7.0
    assert kwargs["decode_responses"] is True
    await client.aclose()
    one = redis_url.connect("redis://127.0.0.1:6379/3")
    assert isinstance(one, Redis)
    await one.aclose()


@pytest.mark.parametrize(
    "url",
    [
        "redis+cluster://h:7000/2",  # a cluster has only database 0
        "redis+cluster:///",
        "redis+cluster://h:port/",
        "redis://h:port/0",
    ],
)
def test_bad_urls_are_config_errors(url: str) -> None:
    with pytest.raises(ConfigError, match="bad URL"):
        redis_url.check(url, "test")

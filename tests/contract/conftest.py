"""Fixtures shared by the contract tests: for those that talk to Redis, one server, or a real
local Redis Cluster (3 masters, 3 replicas) started once per session (tests/redis_cluster.py);
for the migration tests, an empty database of their own on each backend."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from sqlalchemy.engine import make_url

from dueflow import redis_url
from tests import redis_cluster
from tests.conftest import SERVICE_URLS, in_ci, require_service
from tests.contract import migration_kit

REDIS_URL = os.environ.get("DUEFLOW_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


@pytest.fixture(scope="module")
def redis_available() -> Iterator[None]:
    """Skip without a local Redis; in CI (CI=true) a missing Redis is a failure."""
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1)
    try:
        client.ping()
    except redis.RedisError as exc:
        if in_ci():
            pytest.fail(f"Redis at {REDIS_URL} is required in CI: {exc}")
        pytest.skip(f"no Redis at {REDIS_URL}: {exc}")
    finally:
        client.close()
    yield


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[redis_cluster.LocalCluster]:
    """A Redis Cluster of 3 masters and 3 replicas on free ports, torn down at the end. Skipped
    where redis-server is not installed; in CI (CI=true) that is a failure."""
    if not redis_cluster.available():
        if in_ci():
            pytest.fail("redis-server and redis-cli are required in CI for the cluster tests")
        pytest.skip("no redis-server here: the Redis Cluster tests need it")
    with redis_cluster.running() as cluster:
        yield cluster


@pytest.fixture(params=["single", "cluster"])
def redis_base(request: pytest.FixtureRequest) -> str:
    """The URL of one Redis server, or of the local cluster (no options: tests add theirs)."""
    if request.param == "single":
        request.getfixturevalue("redis_available")
        return REDIS_URL
    cluster: redis_cluster.LocalCluster = request.getfixturevalue("local_cluster")
    return cluster.url


def is_cluster(client: object) -> bool:
    return isinstance(client, RedisCluster)


@pytest.fixture
def prefix() -> str:
    return f"test-{uuid.uuid4().hex}"


@pytest.fixture
async def r(prefix: str, redis_base: str) -> AsyncIterator[aioredis.Redis]:
    """A client for looking at (and, at teardown, deleting) this test's keys, on the server or
    cluster of ``redis_base``."""
    client = redis_url.connect(redis_base, decode_responses=True)
    try:
        yield client  # type: ignore[misc]
    finally:
        await delete_matching(client, prefix)
        await client.aclose()


async def delete_matching(client: redis_url.Client, prefix: str) -> None:
    """Delete every key with ``prefix`` in it (``prefix:...`` and a cluster's ``{prefix:k}:...``),
    one key at a time (a cluster refuses one DEL over several slots)."""
    keys = [key async for key in client.scan_iter(match=f"*{prefix}*")]
    for key in keys:
        await client.delete(key)


@pytest.fixture(
    params=[
        pytest.param("sqlite"),
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ]
)
async def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """An empty database of the test's own on each backend, dropped after: on the servers
    ``<run's database>_<what>_mig``, ``<what>`` from the module's name (``test_shop_migration``:
    ``shop``), so two modules never share one."""
    name = request.param
    what = request.module.__name__.rsplit(".", 1)[-1]
    what = what.removeprefix("test_").removesuffix("_migration")
    if name == "sqlite":
        yield f"sqlite:///{tmp_path / f'{what}-mig.db'}"
        return
    require_service(name, "127.0.0.1", 5432 if name == "postgres" else 3306)
    base = SERVICE_URLS[name]
    assert base is not None
    own = f"{make_url(base).database}_{what}_mig"
    await migration_kit.server_database(base, True, own)
    try:
        yield make_url(base).set(database=own).render_as_string(hide_password=False)
    finally:
        await migration_kit.server_database(base, False, own)

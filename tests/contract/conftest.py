"""Fixtures shared by the contract tests that talk to Redis."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import redis
import redis.asyncio as aioredis

from tests.conftest import in_ci

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


@pytest.fixture
def prefix() -> str:
    return f"test-{uuid.uuid4().hex}"


@pytest.fixture
async def r(prefix: str) -> AsyncIterator[aioredis.Redis]:
    """A client for looking at (and, at teardown, deleting) this test's keys."""
    client = aioredis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        yield client
    finally:
        keys = [key async for key in client.scan_iter(match=f"{prefix}:*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()

"""What the RabbitMQ trigger's tests share: the broker's URL, an admin channel, a fresh queue
prefix (its queues deleted at teardown), triggers on it of each kind of queue (``queues``:
classic and quorum), and helpers that look at the queues and collect what comes out.

A test module takes the fixtures by importing them. Locally an unreachable RabbitMQ skips the
tests that need it; in CI (CI=true) it fails them.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection

from dueflow.clock import SystemClock
from dueflow.store.timers import Armed
from dueflow.timers.rabbitmq import RabbitTrigger
from tests.conftest import in_ci, require_service

URL = os.environ.get("DUEFLOW_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
UNREACHABLE = "amqp://guest:guest@127.0.0.1:1/"
MS = timedelta(milliseconds=1)
US = timedelta(microseconds=1)
CLOCK = SystemClock()

rabbitmq = pytest.mark.rabbitmq


#: The kinds of queue every broker test runs on.
QUEUE_KINDS = ("classic", "quorum")

# --- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(params=QUEUE_KINDS)
def queues(request: pytest.FixtureRequest) -> str:
    """The kind of queue the test's triggers declare: each test runs on both."""
    return str(request.param)


@pytest.fixture
async def admin() -> AsyncIterator[AbstractChannel]:
    """A plain channel on the real RabbitMQ, for inspecting and purging queues."""
    parts = urlsplit(URL)
    require_service("RabbitMQ", parts.hostname or "127.0.0.1", parts.port or 5672)
    try:
        connection: AbstractConnection = await aio_pika.connect(URL, timeout=3)
    except Exception as exc:  # the port answers but RabbitMQ does not
        message = f"RabbitMQ at {URL} is unusable: {exc}"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    try:
        yield await connection.channel()
    finally:
        await connection.close()


@pytest.fixture
async def prefix(admin: AbstractChannel) -> AsyncIterator[str]:
    """A fresh queue prefix; every queue under it is deleted at teardown."""
    name = f"test-{uuid.uuid4().hex[:8]}"
    yield name
    for queue in RabbitTrigger(prefix=name).queue_names:
        await admin.queue_delete(queue)


Factory = Callable[..., RabbitTrigger]


@pytest.fixture
async def make_trigger(prefix: str, queues: str) -> AsyncIterator[Factory]:
    """Triggers on the test's prefix and kind of queue, all closed at teardown (before the
    queues go)."""
    made: list[RabbitTrigger] = []

    def make(**options: Any) -> RabbitTrigger:
        options.setdefault("url", URL)
        options.setdefault("prefix", prefix)
        options.setdefault("queues", queues)
        trigger = RabbitTrigger(**options)
        made.append(trigger)
        return trigger

    yield make
    for trigger in made:
        await trigger.close()


async def depth(admin: AbstractChannel, queue: str) -> int:
    declared = await admin.declare_queue(queue, passive=True)
    count = declared.declaration_result.message_count
    assert count is not None
    return int(count)


async def depths(admin: AbstractChannel, trigger: RabbitTrigger) -> dict[str, int]:
    """Non-empty queues of ``trigger`` by name."""
    found = {name: await depth(admin, name) for name in trigger.queue_names}
    return {name: n for name, n in found.items() if n}


async def purge(admin: AbstractChannel, names: Iterable[str]) -> None:
    for name in names:
        queue = await admin.declare_queue(name, passive=True)
        await queue.purge()


async def collect(
    trigger: RabbitTrigger, want: set[int], *, within: float, ack: bool = True
) -> dict[int, datetime]:
    """Wait (in short bounded waits) until every id in ``want`` came out; when each came."""
    got: dict[int, datetime] = {}
    deadline = time.monotonic() + within
    while not want <= got.keys() and time.monotonic() < deadline:
        ids = await trigger.wait(CLOCK, CLOCK.now() + timedelta(milliseconds=200))
        assert ids is not None
        now = CLOCK.now()
        for timer_id in ids:
            got.setdefault(timer_id, now)
        if ack and ids:
            await trigger.ack(ids)
    return got


def spy_publishes(trigger: RabbitTrigger) -> list[str]:
    """Record the queue of every message ``trigger`` publishes (first arm and re-arms)."""
    queues: list[str] = []
    publish = trigger._publish

    async def recording(channel: Any, timer: Armed, queue: str) -> None:
        queues.append(queue)
        await publish(channel, timer, queue)

    trigger._publish = recording  # type: ignore[method-assign]
    return queues

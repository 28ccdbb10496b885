"""What the RabbitMQ trigger's tests share: the broker's URL, an admin channel, a fresh queue
prefix (its queues deleted at teardown), triggers on it of each kind of queue (``queues``:
classic and quorum), and helpers that look at the queues and collect what comes out.

A test module takes the fixtures by importing them. Locally an unreachable RabbitMQ skips the
tests that need it; in CI (CI=true) it fails them.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
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


async def rabbitmqctl(*arguments: str) -> bool:
    """Run ``rabbitmqctl`` on this machine's broker; whether it did (False where it is not
    installed or refuses, e.g. without the Erlang cookie)."""
    command = shutil.which("rabbitmqctl")
    if command is None:
        return False
    process = await asyncio.create_subprocess_exec(
        command, *arguments, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    return await process.wait() == 0


async def look_up_dead_letter_routes(trigger: RabbitTrigger, level_ms: int) -> None:
    """Have the broker retry, now, what the quorum level ``level_ms`` holds dead-lettered for
    want of a route.

    At least once, a quorum queue's dead-letter worker keeps a message it could not route and
    routes it again every ``dead_letter_worker_publisher_confirm_timeout`` (3 minutes by
    default), or as soon as the queue's policies change (it looks its routes up again then). A
    policy that only repeats the level's own routing key (its arguments win anyway) is such a
    change; it is cleared at once. Where ``rabbitmqctl`` cannot reach the broker, nothing
    happens and the broker's own retry comes in its time.
    """
    level = trigger.level_queue(level_ms)
    name = f"{trigger.prefix}-retry"
    routing = json.dumps({"dead-letter-routing-key": trigger.due_queue})
    pattern = f"^{re.escape(level)}$"
    if await rabbitmqctl("set_policy", "--apply-to", "queues", name, pattern, routing):
        await rabbitmqctl("clear_policy", name)


def spy_publishes(trigger: RabbitTrigger) -> list[str]:
    """Record the queue of every message ``trigger`` publishes (first arm and re-arms)."""
    queues: list[str] = []
    publish = trigger._publish

    async def recording(channel: Any, timer: Armed, queue: str) -> None:
        queues.append(queue)
        await publish(channel, timer, queue)

    trigger._publish = recording  # type: ignore[method-assign]
    return queues

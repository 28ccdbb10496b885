"""The rabbitmq trigger's two kinds of queue (``?queues=classic``, the default, and ``quorum``):
what each declares and what the broker holds, the refusal of a queue that exists as the other
kind, a timer whose TTL ran out reaching a worker across a consumer's crash (both kinds), and
on quorum queues the at-least-once dead-lettering itself: a timer whose TTL ran out while the due
queue was missing still arrives once it is back.

Each test declares its own queues under a fresh prefix and deletes them afterwards. Locally an
unreachable RabbitMQ skips the tests that need it; in CI (CI=true) it fails them.
"""

from __future__ import annotations

from datetime import timedelta

import aio_pika
import pytest
from aio_pika.abc import AbstractConnection
from aiormq.exceptions import ChannelPreconditionFailed

from dueflow.exceptions import BackendUnavailable
from dueflow.store.timers import Armed
from dueflow.timers.rabbitmq import LEVELS_MS, RabbitTrigger
from tests.conftest import eventually
from tests.contract import rabbit_kit
from tests.contract.rabbit_kit import (
    CLOCK,
    URL,
    collect,
    depth,
    depths,
    look_up_dead_letter_routes,
)

rabbitmq = pytest.mark.rabbitmq

# The kit's fixtures, taken by name: a RabbitMQ channel, a fresh prefix, triggers on it, and the
# kind of queue (each broker test runs on both unless it names one).
admin = rabbit_kit.admin
prefix = rabbit_kit.prefix
make_trigger = rabbit_kit.make_trigger
queues = rabbit_kit.queues


# --- the declarations (pure) ------------------------------------------------------------------


def test_classic_queues_keep_the_arguments_they_always_had():
    trigger = RabbitTrigger(prefix="shop")
    assert trigger.queues == "classic"
    assert trigger.due_arguments() == {}
    assert trigger.level_arguments(250) == {
        "x-message-ttl": 250,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "shop.due",
    }


def test_quorum_levels_dead_letter_at_least_once_and_reject_rather_than_drop():
    trigger = RabbitTrigger(prefix="shop", queues="quorum")
    assert trigger.due_arguments() == {"x-queue-type": "quorum"}
    assert trigger.level_arguments(7_200_000) == {
        "x-queue-type": "quorum",
        "x-message-ttl": 7_200_000,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "shop.due",
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }


# --- what the broker holds --------------------------------------------------------------------


async def refused(connection: AbstractConnection, name: str, **arguments: object) -> str:
    """Declare ``name`` (durable) with ``arguments`` on a channel of its own; RabbitMQ's refusal
    ("" where it accepted the declaration as equivalent to the queue it holds)."""
    channel = await connection.channel()
    try:
        await channel.declare_queue(name, durable=True, arguments=arguments)
    except ChannelPreconditionFailed as exc:
        return str(exc)
    await channel.close()
    return ""


@rabbitmq
async def test_the_broker_holds_each_queue_as_declared(make_trigger, queues, admin):
    trigger = make_trigger()
    await trigger._channel()
    async with await aio_pika.connect(URL) as connection:
        await _holds_as_declared(connection, trigger, queues)


async def _holds_as_declared(
    connection: AbstractConnection, trigger: RabbitTrigger, queues: str
) -> None:
    for name, arguments in [
        (trigger.due_queue, trigger.due_arguments()),
        *((trigger.level_queue(ms), trigger.level_arguments(ms)) for ms in LEVELS_MS),
    ]:
        assert await refused(connection, name, **arguments) == "", name
    other = "classic" if queues == "quorum" else "quorum"
    as_other = RabbitTrigger(prefix=trigger.prefix, queues=other).due_arguments()
    refusal = await refused(connection, trigger.due_queue, **as_other)
    assert "inequivalent arg 'x-queue-type'" in refusal
    level = trigger.level_queue(1_000)
    if queues == "quorum":  # the broker holds the strategy: at most once would be refused
        at_most_once = {**trigger.level_arguments(1_000), "x-dead-letter-strategy": "at-most-once"}
        assert "'x-dead-letter-strategy'" in await refused(connection, level, **at_most_once)


@rabbitmq
async def test_queues_of_the_other_kind_are_refused_with_what_to_do(make_trigger, queues):
    first = make_trigger()
    await first._channel()
    other = "classic" if queues == "quorum" else "quorum"
    second = make_trigger(queues=other)
    with pytest.raises(BackendUnavailable) as refusal:
        await second.armed([Armed(1, CLOCK.now())])
    text = str(refusal.value)
    assert f"the {other} queue '{first.due_queue}'" in text
    assert "a queue's type cannot change" in text
    assert f"rabbitmqctl delete_queue {first.due_queue}" in text
    assert "another prefix (?prefix=...)" in text
    with pytest.raises(BackendUnavailable, match="a queue's type cannot change"):
        await second.ping()
    # The queues there stay as they were, and the trigger of their kind goes on working.
    await first.armed([Armed(2, CLOCK.now())])
    assert (await collect(first, {2}, within=3)).keys() == {2}


# --- dead-lettering ---------------------------------------------------------------------------


@rabbitmq
async def test_a_timer_whose_ttl_ran_out_reaches_a_worker_across_a_crash(make_trigger, admin):
    publisher = make_trigger()
    await publisher._channel()
    due = CLOCK.now() + timedelta(seconds=2.1)
    await publisher.armed([Armed(41, due)])
    await publisher.close()  # no consumer anywhere while its 2 s run out
    assert await depths(admin, publisher) == {publisher.level_queue(2_000): 1}

    async def dead_lettered() -> bool:
        return await depths(admin, publisher) == {publisher.due_queue: 1}

    assert await eventually(dead_lettered, 5, 0.05)
    crashing = make_trigger()
    assert (await collect(crashing, {41}, within=3, ack=False)).keys() == {41}
    await crashing.close()  # dies before its ack: RabbitMQ takes the message back
    survivor = make_trigger()
    got = await collect(survivor, {41}, within=3)
    assert got.keys() == {41}
    assert got[41] >= due
    await survivor.close()
    assert await depths(admin, survivor) == {}


@rabbitmq
@pytest.mark.slow
@pytest.mark.parametrize("queues", ["quorum"])
async def test_a_quorum_level_keeps_what_expired_while_the_due_queue_was_missing(
    make_trigger, admin
):
    # At most once (classic queues) the expired message would be dropped on the way; at least
    # once RabbitMQ keeps it and routes it again until the due queue has confirmed it: every
    # 3 minutes by default (dead_letter_worker_publisher_confirm_timeout), or at once when the
    # level's policies change, which the test has happen once the due queue is back (where
    # rabbitmqctl cannot, it waits out the broker's 3 minutes).
    publisher = make_trigger()
    await publisher.armed([Armed(51, CLOCK.now() + timedelta(seconds=1.5))])
    await publisher.close()
    await admin.queue_delete(publisher.due_queue)
    level = publisher.level_queue(1_000)

    async def expired() -> bool:
        return await depth(admin, level) == 0

    assert await eventually(expired, 5, 0.05)
    worker = make_trigger()
    await worker._channel()  # declares the due queue again
    await look_up_dead_letter_routes(worker, 1_000)
    got = await collect(worker, {51}, within=240)
    assert got.keys() == {51}
    await worker.close()
    assert await depths(admin, worker) == {}

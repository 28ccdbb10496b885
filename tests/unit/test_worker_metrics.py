"""The worker's metrics: handler time by kind, batch sizes, trigger errors by operation, the
scanner's passes, finds and errors; and docs/alerts.yml naming only metrics that exist."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from dueflow.domain.timers import TimerKind
from dueflow.exceptions import BackendUnavailable, ConfigError
from dueflow.metrics.prometheus import Metrics
from dueflow.service import orders
from dueflow.service.deps import Deps
from dueflow.service.timeouts import HANDLERS
from dueflow.store.db import Database
from dueflow.store.timers import Armed, Claimed
from dueflow.timers.redis import RedisTrigger
from dueflow.worker.runner import Worker, feed_between
from dueflow.worker.scanner import scan_once

ALERTS = Path(__file__).parents[2] / "docs" / "alerts.yml"
DOWN_URL = "redis://127.0.0.1:1/0"  # nothing listens there: every call is refused
K = TimerKind


def sample(deps: Deps, name: str, **labels: str) -> float | None:
    return deps.metrics.registry.get_sample_value(name, labels)


async def place_and_expire(world) -> int:
    order_id = await orders.place_order(
        world.deps, buyer_id=world.buyer, goods_id=await world.goods()
    )
    world.clock.advance(timedelta(minutes=30, seconds=2))
    return order_id


async def test_a_batch_records_each_kinds_handler_time_and_the_batch_size(world):
    first = await place_and_expire(world)
    second = await place_and_expire(world)
    # One batch of the four due timers, then one of the two notices the cancels wrote.
    assert await world.worker.drain() == 6
    assert (await orders.order_view(world.deps, first))["status"] == "cancelled_unpaid"
    assert (await orders.order_view(world.deps, second))["status"] == "cancelled_unpaid"

    deps, stats = world.deps, world.worker.stats
    assert stats.batches == 2
    for kind in ("cancel_unpaid", "pay_reminder", "order_closed"):
        runs = sample(deps, "dueflow_timer_handler_duration_seconds_count", kind=kind)
        assert runs == 1  # one observation per kind's share of each batch it was in
        assert sample(deps, "dueflow_timer_handler_duration_seconds_sum", kind=kind) >= 0
    assert sample(deps, "dueflow_timer_batch_size_count") == stats.batches
    assert sample(deps, "dueflow_timer_batch_size_sum") == stats.claimed == 6
    assert sample(deps, "dueflow_timer_batch_size_bucket", le="1.0") == 0
    assert sample(deps, "dueflow_timer_batch_size_bucket", le="10000.0") == stats.batches


async def test_a_failing_handler_is_timed_too(world, no_pauses):
    async def failing(deps: Deps, batch: Sequence[Claimed]) -> None:
        raise BackendUnavailable("provider down")

    worker = Worker(world.deps, handlers={**HANDLERS, K.CANCEL_UNPAID: failing})
    await place_and_expire(world)
    await worker.run_once()
    count = "dueflow_timer_handler_duration_seconds_count"
    assert sample(world.deps, count, kind="cancel_unpaid") == 1
    fired = "dueflow_timers_fired_total"
    assert sample(world.deps, fired, kind="cancel_unpaid", result="failed") == 1


async def test_scanner_passes_and_finds_are_counted(world):
    world.deps.batch_size = 1
    for _ in range(3):
        await orders.place_order(world.deps, buyer_id=world.buyer, goods_id=await world.goods())
    world.clock.advance(timedelta(minutes=6))  # the reminders are past the grace

    report = await scan_once(world.worker)
    assert (report.claimed, report.batches) == (3, 3)
    await scan_once(world.worker)  # nothing left to find
    assert sample(world.deps, "dueflow_scanner_passes_total") == 2
    assert sample(world.deps, "dueflow_scanner_claimed_total") == 3
    assert sample(world.deps, "dueflow_scanner_errors_total") == 0


async def test_a_scanner_that_cannot_claim_counts_an_error(world, tmp_path):
    # A real database without the schema: the claim fails as it would on a broken database.
    broken = Database.from_url(f"sqlite:///{tmp_path / 'empty.db'}")
    try:
        deps = dataclasses.replace(world.deps, db=broken)
        report = await scan_once(Worker(deps))
    finally:
        await broken.dispose()
    assert report.errors == 1
    assert sample(deps, "dueflow_scanner_errors_total") == 1
    assert sample(deps, "dueflow_scanner_passes_total") == 1


@pytest.fixture
async def down_trigger(world):
    """The world's dependencies with a Redis trigger nobody answers (a real, refused client)."""
    trigger = RedisTrigger.from_url(DOWN_URL, clock=world.clock)
    try:
        yield dataclasses.replace(world.deps, trigger=trigger)
    finally:
        await trigger.close()


async def test_trigger_errors_are_counted_by_operation(world, down_trigger):
    deps = down_trigger
    errors = "dueflow_trigger_errors_total"

    # arm: placing an order commits and counts the trigger's failure (Deps.arm).
    order_id = await orders.place_order(deps, buyer_id=world.buyer, goods_id=await world.goods())
    assert (await orders.order_view(deps, order_id))["status"] == "pending_payment"
    assert sample(deps, errors, trigger="redis", operation="arm") == 1
    assert deps.trigger_errors == 1

    # wait: the trigger handles the failed claim itself (logs, returns no ids) and tells us.
    assert await deps.trigger.wait(world.clock, world.clock.now()) == []
    assert sample(deps, errors, trigger="redis", operation="wait") == 1

    # ack and feed: the worker's calls raise after counting.
    with pytest.raises(BackendUnavailable):
        await deps.ack([1])
    assert sample(deps, errors, trigger="redis", operation="ack") == 1
    with pytest.raises(BackendUnavailable):
        await feed_between(Worker(deps), None, world.clock.now() + timedelta(hours=1))
    assert sample(deps, errors, trigger="redis", operation="feed") == 1
    with pytest.raises(BackendUnavailable):
        await deps.feed([Armed(1, world.clock.now())])
    assert sample(deps, errors, trigger="redis", operation="feed") == 2


def test_metric_names_follow_prometheus_conventions():
    for family in Metrics().registry.collect():
        assert family.name.startswith("dueflow_")
        if family.type == "counter":
            continue  # exposed as NAME_total by the client
        assert not family.name.endswith("_total"), family.name
        if family.type == "histogram" and family.name != "dueflow_timer_batch_size":
            assert family.name.endswith("_seconds"), family.name


def exposed_names() -> set[str]:
    """Every series name the registry can expose, whether or not it has a sample yet."""
    names = set()
    for family in Metrics().registry.collect():
        if family.type == "counter":
            names |= {f"{family.name}_total", f"{family.name}_created"}
        elif family.type == "histogram":
            names |= {f"{family.name}_{s}" for s in ("bucket", "count", "sum", "created")}
        else:
            names.add(family.name)
    return names


def alert_rules() -> list[dict[str, str]]:
    document = yaml.safe_load(ALERTS.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_every_metric_an_alert_names_exists():
    exposed = exposed_names()
    used = set()
    for rule in alert_rules():
        names = set(re.findall(r"\bdueflow_[a-z0-9_]+", rule["expr"]))
        assert names, rule["alert"]
        assert names <= exposed, (rule["alert"], names - exposed)
        used |= names
    for new in (
        "dueflow_timer_handler_duration_seconds_bucket",
        "dueflow_trigger_errors_total",
        "dueflow_scanner_claimed_total",
        "dueflow_scanner_errors_total",
    ):
        assert new in used


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_promtool_accepts_the_alert_rules():
    checked = subprocess.run(
        ["promtool", "check", "rules", str(ALERTS)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in checked.stdout


@pytest.mark.parametrize(("host", "family"), [("127.0.0.1", "AF_INET"), ("::1", "AF_INET6")])
def test_the_metrics_socket_listens_on_ipv4_and_ipv6_hosts(host, family):
    """Found in review: an IPv6 host (``--metrics-host ::1``) could not be listened on."""
    import socket

    from dueflow.metrics import exposition

    try:
        sock = exposition.listen(host, 0)
    except ConfigError:
        if family == "AF_INET6" and not socket.has_ipv6:
            pytest.skip("this machine has no IPv6")
        raise
    with sock:
        assert sock.family == getattr(socket, family)
        assert sock.getsockname()[1] > 0

"""The webhook notifier against a real HTTP server on 127.0.0.1, and its wiring."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler

import pytest
from sqlalchemy import select

from dueflow import bootstrap
from dueflow.config import load_settings
from dueflow.exceptions import BackendUnavailable, ConfigError, DeliveryUnknown
from dueflow.notifiers import webhook
from dueflow.notifiers.base import Reminder
from dueflow.notifiers.log import LogNotifier
from dueflow.notifiers.webhook import WebhookNotifier
from dueflow.service import orders as order_service
from dueflow.store.schema import reminders
from dueflow.store.schema import timers as t_timers
from tests.conftest import http_receiver

SECRET = "s3cret-key"
REMINDER = Reminder(
    reminder_id=41,
    kind="pay_reminder",
    order_id=7,
    buyer_id=3,
    amount=Decimal("12.50"),
    pay_deadline=datetime(2026, 3, 1, 12, 30, tzinfo=UTC),
)


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Hook:
    """A local receiver: answers with ``statuses`` in turn (the last one repeats)."""

    url: str
    statuses: list[int] = field(default_factory=lambda: [204])
    delay: float = 0.0
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, request: Received) -> int:
        with self.lock:
            self.received.append(request)
            n = len(self.received)
        return self.statuses[min(n, len(self.statuses)) - 1]


@pytest.fixture
def hook() -> Iterator[Hook]:
    state: dict[str, Hook] = {}

    def on_post(request: BaseHTTPRequestHandler) -> None:
        body = request.rfile.read(int(request.headers.get("Content-Length", "0")))
        current = state["hook"]
        status = current.answer(
            Received(request.path, {k.lower(): v for k, v in request.headers.items()}, body)
        )
        if current.delay:
            time.sleep(current.delay)
        request.send_response(status)
        request.send_header("Content-Length", "0")
        request.end_headers()

    with http_receiver(on_post) as url:
        state["hook"] = Hook(url=url)
        yield state["hook"]


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(webhook, "RETRY_DELAYS", (0.01, 0.02))


def unused_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check_signature(request: Received, secret: str = SECRET) -> None:
    timestamp = request.headers["x-dueflow-timestamp"]
    assert abs(int(timestamp) - time.time()) < 60
    expected = hmac.new(secret.encode(), f"{timestamp}.".encode() + request.body, hashlib.sha256)
    assert request.headers["x-dueflow-signature"] == "sha256=" + expected.hexdigest()


async def test_posts_signed_json(hook: Hook):
    notifier = WebhookNotifier(url=hook.url, secret=SECRET)
    try:
        await notifier.send(REMINDER)
    finally:
        await notifier.close()
    (request,) = hook.received
    assert request.path == "/hooks/dueflow"
    assert request.headers["content-type"] == "application/json"
    # A reminder made by hand (the worker's carry their envelope): the envelope without the
    # order.
    assert json.loads(request.body) == {
        "id": "ntc_41",
        "type": "pay_reminder",
        "version": 1,
        "created_at": None,
        "actor": {"type": "system", "name": "notifier"},
        "data": {"buyer_id": 3, "amount": "12.50", "pay_deadline": "2026-03-01T12:30:00+00:00"},
        "order": None,
    }
    assert request.headers["webhook-id"] == "ntc_41"  # the envelope's id
    assert request.headers["x-dueflow-delivery"] == "41"  # the bare reminder id, as it was
    check_signature(request)
    # A signature made with another secret, or over another body, does not match.
    with pytest.raises(AssertionError):
        check_signature(request, secret="other")
    tampered = Received(request.path, request.headers, request.body.replace(b"12.50", b"0.01"))
    with pytest.raises(AssertionError):
        check_signature(tampered)


async def test_retries_5xx_then_delivers_with_the_same_delivery_id(hook: Hook):
    hook.statuses = [500, 503, 204]
    notifier = WebhookNotifier(url=hook.url, secret=SECRET)
    try:
        await notifier.send(REMINDER)
    finally:
        await notifier.close()
    assert len(hook.received) == 3
    assert {r.headers["x-dueflow-delivery"] for r in hook.received} == {"41"}
    assert len({r.body for r in hook.received}) == 1
    for request in hook.received:
        check_signature(request)


async def test_gives_up_after_the_retries_on_5xx(hook: Hook):
    hook.statuses = [500]
    notifier = WebhookNotifier(url=hook.url, secret=SECRET)
    try:
        with pytest.raises(BackendUnavailable, match="HTTP 500"):
            await notifier.send(REMINDER)
    finally:
        await notifier.close()
    assert len(hook.received) == 1 + len(webhook.RETRY_DELAYS)


@pytest.mark.parametrize("status", [400, 401, 404, 410])
async def test_a_4xx_is_final_without_retrying(hook: Hook, status: int):
    hook.statuses = [status, 204]
    notifier = WebhookNotifier(url=hook.url, secret=SECRET)
    try:
        with pytest.raises(BackendUnavailable, match=f"HTTP {status}"):
            await notifier.send(REMINDER)
    finally:
        await notifier.close()
    assert len(hook.received) == 1


async def test_connection_refused_is_backend_unavailable():
    notifier = WebhookNotifier(url=f"http://127.0.0.1:{unused_port()}/hook", secret=SECRET)
    try:
        with pytest.raises(BackendUnavailable, match="ConnectError"):
            await notifier.send(REMINDER)
    finally:
        await notifier.close()


async def test_a_read_timeout_is_an_unknown_outcome_and_not_resent(hook: Hook):
    """The request reached the receiver, which may have taken it: sending it again now could
    deliver it twice (the caller resends later, bounded, under the same delivery id)."""
    hook.delay = 0.5
    notifier = WebhookNotifier(url=hook.url, secret=SECRET, timeout=0.05)
    try:
        with pytest.raises(DeliveryUnknown, match="outcome unknown: ReadTimeout"):
            await notifier.send(REMINDER)
    finally:
        await notifier.close()
    assert len(hook.received) == 1


def test_build_notifier_webhook_needs_a_url():
    with pytest.raises(ConfigError, match="DUEFLOW_NOTIFIER_URL"):
        bootstrap.build_notifier(load_settings(notifier="webhook", notifier_url=None))
    with pytest.raises(ConfigError):
        bootstrap.build_notifier(load_settings(notifier="webhook", notifier_url=""))
    assert isinstance(bootstrap.build_notifier(load_settings(notifier="log")), LogNotifier)


async def test_build_notifier_webhook_with_a_url(hook: Hook):
    settings = load_settings(
        notifier="webhook",
        notifier_url=hook.url,
        notifier_secret=SECRET,
        notifier_timeout="2s",
        notifier_max_deliveries=5,
    )
    notifier = bootstrap.build_notifier(settings)
    try:
        assert isinstance(notifier, WebhookNotifier)
        assert notifier.max_deliveries == 5
        await notifier.send(REMINDER)
    finally:
        await notifier.close()
    (request,) = hook.received
    check_signature(request)


async def test_worker_sends_reminders_through_the_webhook(world, hook: Hook):
    """End to end: the delivery id the receiver sees is the stored reminder's: ``webhook-id``
    is the envelope's id (``ntc_<reminder id>``), the older ``X-Dueflow-Delivery`` the bare
    reminder id, on every try."""
    world.deps.notifier = WebhookNotifier(url=hook.url, secret=SECRET)  # closed by the fixture
    goods_id = await world.goods()
    order_id = await order_service.place_order(world.deps, buyer_id=world.buyer, goods_id=goods_id)
    hook.statuses = [400, 204]
    world.clock.advance(timedelta(minutes=5))
    assert await world.worker.drain() == 1
    async with world.deps.db.read() as conn:
        (rem,) = (await conn.execute(select(reminders))).all()
        (timer,) = (
            await conn.execute(select(t_timers).where(t_timers.c.kind == "pay_reminder"))
        ).all()
    assert rem.state == "pending"
    assert timer.state == "scheduled" and "HTTP 400" in timer.last_error

    world.clock.advance(timedelta(seconds=30))
    assert await world.worker.drain() == 1
    async with world.deps.db.read() as conn:
        (rem,) = (await conn.execute(select(reminders))).all()
    assert rem.state == "sent"
    assert len(hook.received) == 2
    last = hook.received[-1]
    assert last.headers["x-dueflow-delivery"] == str(rem.id)
    assert json.loads(last.body)["order"]["id"] == order_id
    for request in hook.received:
        assert request.headers["webhook-id"] == json.loads(request.body)["id"] == f"ntc_{rem.id}"
        assert request.headers["x-dueflow-delivery"] == str(rem.id)
    check_signature(last)

"""The events webhook against a real HTTP receiver on 127.0.0.1: down (refusing) for a while, then
back; retries with backoff, order, delivery ids, signatures checked independently, restarts,
one delivering process, replays, and what operators see (/metrics, the dashboard)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from sqlalchemy import select

from dueflow import bootstrap
from dueflow.api.app import create_app
from dueflow.config import load_settings
from dueflow.exceptions import ConfigError, InvalidInput
from dueflow.notifiers.event_webhook import EventWebhook, Target
from dueflow.service import accounts, events, orders, webhooks
from dueflow.store import schema
from tests.conftest import eventually, table_snapshot
from tests.envelopes import seq_of

SECRET = "events-s3cret"


@dataclass
class Receiver:
    """A host's endpoint on a fixed port: refuses connections until started, answers
    ``statuses`` in turn (the last repeats), and keeps every request it got."""

    port: int
    statuses: list[int] = field(default_factory=lambda: [204])
    got: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks/orders"

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver.lock:
                    receiver.got.append(({k.lower(): v for k, v in self.headers.items()}, body))
                    n = len(receiver.got)
                self.send_response(receiver.statuses[min(n, len(receiver.statuses)) - 1])
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def verified(self) -> list[dict]:
        """Every request's body, after checking its signature by HMAC-SHA256 computed here."""
        bodies = []
        for headers, body in self.got:
            timestamp = headers["x-dueflow-timestamp"]
            assert abs(int(timestamp) - time.time()) < 60
            mac = hmac.new(SECRET.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
            assert headers["x-dueflow-signature"] == "sha256=" + mac.hexdigest()
            assert headers["content-type"] == "application/json"
            event = json.loads(body)
            assert headers["x-dueflow-delivery"] == event["id"]
            bodies.append(event)
        return bodies


def unused_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver(unused_port())
    try:
        yield found
    finally:
        found.stop()


def deliverer(world, receiver: Receiver) -> webhooks.Deliverer:
    return webhooks.Deliverer(world.deps, EventWebhook(url=receiver.url, secret=SECRET, timeout=2))


async def two_orders(world) -> list[dict]:
    """Events of two orders, interleaved in time, numbered; the feed's view of them."""
    first = await orders.place_order(world.deps, buyer_id=world.buyer, goods_id=await world.goods())
    second = await orders.place_order(
        world.deps, buyer_id=world.other, goods_id=await world.goods()
    )
    await orders.cancel_by_buyer(world.deps, order_id=first, user_id=world.buyer)
    await orders.cancel_by_buyer(world.deps, order_id=second, user_id=world.other)
    await events.sequence(world.deps)
    return await events.feed(world.deps, after=0, limit=500)


async def live(world):
    async with world.deps.db.read() as conn:
        query = select(schema.event_deliveries).where(schema.event_deliveries.c.name == "live")
        return (await conn.execute(query)).one()


def counted(world, outcome: str) -> float:
    return world.deps.metrics.event_deliveries.labels(outcome)._value.get()


async def test_a_receiver_down_for_a_while_then_back_gets_everything_in_order_once(world, receiver):
    fed = await two_orders(world)
    sender = deliverer(world, receiver)
    try:
        # down: each try is refused, and the next waits 1 s, doubling up to 60 s
        waits = []
        for _ in range(9):
            now = world.clock.now()
            await sender.deliver_once()
            row = await live(world)
            assert row.delivered_seq == 0 and "ConnectError" in row.last_error
            waits.append((row.retry_at - now).total_seconds())
            await sender.deliver_once()  # not due yet: nothing is sent
            assert (await live(world)).failures == row.failures
            world.clock.set(row.retry_at)
        assert waits == [1, 2, 4, 8, 16, 32, 60, 60, 60]
        assert (await live(world)).failures == 9
        assert counted(world, "failed") == 9
        assert (await snapshot_backlog(world)) == len(fed)

        receiver.start()
        assert await sender.deliver_once() == world.clock.now() + events.IDLE_PAUSE
    finally:
        await sender.webhook.close()
    got = receiver.verified()
    assert got == fed  # every event, in seq order (so in order per order), each once
    assert [h["x-dueflow-delivery"] for h, _ in receiver.got] == [e["id"] for e in fed]
    for order_id in {e["order"]["id"] for e in fed}:
        mine = [e for e in got if e["order"]["id"] == order_id]
        assert [e["type"] for e in mine] == ["place", "buyer_cancel", "released"]
    row = await live(world)
    assert (row.delivered_seq, row.failures, row.retry_at) == (seq_of(fed[-1]), 0, None)
    assert counted(world, "delivered") == len(fed)
    assert await snapshot_backlog(world) == 0


async def snapshot_backlog(world) -> int:
    from dueflow.service import report

    return (await report.snapshot(world.deps)).event_backlog


async def test_an_answer_lost_is_sent_again_with_the_same_delivery_id_and_nothing_skipped(
    world, receiver
):
    fed = await two_orders(world)
    receiver.statuses = [204, 500, 204]  # the second was taken but answered with an error
    receiver.start()
    sender = deliverer(world, receiver)
    try:
        retry_at = await sender.deliver_once()
        assert (await live(world)).delivered_seq == seq_of(fed[0])
        world.clock.set(retry_at)
        await sender.deliver_once()
    finally:
        await sender.webhook.close()
    ids = [h["x-dueflow-delivery"] for h, _ in receiver.got]
    assert ids == [fed[0]["id"], fed[1]["id"]] + [e["id"] for e in fed[1:]]
    kept = list(dict.fromkeys(e["id"] for e in receiver.verified()))  # the host drops repeats
    assert kept == [e["id"] for e in fed]


async def test_a_restarted_process_goes_on_from_the_stored_position(world, receiver):
    fed = await two_orders(world)
    receiver.statuses = [204, 204, 503]
    receiver.start()
    first = deliverer(world, receiver)
    await first.deliver_once()  # two delivered, the third refused with a 503
    stopped = asyncio.Event()
    stopped.set()
    await first.run(stopped, asyncio.Event())  # the process stops: its lease is given back
    row = await live(world)
    assert (row.owner, row.delivered_seq) == (None, seq_of(fed[1]))

    receiver.statuses = [204]
    receiver.got.clear()
    world.clock.advance(60)
    again = deliverer(world, receiver)  # a new process
    try:
        await again.deliver_once()
    finally:
        await again.webhook.close()
    # the one that failed is sent again; nothing delivered before is
    assert [e["id"] for e in receiver.verified()] == [e["id"] for e in fed[2:]]


async def test_one_process_delivers_at_a_time(world, receiver):
    fed = await two_orders(world)
    receiver.start()
    one, other = deliverer(world, receiver), deliverer(world, receiver)
    try:
        async with world.deps.db.write() as conn:
            await events.store.ensure_live(conn, world.clock.now())
            assert await events.store.take_lease(
                conn, one.name, now=world.clock.now(), lease=webhooks.LEASE
            )
        await other.deliver_once()
        assert receiver.got == []  # the lease is another's
        world.clock.advance(webhooks.LEASE + timedelta(seconds=1))  # it ran out: taken over
        await other.deliver_once()
        assert [e["id"] for e in receiver.verified()] == [e["id"] for e in fed]
        assert (await live(world)).owner == other.name
        await one.deliver_once()  # the first process is back, the lease is held: no repeat
        assert len(receiver.got) == len(fed)
    finally:
        await one.webhook.close()
        await other.webhook.close()


async def test_a_replay_resends_one_event_or_a_range_as_separate_deliveries(world, receiver):
    fed = await two_orders(world)
    receiver.start()
    sender = deliverer(world, receiver)
    try:
        await sender.deliver_once()
        receiver.got.clear()
        assert await webhooks.replay(world.deps, first=2, actor="user:9") == (
            "evt_2 queued to be delivered again"
        )
        await webhooks.replay(world.deps, first=1, last=3, actor="user:9")
        await sender.deliver_once()
    finally:
        await sender.webhook.close()
    assert [e["id"] for e in receiver.verified()] == ["evt_2", "evt_1", "evt_2", "evt_3"]
    assert {h.get("x-dueflow-replay") for h, _ in receiver.got} == {"true"}
    assert receiver.verified()[0] == fed[1]
    assert counted(world, "replayed") == 4
    status = await webhooks.delivery_status(world.deps)
    assert status.replays == []  # both done
    assert status.live is not None and status.live["delivered_seq"] == seq_of(fed[-1])


@pytest.mark.parametrize(("first", "last"), [(0, None), (3, 2), (1, 10**6), (10**6, None)])
async def test_a_replay_out_of_range_is_refused_and_changes_nothing(world, first, last):
    await two_orders(world)
    before = await table_snapshot(world.deps)
    with pytest.raises(InvalidInput):
        await webhooks.replay(world.deps, first=first, last=last, actor="user:9")
    assert await table_snapshot(world.deps) == before


async def test_the_worker_loops_deliver_new_events_and_give_the_lease_back(world, receiver):
    receiver.start()
    stop = asyncio.Event()
    tasks = webhooks.start(
        world.deps, EventWebhook(url=receiver.url, secret=SECRET, timeout=2), stop
    )
    try:
        await orders.place_order(world.deps, buyer_id=world.buyer, goods_id=await world.goods())

        async def delivered() -> bool:
            world.clock.advance(1)
            return len(receiver.got) == 1

        assert await eventually(delivered)
        assert receiver.verified()[0]["type"] == "place"
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=5)
    assert (await live(world)).owner is None


async def test_the_webhook_is_wired_from_its_two_settings():
    none = bootstrap.build_event_webhook(load_settings())
    assert none.configured is None  # the endpoints made over the API only
    await none.close()
    settings = load_settings(
        events_webhook_url="http://host.example/hook", events_webhook_secret=SECRET
    )
    hook = bootstrap.build_event_webhook(settings)
    assert hook.configured == Target("http://host.example/hook", (SECRET,))
    await hook.close()
    with pytest.raises(ConfigError, match="DUEFLOW_EVENTS_WEBHOOK_SECRET"):
        load_settings(events_webhook_url="http://host.example/hook")


async def test_backlog_failures_and_replay_on_metrics_and_the_dashboard(world, receiver):
    fed = await two_orders(world)
    sender = deliverer(world, receiver)
    try:
        await sender.deliver_once()  # refused
    finally:
        await sender.webhook.close()
    _, token = await accounts.add_user(world.deps, "root", admin=True)
    app = create_app(world.deps, session_secret="s" * 32, session_ttl=timedelta(hours=1))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://dueflow") as client:
        metrics = (await client.get("/metrics")).text
        assert f"dueflow_events_backlog {float(len(fed))}" in metrics
        assert 'dueflow_event_deliveries_total{outcome="failed"} 1.0' in metrics

        login = await client.post("/admin/login", data={"token": token, "next": "/admin"})
        assert login.status_code == 303
        page = (await client.get("/admin")).text
        section = page[page.index('id="events"') :]
        assert "ConnectError" in section and "failures in a row" in section
        assert f"<b>{len(fed)}</b> events to deliver" in page
        csrf = re.search(r'name="csrf" value="([0-9a-f]{64})"', page).group(1)

        forged = await client.post("/admin/events/replay", data={"first": "1"})
        assert forged.status_code == 403
        for bad in ({"first": "x"}, {"first": "99"}, {"first": "3", "last": "2"}):
            before = await table_snapshot(world.deps)
            answer = await client.post("/admin/events/replay", data={"csrf": csrf, **bad})
            assert answer.status_code == 303
            assert "Refused" in answer.cookies.get("dueflow_flash", "")
            assert await table_snapshot(world.deps) == before
        answer = await client.post(
            "/admin/events/replay", data={"csrf": csrf, "first": "1", "last": "2"}
        )
        assert answer.status_code == 303
    status = await webhooks.delivery_status(world.deps)
    assert [(r["delivered_seq"], r["until_seq"]) for r in status.replays] == [(0, 2)]
    assert status.replays[0]["requested_by"].startswith("user:")


async def test_stopping_ends_a_pass_after_the_event_in_flight(world, receiver: Receiver):
    """Found in review: a pass sent its whole batch (up to 50 events) before looking at stop,
    so a shutdown could wait minutes on a slow host; now it ends after the event in flight,
    and the next process goes on from the stored position."""
    fed = await two_orders(world)
    loop = asyncio.get_running_loop()
    stop, wake = asyncio.Event(), asyncio.Event()

    def stopping() -> None:  # what webhooks.start does at SIGTERM
        stop.set()
        wake.set()

    class StopOnFirst(list):  # type: ignore[type-arg]
        def append(self, item: object) -> None:
            super().append(item)
            loop.call_soon_threadsafe(stopping)  # SIGTERM arrives while the first is in flight

    receiver.got = StopOnFirst()
    receiver.start()
    await asyncio.wait_for(deliverer(world, receiver).run(stop, wake), timeout=10)
    assert [e["id"] for e in receiver.verified()] == [fed[0]["id"]]
    assert (await live(world)).delivered_seq == seq_of(fed[0])
    await deliverer(world, receiver).deliver_once()
    assert [e["id"] for e in receiver.verified()] == [e["id"] for e in fed]


async def test_an_operator_skips_an_event_the_host_refuses_for_good(world, receiver: Receiver):
    """Found in review: a host refusing one event (a 4xx on its body) held every later event
    back forever, and a replay could not help; an operator can now skip it from the dashboard
    (CSRF like every form). The skip is an event the host gets next."""
    fed = await two_orders(world)
    receiver.statuses = [400, 400, 204]
    receiver.start()
    sender = deliverer(world, receiver)
    try:
        await sender.deliver_once()  # refused
        _, token = await accounts.add_user(world.deps, "root", admin=True)
        app = create_app(world.deps, session_secret="s" * 32, session_ttl=timedelta(hours=1))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://dueflow") as client:
            await client.post("/admin/login", data={"token": token, "next": "/admin"})
            page = (await client.get("/admin")).text
            assert 'action="/admin/events/skip"' in page
            csrf = re.search(r'name="csrf" value="([0-9a-f]{64})"', page).group(1)
            forged = await client.post("/admin/events/skip", data={"seq": str(seq_of(fed[0]))})
            assert forged.status_code == 403
            before = await table_snapshot(world.deps)
            wrong = await client.post(
                "/admin/events/skip", data={"csrf": csrf, "seq": str(seq_of(fed[1]))}
            )
            assert "Refused" in wrong.cookies.get("dueflow_flash", "")
            assert await table_snapshot(world.deps) == before
            done = await client.post(
                "/admin/events/skip", data={"csrf": csrf, "seq": str(seq_of(fed[0]))}
            )
            assert done.status_code == 303 and "skipped" in done.cookies.get("dueflow_flash", "")
        assert (await live(world)).delivered_seq == seq_of(fed[0])
        await events.sequence(world.deps)
        receiver.statuses = [204]
        world.clock.advance(timedelta(minutes=5))  # past the backoff
        await sender.deliver_once()
    finally:
        await sender.webhook.close()
    got = [e["id"] for e in receiver.verified()]
    # the refused event once, then everything after it and the skip itself, in order
    assert got[0] == fed[0]["id"] and got[1:-1] == [e["id"] for e in fed[1:]]
    assert receiver.verified()[-1]["type"] == "event_skipped"

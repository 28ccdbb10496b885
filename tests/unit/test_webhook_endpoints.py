"""Several webhook endpoints against real HTTP receivers on 127.0.0.1, on the three databases:
each gets exactly the events of its filter, in order, once, across an outage; every message is
verified by the Standard Webhooks library (``standardwebhooks``, a dev dependency); rotation,
replay per endpoint, and URLs of private addresses refused at creation and at send time."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from dueflow.api.app import create_app
from dueflow.domain.events import NOTICE_TYPES, EventType
from dueflow.exceptions import InvalidInput, NotFound, UnsafeURL
from dueflow.notifiers.event_webhook import EventWebhook
from dueflow.service import events, orders, webhook_endpoints, webhooks
from tests.conftest import table_snapshot
from tests.envelopes import seq_of
from tests.unit.test_event_webhooks import Receiver, unused_port


@pytest.fixture
def receivers() -> Iterator[list[Receiver]]:
    found = [Receiver(unused_port()), Receiver(unused_port())]
    try:
        yield found
    finally:
        for r in found:
            r.stop()


def verified(receiver: Receiver, secret: str) -> list[dict]:
    """Every body the receiver got, each verified by the Standard Webhooks library; the
    message id is the event's id."""
    bodies = []
    for headers, body in receiver.got:
        event = Webhook(secret).verify(body, headers)
        assert headers["webhook-id"] == event["id"]
        assert "x-dueflow-signature" not in headers  # whsec_ secrets: the standard headers only
        bodies.append(event)
    return bodies


async def orders_and_cancels(world, count: int) -> None:
    for _ in range(count):
        order_id = await orders.place_order(
            world.deps, buyer_id=world.buyer, goods_id=await world.goods()
        )
        await orders.cancel_by_buyer(world.deps, order_id=order_id, user_id=world.buyer)
    await events.sequence(world.deps)


async def delivered(world, sender: webhooks.Deliverer, passes: int = 5) -> None:
    for _ in range(passes):
        if await sender.deliver_once() is not None:
            return


async def test_two_endpoints_each_get_their_events_in_order_once_across_an_outage(
    backend_world, receivers
):
    world = backend_world
    world.deps.webhook_allow_private = True
    placed_to, cancelled_to = receivers
    a = await webhook_endpoints.create(
        world.deps, url=placed_to.url, event_types=["place"], actor="user:1"
    )
    b = await webhook_endpoints.create(
        world.deps, url=cancelled_to.url, event_types=["buyer_cancel", "pay"], actor="user:1"
    )
    assert a["secret"].startswith("whsec_") and a["secret"] != b["secret"]
    sender = webhooks.Deliverer(world.deps, EventWebhook(timeout=2, allow_private=True))
    placed_to.start()
    cancelled_to.start()
    try:
        await orders_and_cancels(world, 2)
        await delivered(world, sender)
        # the outage: both receivers down; each try fails, the next waits 1 s, 2 s, 4 s
        placed_to.stop()
        cancelled_to.stop()
        await orders_and_cancels(world, 2)
        for wait in (1, 2, 4):
            now = world.clock.now()
            await sender.deliver_once()
            status = await webhook_endpoints.show(world.deps, a["id"])
            assert status["status"]["retry_at"] == now + timedelta(seconds=wait)
            assert status["status"]["backlog"] == 2 and status["status"]["last_error"]
            world.clock.advance(timedelta(seconds=wait))
        placed_to.start()
        cancelled_to.start()
        await delivered(world, sender)
    finally:
        await sender.webhook.close()
    feed = await events.feed(world.deps, after=0, limit=500)
    assert [e["type"] for e in verified(placed_to, a["secret"])] == ["place"] * 4
    assert verified(placed_to, a["secret"]) == [e for e in feed if e["type"] == "place"]
    assert verified(cancelled_to, b["secret"]) == [e for e in feed if e["type"] == "buyer_cancel"]
    for endpoint in (a, b):
        status = (await webhook_endpoints.show(world.deps, endpoint["id"]))["status"]
        assert (status["backlog"], status["failures"], status["retry_at"]) == (0, 0, None)
        assert status["delivered_seq"] == seq_of(feed[-1])  # past the events it leaves out
    # one endpoint's secret does not verify the other's messages
    with pytest.raises(WebhookVerificationError):
        verified(placed_to, b["secret"])


async def test_a_disabled_endpoint_gets_nothing_and_a_new_one_starts_after_the_last_event(
    world, receivers
):
    world.deps.webhook_allow_private = True
    first, second = receivers
    await orders_and_cancels(world, 1)  # before any endpoint: sent to none
    before = len(await events.feed(world.deps, after=0, limit=500))
    one = await webhook_endpoints.create(world.deps, url=first.url, actor="user:1")
    two = await webhook_endpoints.create(world.deps, url=second.url, actor="user:1")
    await webhook_endpoints.update(
        world.deps, two["id"], changes={"enabled": False}, actor="user:1"
    )
    first.start()
    second.start()
    sender = webhooks.Deliverer(world.deps, EventWebhook(timeout=2, allow_private=True))
    try:
        await orders_and_cancels(world, 1)
        await delivered(world, sender)
    finally:
        await sender.webhook.close()
    feed = await events.feed(world.deps, after=0, limit=500)
    assert verified(first, one["secret"]) == feed[before:]
    assert second.got == []


async def test_a_rotated_secret_signs_with_the_old_one_beside_it_for_a_while(
    backend_world, receivers
):
    world = backend_world
    world.deps.webhook_allow_private = True
    receiver = receivers[0]
    made = await webhook_endpoints.create(world.deps, url=receiver.url, actor="user:1")
    rotated = await webhook_endpoints.rotate(
        world.deps, made["id"], keep_old_for=timedelta(hours=1), actor="user:1"
    )
    assert rotated["secret"] != made["secret"]
    assert rotated["previous_secret_until"] == world.clock.now() + timedelta(hours=1)
    assert "secret" not in await webhook_endpoints.show(world.deps, made["id"])
    receiver.start()
    sender = webhooks.Deliverer(world.deps, EventWebhook(timeout=2, allow_private=True))
    try:
        await orders_and_cancels(world, 1)
        await delivered(world, sender)
        world.clock.advance(timedelta(hours=1, seconds=1))  # the old one no longer signs
        await orders_and_cancels(world, 1)
        await delivered(world, sender)
    finally:
        await sender.webhook.close()
    assert len(receiver.got) == 6  # place, buyer_cancel, released; twice
    both, only_new = receiver.got[:3], receiver.got[3:]
    for headers, body in both:
        assert len(headers["webhook-signature"].split(" ")) == 2
        Webhook(made["secret"]).verify(body, headers)
        Webhook(rotated["secret"]).verify(body, headers)
    for headers, body in only_new:
        Webhook(rotated["secret"]).verify(body, headers)
        with pytest.raises(WebhookVerificationError):
            Webhook(made["secret"]).verify(body, headers)


async def test_a_replay_goes_to_its_endpoint_only(world, receivers):
    world.deps.webhook_allow_private = True
    first, second = receivers
    one = await webhook_endpoints.create(world.deps, url=first.url, actor="user:1")
    two = await webhook_endpoints.create(world.deps, url=second.url, actor="user:1")
    first.start()
    second.start()
    sender = webhooks.Deliverer(world.deps, EventWebhook(timeout=2, allow_private=True))
    try:
        await orders_and_cancels(world, 2)
        await delivered(world, sender)
        feed = await events.feed(world.deps, after=0, limit=500)
        told = await webhook_endpoints.replay(
            world.deps, one["id"], first=seq_of(feed[1]), last=seq_of(feed[2]), actor="user:1"
        )
        assert told == f"{feed[1]['id']} to {feed[2]['id']} queued to be delivered again"
        await delivered(world, sender)
    finally:
        await sender.webhook.close()
    assert verified(first, one["secret"]) == [*feed, feed[1], feed[2]]
    assert [h.get("dueflow-replay") for h, _ in first.got] == [None] * len(feed) + ["true"] * 2
    assert verified(second, two["secret"]) == feed
    with pytest.raises(NotFound):
        await webhook_endpoints.replay(world.deps, 999, first=1, actor="user:1")


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/hook",
        "http://localhost/hook",
        "http://[::1]/hook",
        "http://10.1.2.3/hook",
        "http://192.168.0.10/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://0.0.0.0/hook",
        "http://[::ffff:127.0.0.1]/hook",
        "http://224.0.0.1/hook",
        "http://240.0.0.1/hook",
        "ftp://host.example/hook",
        "http://user:pw@93.184.216.34/hook",
        "file:///etc/passwd",
        "http:///nohost",
    ],
)
async def test_an_unsafe_url_is_refused_and_nothing_is_made(world, url):
    before = await table_snapshot(world.deps)
    with pytest.raises(UnsafeURL) as refused:
        await webhook_endpoints.create(world.deps, url=url, actor="user:1")
    assert refused.value.code == "unsafe_webhook_url"
    assert "127.0.0.1" not in refused.value.message or "127.0.0.1" in url
    assert await table_snapshot(world.deps) == before


async def test_bad_types_are_refused_and_nothing_is_made(world):
    before = await table_snapshot(world.deps)
    for types in (["Place"], ["x" * 33], ["place; drop"], ["place"] * 51):
        with pytest.raises(InvalidInput):
            await webhook_endpoints.create(
                world.deps, url="http://93.184.216.34/hook", event_types=types, actor="user:1"
            )
    # well formed, but no type the code writes (EventType), or a buyer notice's (not sent to
    # endpoints: the notifier sends those)
    for types, says in (
        (["placed"], "'placed' is not an order event type"),
        (["pay", "refund"], "'refund' is not an order event type"),
        (["order_closed"], "'order_closed' is a buyer notice"),
        (["place", "pay_reminder"], "'pay_reminder' is a buyer notice"),
    ):
        with pytest.raises(InvalidInput, match=says) as refused:
            await webhook_endpoints.create(
                world.deps, url="http://93.184.216.34/hook", event_types=types, actor="user:1"
            )
        assert refused.value.code == "invalid_input"
    assert await table_snapshot(world.deps) == before
    # every order event type is taken (each once, sorted)
    made = await webhook_endpoints.create(
        world.deps,
        url="http://93.184.216.34/hook",
        event_types=[t.value for t in EventType if t not in NOTICE_TYPES] + ["pay"],
        actor="user:1",
    )
    assert made["event_types"] == sorted(t.value for t in EventType if t not in NOTICE_TYPES)
    # and a change to an unknown one changes nothing
    before = await table_snapshot(world.deps)
    for types in (["refund"], ["order_closed"]):
        with pytest.raises(InvalidInput):
            await webhook_endpoints.update(
                world.deps, made["id"], changes={"event_types": types}, actor="user:1"
            )
    assert await table_snapshot(world.deps) == before


async def test_over_the_api_an_unknown_type_is_422_invalid_input_and_changes_nothing(world):
    from tests.unit.api import running_api

    async with running_api(world.deps) as api:
        made = await api.call(
            "POST", "/api/admin/webhooks", "admin", json={"url": "http://93.184.216.34/h"}
        )
        assert made.status_code == 201, made.text
        endpoint = f"/api/admin/webhooks/{made.json()['id']}"
        before = await table_snapshot(world.deps)
        for types in (["placed"], ["pay", "Pay"], ["order_closed"], ["pay_reminder"], [1]):
            for method, path, body in (
                ("POST", "/api/admin/webhooks", {"url": "http://93.184.216.34/h"}),
                ("PATCH", endpoint, {}),
            ):
                answer = await api.call(method, path, "admin", json={**body, "event_types": types})
                assert answer.status_code == 422, (method, types, answer.text)
                assert answer.json()["error"]["code"] == "invalid_input", answer.text
                assert "event_types" in answer.json()["error"]["message"]
        assert await table_snapshot(world.deps) == before
        changed = await api.call(
            "PATCH", endpoint, "admin", json={"event_types": ["ship", "pay", "pay"]}
        )
        assert (changed.status_code, changed.json()["event_types"]) == (200, ["pay", "ship"])
    # the OpenAPI document declares the types: an EventType each
    spec = create_app(world.deps).openapi()
    schemas = spec["components"]["schemas"]
    assert schemas["EventType"]["enum"] == [t.value for t in EventType]
    for model in ("NewEndpoint", "EndpointChange"):
        (listed, _) = schemas[model]["properties"]["event_types"]["anyOf"]
        assert listed["items"] == {"$ref": "#/components/schemas/EventType"}


async def test_a_private_address_is_refused_at_send_time_too(world, receivers):
    """An endpoint made while private addresses were allowed (or whose name resolves
    elsewhere now) is refused at the send: nothing reaches the receiver."""
    world.deps.webhook_allow_private = True
    receiver = receivers[0]
    made = await webhook_endpoints.create(
        world.deps, url=f"http://localhost:{receiver.port}/hooks/orders", actor="user:1"
    )
    receiver.start()
    strict = webhooks.Deliverer(world.deps, EventWebhook(timeout=2, allow_private=False))
    try:
        await orders_and_cancels(world, 1)
        await strict.deliver_once()
    finally:
        await strict.webhook.close()
    assert receiver.got == []
    status = (await webhook_endpoints.show(world.deps, made["id"]))["status"]
    assert status["failures"] == 1 and status["last_error"].startswith("refused: localhost")
    # allowed, the request goes to the address checked, under the URL's own Host
    world.clock.advance(webhooks.LEASE + timedelta(seconds=1))  # the strict one's lease ends
    allowed = webhooks.Deliverer(world.deps, EventWebhook(timeout=2, allow_private=True))
    try:
        await delivered(world, allowed)
    finally:
        await allowed.webhook.close()
    feed = await events.feed(world.deps, after=0, limit=500)
    assert [h["host"] for h, _ in receiver.got] == [f"localhost:{receiver.port}"] * len(feed)
    assert [json.loads(b) for _, b in receiver.got] == feed


async def test_an_endpoint_is_listed_by_cursor_updated_and_deleted(world):
    world.deps.webhook_allow_private = True
    made = [
        await webhook_endpoints.create(world.deps, url=f"http://10.0.0.{n}/h", actor="user:1")
        for n in range(1, 4)
    ]
    first = await webhook_endpoints.page(world.deps, after=None, limit=2)
    assert [e["id"] for e in first.items] == [made[2]["id"], made[1]["id"]]
    assert all("secret" not in e for e in first.items)
    rest = await webhook_endpoints.page(world.deps, after=first.next, limit=2)
    assert [e["id"] for e in rest.items] == [made[0]["id"]] and rest.next is None
    changed = await webhook_endpoints.update(
        world.deps, made[0]["id"], changes={"event_types": ["pay"]}, actor="user:1"
    )
    assert changed["event_types"] == ["pay"]
    world.deps.webhook_allow_private = False
    before = await table_snapshot(world.deps)
    with pytest.raises(UnsafeURL):
        await webhook_endpoints.update(
            world.deps, made[0]["id"], changes={"url": "http://10.9.9.9/"}, actor="user:1"
        )
    assert await table_snapshot(world.deps) == before
    await webhook_endpoints.delete(world.deps, made[0]["id"], actor="user:1")
    with pytest.raises(NotFound):
        await webhook_endpoints.show(world.deps, made[0]["id"])


async def test_over_the_api_the_secret_is_shown_at_creation_and_rotation_only(world, caplog):
    from tests.unit.api import running_api

    caplog.set_level("DEBUG")
    async with running_api(world.deps) as api:
        made = await api.call(
            "POST", "/api/admin/webhooks", "admin", json={"url": "http://93.184.216.34/h"}
        )
        assert made.status_code == 201 and made.json()["secret"].startswith("whsec_")
        endpoint_id = made.json()["id"]
        rotated = await api.call(
            "POST", f"/api/admin/webhooks/{endpoint_id}/rotate", "admin", json={}
        )
        shown = [
            (await api.call("GET", "/api/admin/webhooks", "admin")).text,
            (await api.call("GET", f"/api/admin/webhooks/{endpoint_id}", "admin")).text,
            (
                await api.call(
                    "PATCH", f"/api/admin/webhooks/{endpoint_id}", "admin", json={"enabled": False}
                )
            ).text,
        ]
    for secret in (made.json()["secret"], rotated.json()["secret"]):
        assert all(secret not in text for text in shown)
        assert secret not in caplog.text
        assert secret[6:] not in caplog.text

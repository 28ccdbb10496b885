"""Traces with the SDK's in-memory exporter: an order placed over HTTP (taking the caller's
``traceparent``) and left to expire, another paid through the simulator; the request, transaction,
provider, timer handler and webhook spans, their parents and links across the worker and the
event deliverer, and the ``traceparent`` each outgoing request carried (webhooks to real local
receivers, provider calls as the simulator got them). With tracing off: no span, no header, the
columns NULL."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import select

from dueflow import bootstrap, tracing
from dueflow.api.app import create_app
from dueflow.clock import FakeClock
from dueflow.config import load_settings
from dueflow.exceptions import ConfigError
from dueflow.notifiers.event_webhook import EventWebhook
from dueflow.notifiers.webhook import WebhookNotifier
from dueflow.payments.simulator import SimulatorConfig
from dueflow.payments.simulator.app import create_app as simulator_app
from dueflow.service import accounts, events, webhooks
from dueflow.service.deps import Deps
from dueflow.store import schema
from dueflow.worker.runner import Worker
from tests.conftest import START
from tests.unit.test_event_webhooks import Receiver, unused_port

#: The caller's own trace: the placing request's span is a child of this span.
CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class Seen(httpx.AsyncBaseTransport):
    """The transport to the simulator's app, keeping the headers of every request sent to it."""

    def __init__(self, app: Any) -> None:
        self.inner = httpx.ASGITransport(app=app)
        self.headers: list[tuple[str, httpx.Headers]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.headers.append((request.url.path, request.headers))
        return await self.inner.handle_async_request(request)


class Forward(httpx.AsyncBaseTransport):
    """To dueflow's app, made after the simulator that calls it."""

    def __init__(self) -> None:
        self.app: Any = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await httpx.ASGITransport(app=self.app).handle_async_request(request)


@dataclass
class Shop:
    deps: Deps
    clock: FakeClock
    api: httpx.AsyncClient
    sim: httpx.AsyncClient
    seen: Seen
    notices: Receiver
    events: Receiver
    seller: int
    buyer: int
    token: str
    orders: list[int] = field(default_factory=list)

    async def place(self, headers: dict[str, str] | None = None) -> int:
        goods = await accounts.add_goods(self.deps, seller_id=self.seller, title="tent", price="9")
        answer = await self.api.post(
            "/api/orders",
            json={"goods_id": goods},
            headers={"Authorization": f"Bearer {self.token}", **(headers or {})},
        )
        assert answer.status_code == 201, answer.text
        return int(answer.json()["id"])

    async def pay(self, order_id: int) -> None:
        started = await self.api.post(
            f"/api/orders/{order_id}/payments",
            json={"provider": "alipay"},
            headers={"Authorization": f"Bearer {self.token}"},
        )
        assert started.status_code == 201, started.text
        pay_no = started.json()["pay_no"]
        paid = await self.sim.post(
            "/control/pay", json={"provider": "alipay", "out_trade_no": pay_no}
        )
        assert paid.status_code == 200, paid.text
        await self.sim.post("/control/deliver")

    async def expire_and_deliver(self) -> None:
        """Every timer due a day on run by the worker; every event sent to the receiver."""
        self.clock.advance(timedelta(days=1))
        await Worker(self.deps).drain()
        await events.sequence(self.deps)
        sender = webhooks.Deliverer(self.deps, EventWebhook(url=self.events.url, secret="s"))
        try:
            await sender.deliver_once()
        finally:
            await sender.webhook.close()


@pytest.fixture
def receivers() -> Iterator[tuple[Receiver, Receiver]]:
    found = Receiver(unused_port()), Receiver(unused_port())
    for receiver in found:
        receiver.start()
    try:
        yield found
    finally:
        for receiver in found:
            receiver.stop()


@asynccontextmanager
async def open_shop(db_path: Path, receivers: tuple[Receiver, Receiver]) -> AsyncIterator[Shop]:
    """dueflow over HTTP in process, paying through the simulator (which notifies it back),
    its buyer notices to one receiver; created after tracing was turned on or not."""
    notices, sent_events = receivers
    clock = FakeClock(START)
    forward = Forward()
    config = SimulatorConfig.generate(clock=clock, transport=forward)
    seen = Seen(simulator_app(config))
    settings = load_settings(
        database_url=f"sqlite:///{db_path}",
        public_url="http://dueflow",
        **dataclasses.asdict(config.client_config("http://sim")),
    )
    notifier = WebhookNotifier(url=notices.url, secret="notice-secret")
    async with (
        httpx.AsyncClient(transport=seen, base_url="http://sim") as sim,
        bootstrap.running(
            settings, clock=clock, notifier=notifier, http=sim, migrate_sqlite=False
        ) as deps,
    ):
        forward.app = create_app(deps)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=forward.app), base_url="http://dueflow"
        ) as api:
            seller, _ = await accounts.add_user(deps, "seller")
            buyer, token = await accounts.add_user(deps, "buyer")
            yield Shop(
                deps, clock, api, sim, seen, notices, sent_events, seller.id, buyer.id, token
            )


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """Tracing on, every span kept in memory as it ends; off again after the test."""
    found = InMemorySpanExporter()
    tracing.start([found])
    try:
        yield found
    finally:
        tracing.stop()


def traceparent(span: ReadableSpan) -> str:
    context = span.get_span_context()
    assert context is not None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def linked(span: ReadableSpan) -> list[str]:
    return [
        f"00-{c.trace_id:032x}-{c.span_id:016x}-{c.trace_flags:02x}"
        for c in (link.context for link in span.links)
    ]


def parent_of(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def one(spans: list[ReadableSpan], name: str, **attributes: Any) -> ReadableSpan:
    found = [
        s
        for s in spans
        if s.name == name
        and all(
            s.attributes is not None and s.attributes.get(k) == v for k, v in attributes.items()
        )
    ]
    assert len(found) == 1, (name, [s.name for s in spans])
    return found[0]


def headers_of(receiver: Receiver) -> list[dict[str, str]]:
    return [headers for headers, _ in receiver.got]


async def test_spans_follow_an_order_from_the_request_to_its_timers_and_webhooks(
    exporter: InMemorySpanExporter, db_path: Path, receivers: tuple[Receiver, Receiver]
) -> None:
    async with open_shop(db_path, receivers) as shop:
        expiring = await shop.place({"traceparent": CALLER})
        paid = await shop.place()
        await shop.pay(paid)
        await shop.expire_and_deliver()
        spans = list(exporter.get_finished_spans())

        # The request that placed the first order: a child of the caller's span.
        placed = [s for s in spans if s.name == "POST /api/orders"]
        assert len(placed) == 2
        [first] = [s for s in placed if s.parent is not None and s.parent.is_remote]
        assert traceparent(first).split("-")[1] == CALLER.split("-")[1]
        assert parent_of(first) == int(CALLER.split("-")[2], 16)
        assert first.attributes is not None
        assert first.attributes["http.response.status_code"] == 201
        assert first.attributes["http.route"] == "/api/orders"
        assert first.attributes["enduser.id"] == shop.buyer
        # its transactions are its children
        first_id = first.get_span_context().span_id  # type: ignore[union-attr]
        writes = [s for s in spans if s.name == "db.write" and parent_of(s) == first_id]
        assert writes, [s.name for s in spans if parent_of(s) == first_id]

        # The worker's handler that cancelled it: a trace of its own, linked to the request.
        cancel = one(spans, "timer cancel_unpaid")
        assert cancel.parent is None
        assert traceparent(first) in linked(cancel)
        # The notice the cancel armed: its handler links to the cancel's; its POST is a child.
        closed = one(spans, "timer order_closed")
        assert traceparent(cancel) in linked(closed)
        notice = one(spans, "webhook notice", **{"dueflow.order_id": expiring})
        assert parent_of(notice) == closed.get_span_context().span_id  # type: ignore[union-attr]
        assert traceparent(notice) in [h.get("traceparent") for h in headers_of(shop.notices)]

        # Paying the other: the provider's call is a child of the request, and carried its span.
        start = one(spans, "POST /api/orders/{order_id}/payments")
        precreate = one(spans, "alipay alipay.trade.precreate")
        assert parent_of(precreate) == start.get_span_context().span_id  # type: ignore[union-attr]
        sent = [
            h.get("traceparent") for path, h in shop.seen.headers if path == "/alipay/gateway.do"
        ]
        assert traceparent(precreate) in sent, shop.seen.headers
        # The simulator's notification carries its span into dueflow's notify route.
        notify = one(spans, "simulator notify alipay")
        route = one(spans, "POST /notify/alipay")
        assert parent_of(route) == notify.get_span_context().span_id  # type: ignore[union-attr]

        # Every event delivered: one span each, linked to the span that wrote the event, and the
        # POST carried the delivery's span.
        async with shop.deps.db.read() as conn:
            rows = (
                await conn.execute(select(schema.order_events).order_by(schema.order_events.c.seq))
            ).all()
        deliveries = [s for s in spans if s.name == "webhook deliver"]
        assert len(deliveries) == len(rows) == len(shop.events.got)
        for row, delivery, headers in zip(rows, deliveries, headers_of(shop.events), strict=True):
            assert delivery.parent is None
            assert linked(delivery) == [row.trace_parent]
            assert headers["traceparent"] == traceparent(delivery)
        writers = {row.event: row.trace_parent for row in rows if row.order_id == expiring}
        assert writers["place"] == traceparent(first)
        assert writers["pay_timeout"] == traceparent(cancel)
        # The timers kept the span that armed them.
        async with shop.deps.db.read() as conn:
            query = select(schema.timers.c.kind, schema.timers.c.trace_parent).where(
                schema.timers.c.order_id == expiring
            )
            armed = dict((await conn.execute(query)).all())
        assert armed["cancel_unpaid"] == traceparent(first)
        assert armed["order_closed"] == traceparent(cancel)
        assert tracing.current_trace_id() is None  # outside every span


async def test_with_tracing_off_nothing_is_recorded_and_nothing_kept(
    db_path: Path, receivers: tuple[Receiver, Receiver]
) -> None:
    before = InMemorySpanExporter()
    tracing.start([before])
    tracing.stop()  # on once in this process, then off: nothing of it stays
    assert not tracing.on()
    async with open_shop(db_path, receivers) as shop:
        expiring = await shop.place({"traceparent": CALLER})
        paid = await shop.place()
        await shop.pay(paid)
        await shop.expire_and_deliver()
        assert shop.notices.got and shop.events.got  # they did go out
        sent = [
            *headers_of(shop.notices),
            *headers_of(shop.events),
            *(dict(h) for _, h in shop.seen.headers),
        ]
        assert not [h for h in sent if "traceparent" in h]
        async with shop.deps.db.read() as conn:
            kept = [
                *(await conn.execute(select(schema.timers.c.trace_parent))).scalars(),
                *(await conn.execute(select(schema.order_events.c.trace_parent))).scalars(),
            ]
        assert len(kept) > 6 and set(kept) == {None}
        assert expiring != paid
    assert before.get_finished_spans() == ()
    assert tracing.current_traceparent() is None and tracing.current_trace_id() is None


@pytest.mark.parametrize(
    ("environ", "exporters"),
    [
        ({}, ()),
        ({"OTEL_TRACES_EXPORTER": "none"}, ()),
        ({"OTEL_TRACES_EXPORTER": "console"}, ("console",)),
        ({"OTEL_TRACES_EXPORTER": "otlp, console"}, ("otlp", "console")),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, ("otlp",)),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, ("otlp",)),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_SDK_DISABLED": "true"}, ()),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "TRUE"}, ()),
    ],
)
def test_the_otel_variables_decide_whether_tracing_is_on(
    environ: dict[str, str], exporters: tuple[str, ...]
) -> None:
    assert tracing.wanted(environ) == exporters


def test_an_exporter_that_cannot_be_made_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="zipkin is not one of"):
        tracing.wanted({"OTEL_TRACES_EXPORTER": "zipkin"})
    grpc = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    with pytest.raises(ConfigError, match="use http/protobuf"):
        tracing.setup(grpc)
    assert not tracing.on()
    assert tracing.setup({}) is False and not tracing.on()


def test_otlp_spans_reach_a_collector_over_http(
    receivers: tuple[Receiver, Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    collector, _ = receivers
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url.removesuffix("/hooks/orders"))
    assert tracing.setup()
    try:
        with tracing.span("placing") as span:
            assert span is not None
            assert tracing.current_trace_id() == f"{span.get_span_context().trace_id:032x}"
    finally:
        tracing.stop()  # the batch is sent on the way out
    assert len(collector.got) == 1
    headers, body = collector.got[0]
    assert headers["content-type"] == "application/x-protobuf"
    assert b"placing" in body

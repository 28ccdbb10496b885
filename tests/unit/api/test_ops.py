"""Operators' endpoints: readiness and Prometheus metrics."""

from __future__ import annotations

from datetime import timedelta

import httpx

from dueflow.api.app import create_app
from dueflow.service import orders


async def client_of(world) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=create_app(world.deps))
    return httpx.AsyncClient(transport=transport, base_url="http://dueflow")


async def test_readyz_answers_when_the_database_does(world):
    async with await client_of(world) as client:
        answer = await client.get("/readyz")
    assert (answer.status_code, answer.json()) == (200, {"status": "ready"})


async def test_metrics_count_timers_lateness_notifications_and_alarms(world):
    order_id = await orders.place_order(
        world.deps, buyer_id=world.buyer, goods_id=await world.goods()
    )
    world.clock.advance(timedelta(minutes=30, seconds=2))
    await world.worker.drain()
    assert (await orders.order_view(world.deps, order_id))["status"] == "cancelled_unpaid"
    async with await client_of(world) as client:
        refused = await client.post("/notify/alipay", content=b"not=signed")
        assert refused.text == "fail"
        text = (await client.get("/metrics")).text
    assert 'dueflow_timers_fired_total{kind="cancel_unpaid",result="ran"} 1.0' in text
    assert 'dueflow_timers_fired_total{kind="pay_reminder",result="ran"} 1.0' in text
    # The cancel was taken 2 s after its deadline, the reminder 25 min 2 s after its own.
    assert 'dueflow_timer_lateness_seconds_bucket{kind="cancel_unpaid",le="1.0"} 0.0' in text
    assert 'dueflow_timer_lateness_seconds_bucket{kind="cancel_unpaid",le="2.0"} 1.0' in text
    assert 'dueflow_timer_lateness_seconds_bucket{kind="pay_reminder",le="900.0"} 0.0' in text
    assert 'dueflow_timer_lateness_seconds_bucket{kind="pay_reminder",le="+Inf"} 1.0' in text
    assert 'dueflow_notifications_total{outcome="rejected",provider="alipay"} 1.0' in text
    assert 'dueflow_orders{status="cancelled_unpaid"} 1.0' in text
    assert "dueflow_timers_overdue 0.0" in text
    assert "dueflow_http_request_duration_seconds_count" in text

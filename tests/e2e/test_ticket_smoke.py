"""The seed's smoke, end to end over HTTP: a ``dueflow serve`` whose ``ticket`` orders pay within
10 s; a show, an order for two seats, no payment; polled in real time (the real trigger path):
the order is cancelled, its seats are free in the seat map and no hold row is left. Once with
the ``db`` trigger and once with RabbitMQ."""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from tests.conftest import eventually_sync, require_service
from tests.e2e.live import Served, serve

AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
TEN_SECONDS = {"DUEFLOW_ORDER_TYPES": json.dumps({"ticket": {"pay": "10s"}})}


@pytest.fixture(params=["db", pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)])
def server(request, tmp_path: Path) -> Iterator[Served]:
    """The server on the trigger the parameter names (a RabbitMQ prefix of its own, deleted
    after)."""
    env = dict(TEN_SECONDS)
    prefix = f"smoke-{os.getpid()}"
    if request.param == "rabbitmq":
        require_service("rabbitmq", "127.0.0.1", 5672)
        env["DUEFLOW_TRIGGER_URL"] = f"{AMQP_URL}?prefix={prefix}"
    else:
        env["DUEFLOW_TRIGGER_URL"] = "db"
    with serve(tmp_path, env) as served:
        yield served
        assert served.stop() == 0
    if request.param == "rabbitmq":
        delete_queues(prefix)


def delete_queues(prefix: str) -> None:
    import asyncio

    import aio_pika

    from dueflow.timers.rabbitmq import RabbitTrigger

    async def go() -> None:
        connection = await aio_pika.connect(AMQP_URL)
        try:
            channel = await connection.channel()
            for name in RabbitTrigger(prefix=prefix).queue_names:
                await channel.queue_delete(name)
        finally:
            await connection.close()

    asyncio.run(go())


def client(served: Served, name: str) -> httpx.Client:
    return httpx.Client(
        base_url=served.base, headers={"Authorization": f"Bearer {served.tokens[name]}"}, timeout=10
    )


def rows(db: Path, sql: str) -> list[tuple]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def test_an_unpaid_ticket_order_is_cancelled_and_its_seats_come_back(server):
    now = datetime.now(UTC)
    with client(server, "alice") as alice, client(server, "bob") as bob:
        show = alice.post(
            "/api/shows",
            json={
                "title": "Nutcracker",
                "venue": "Hall",
                "starts_at": (now + timedelta(days=1)).isoformat(),
                "sales_close_at": (now + timedelta(hours=23)).isoformat(),
                "seats": [{"label": f"A-{n}", "price": "380"} for n in range(1, 5)],
            },
        )
        assert show.status_code == 201, show.text
        show_id = show.json()["id"]
        placed = bob.post("/api/orders", json={"show_id": show_id, "seats": ["A-1", "A-2"]})
        assert placed.status_code == 201, placed.text
        order = placed.json()
        assert (order["order_type"], order["status"], order["amount"]) == (
            "ticket",
            "pending_payment",
            "760.00",
        )
        due = datetime.fromisoformat(order["pay_deadline"]) - datetime.fromisoformat(
            order["created_at"]
        )
        assert due == timedelta(seconds=10)
        seats = bob.get(f"/api/shows/{show_id}/seats").json()["seats"]
        assert [s["state"] for s in seats] == ["held", "held", "free", "free"]

        def cancelled() -> bool:
            return bool(bob.get(f"/api/orders/{order['id']}").json()["status"] != "pending_payment")

        assert eventually_sync(cancelled, 30, 0.25), server.output()[-3000:]
        final = bob.get(f"/api/orders/{order['id']}").json()
        assert final["status"] == "cancelled_unpaid"
        assert [e["event"] for e in final["timeline"]][-2:] == ["pay_timeout", "released"]
        assert [(line["kind"], line["label"]) for line in final["lines"]] == [
            ("seat", "A-1"),
            ("seat", "A-2"),
        ]
        seats = bob.get(f"/api/shows/{show_id}/seats").json()["seats"]
        assert [s["state"] for s in seats] == ["free"] * 4
        counts = bob.get(f"/api/shows/{show_id}").json()["seats"]
        assert counts == {"free": 4, "held": 0, "sold": 0}
    assert rows(server.db, "SELECT count(*) FROM seat_holds") == [(0,)]
    assert rows(server.db, "SELECT seats FROM show_buyers") in ([], [(0,)])
    assert rows(server.db, "SELECT count(*) FROM order_lines") == [(2,)]
    assert rows(server.db, "SELECT kind, state FROM timers WHERE kind = 'cancel_unpaid'") == [
        ("cancel_unpaid", "done")
    ]

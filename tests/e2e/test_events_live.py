"""`dueflow serve` runs the event loops: events written over HTTP are numbered (the feed shows
them) and POSTed, signed and in order, to a receiver started by the test."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.conftest import eventually
from tests.e2e.live import serve
from tests.unit.test_event_webhooks import SECRET, Receiver, unused_port


async def test_serve_numbers_the_events_and_delivers_them_to_the_webhook(tmp_path: Path):
    receiver = Receiver(unused_port())
    receiver.start()
    env = {
        "DUEFLOW_EVENTS_WEBHOOK_URL": receiver.url,
        "DUEFLOW_EVENTS_WEBHOOK_SECRET": SECRET,
    }
    try:
        with serve(tmp_path, env) as served:
            async with httpx.AsyncClient(base_url=served.base, timeout=10) as http:
                alice = {"Authorization": f"Bearer {served.tokens['alice']}"}
                bob = {"Authorization": f"Bearer {served.tokens['bob']}"}
                kite = await http.post(
                    "/api/goods", json={"title": "kite", "price": "19.90"}, headers=alice
                )
                order = await http.post(
                    "/api/orders", json={"goods_id": kite.json()["id"]}, headers=bob
                )
                order_id = order.json()["id"]
                cancelled = await http.post(f"/api/orders/{order_id}/cancel", headers=bob)
                assert cancelled.status_code == 200, cancelled.text

                async def fed() -> list[dict]:
                    answer = await http.get("/api/events", headers=bob)
                    return [e for e in answer.json()["events"] if e["order"]["id"] == order_id]

                assert await eventually(lambda: _has(fed, 3), 10, 0.1)
                assert [e["type"] for e in await fed()] == ["place", "buyer_cancel", "released"]
                assert await eventually(lambda: len(receiver.got) == 3, 10, 0.1)
                assert receiver.verified() == await fed()
            assert served.stop() == 0
    finally:
        receiver.stop()


async def _has(fed, count: int) -> bool:
    return len(await fed()) == count

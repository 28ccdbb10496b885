"""The order life over HTTP only, against `dueflow serve` in a subprocess with short deadlines:
an unpaid order is cancelled and its goods go back on sale; a paid one waits for shipment, is
shipped, received and reviewed by the timers; a refund approved by an admin succeeds."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.conftest import eventually
from tests.e2e.live import Served, serve

SHORT = {
    "DUEFLOW_REMINDER_AFTER": "1s",
    "DUEFLOW_PAY_TIMEOUT": "6s",
    "DUEFLOW_SHIP_TIMEOUT": "20s",
    "DUEFLOW_RECEIVE_TIMEOUT": "2s",
    "DUEFLOW_REVIEW_TIMEOUT": "2s",
    "DUEFLOW_SCAN_INTERVAL": "1s",
    "DUEFLOW_SCAN_GRACE": "1s",
}


@pytest.fixture
def server(tmp_path: Path):
    with serve(tmp_path, SHORT) as served:
        yield served
        assert served.stop() == 0


@pytest.fixture
async def people(server):
    """alice sells, bob buys, admin operates."""
    clients = [Client(server, name) for name in ("alice", "bob", "admin")]
    yield clients
    for client in clients:
        await client.http.aclose()


class Client:
    """One person's view of the API."""

    def __init__(self, served: Served, name: str) -> None:
        self.http = httpx.AsyncClient(
            base_url=served.base,
            headers={"Authorization": f"Bearer {served.tokens[name]}"},
            timeout=10,
        )

    async def call(self, method: str, path: str, expect: int = 200, **kwargs) -> dict:
        answer = await self.http.request(method, path, **kwargs)
        assert answer.status_code == expect, answer.text
        return answer.json()

    async def status_becomes(self, order_id: int, status: str, seconds: float = 20) -> dict:
        async def reached() -> bool:
            return (await self.call("GET", f"/api/orders/{order_id}"))["status"] == status

        assert await eventually(reached, seconds, 0.1), status
        return await self.call("GET", f"/api/orders/{order_id}")


async def pay(served: Served, buyer: Client, order_id: int, provider: str) -> str:
    started = await buyer.call(
        "POST", f"/api/orders/{order_id}/payments", 201, json={"provider": provider}
    )
    async with httpx.AsyncClient(base_url=f"{served.base}/sim", timeout=10) as sim:
        trade = {"provider": provider, "out_trade_no": started["pay_no"]}
        assert (await sim.post("/control/scan", json=trade)).status_code == 200
        assert (await sim.post("/control/pay", json=trade)).status_code == 200
    return str(started["pay_no"])


async def test_the_order_life_over_http(server, people):
    alice, bob, _ = people
    kite = await alice.call("POST", "/api/goods", 201, json={"title": "kite", "price": "19.90"})
    lamp = await alice.call("POST", "/api/goods", 201, json={"title": "lamp", "price": "35.00"})

    unpaid = await bob.call("POST", "/api/orders", 201, json={"goods_id": kite["id"]})
    paid = await bob.call("POST", "/api/orders", 201, json={"goods_id": lamp["id"]})
    await pay(server, bob, paid["id"], "wechatpay")
    await bob.status_becomes(paid["id"], "pending_shipment")

    cancelled = await bob.status_becomes(unpaid["id"], "cancelled_unpaid")
    assert [e["event"] for e in cancelled["timeline"]][-2:] == ["pay_timeout", "released"]
    goods = await alice.call("GET", f"/api/goods/{kite['id']}")
    assert (goods["status"], goods["reserved_order_id"]) == ("on_sale", None)
    again = await alice.call("GET", f"/api/goods/{lamp['id']}")
    assert again["reserved_order_id"] == paid["id"]

    await alice.call(
        "POST",
        f"/api/orders/{paid['id']}/ship",
        json={"carrier": "SF", "tracking_no": "SF0001"},
    )
    received = await bob.status_becomes(paid["id"], "received")
    assert any(e["actor"] == "timer" for e in received["timeline"] if e["to_status"] == "received")
    done = await bob.status_becomes(paid["id"], "completed")
    assert sorted((r["role"], r["is_default"]) for r in done["reviews"]) == [
        ("buyer", True),
        ("seller", True),
    ]
    assert (await alice.call("GET", f"/api/goods/{lamp['id']}"))["status"] == "sold"


async def test_a_refund_approved_by_an_admin_succeeds_over_http(server, people):
    alice, bob, admin = people
    vase = await alice.call("POST", "/api/goods", 201, json={"title": "vase", "price": "88.00"})
    order = await bob.call("POST", "/api/orders", 201, json={"goods_id": vase["id"]})
    await pay(server, bob, order["id"], "alipay")
    await bob.status_becomes(order["id"], "pending_shipment")
    cancelled = await alice.call("POST", f"/api/orders/{order['id']}/cancel")
    assert cancelled["status"] == "cancelled_unshipped"
    assert cancelled["timeline"][-1]["actor"] == f"user:{vase['seller_id']}"
    [refund] = await admin.call("GET", "/api/admin/refunds?state=pending_review")
    assert (refund["order_id"], refund["amount"]) == (order["id"], "88.00")
    await bob.call("POST", f"/api/admin/refunds/{refund['id']}/approve", 403)
    await admin.call("POST", f"/api/admin/refunds/{refund['id']}/approve")

    async def succeeded() -> bool:
        found = await admin.call("GET", "/api/admin/refunds?state=succeeded")
        return [r["id"] for r in found] == [refund["id"]]

    assert await eventually(succeeded, 30, 0.2)
    summary = await admin.call("GET", "/api/admin/summary")
    assert summary["invariants"]["ok"] is True
    assert summary["discrepancies"] == 0

"""`dueflow serve` in a subprocess on the dev profile: health, the mounted simulator, a payment
notified over real HTTP, and a graceful stop."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest

from dueflow import bootstrap
from dueflow.config import load_settings
from dueflow.service import accounts, orders, payments
from tests.conftest import eventually
from tests.e2e.live import serve


@pytest.fixture
def server(tmp_path: Path):
    with serve(tmp_path, dev_users=False) as served:
        yield served.base, served.db, served.proc


async def test_a_payment_through_the_mounted_simulator_is_notified_over_http(server):
    base, db, proc = server
    async with httpx.AsyncClient(timeout=5) as client:
        keys = (await client.get(f"{base}/sim/control/keys")).json()
    settings = load_settings(database_url=f"sqlite:///{db}", profile="dev", public_url=base, **keys)
    async with bootstrap.running(settings) as deps:
        seller, _ = await accounts.add_user(deps, "seller")
        buyer, _ = await accounts.add_user(deps, "buyer")
        goods_id = await accounts.add_goods(deps, seller_id=seller.id, title="kite", price="19.90")
        order_id = await orders.place_order(deps, buyer_id=buyer.id, goods_id=goods_id)
        pay_no, url = await payments.start_payment(
            deps, order_id=order_id, user_id=buyer.id, provider="alipay"
        )
        assert url.startswith(f"{base}/sim/pay/alipay/")
        async with httpx.AsyncClient(base_url=f"{base}/sim", timeout=5) as sim:
            trade = {"provider": "alipay", "out_trade_no": pay_no}
            assert (await sim.post("/control/scan", json=trade)).status_code == 200
            assert (await sim.post("/control/pay", json=trade)).status_code == 200

        async def notified() -> bool:  # the server's simulator notifies it over HTTP
            return (await orders.order_view(deps, order_id))["status"] != "pending_payment"

        await eventually(notified, 20, 0.1)
        assert (await orders.order_view(deps, order_id))["status"] == "pending_shipment"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0

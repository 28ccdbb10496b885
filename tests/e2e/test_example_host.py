"""The example host (examples/host/) end to end: a real ``dueflow serve`` and the example as a
real server of its own. One of the host's users places an order through the host (a service
key acting for them; the same checkout sent twice is one order), pays on the simulator's pay
page, and the host shows the order paid from the events dueflow POSTed to it alone; a forged
event is refused and changes nothing it shows."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from tests.conftest import eventually, eventually_sync
from tests.e2e.live import answers, free_port, serve

HOST = Path(__file__).parents[2] / "examples" / "host"
BUY_FORM = re.compile(
    r'name="sku_id" value="(\d+)"><input type="hidden" name="checkout" value="([^"]+)"'
)


@contextlib.contextmanager
def host_app(tmp_path: Path, port: int, env: dict[str, str]) -> Iterator[str]:
    """``python app.py`` in examples/host with ``env``; its URL once its home page answers."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DUEFLOW_", "HOST_"))}
    clean.update(env, HOST_DB=str(tmp_path / "host.db"), HOST_PORT=str(port))
    log_path = tmp_path / "host.log"
    base = f"http://127.0.0.1:{port}"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "app.py"], cwd=HOST, env=clean, stdout=log, stderr=log
        )
        try:
            if not _eventually_up(f"{base}/", proc):
                pytest.fail(f"the example host did not start:\n{log_path.read_text()}")
            yield base
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def _eventually_up(url: str, proc: subprocess.Popen[bytes]) -> bool:
    """The server at ``url`` answers, unless its process ended first."""
    eventually_sync(lambda: proc.poll() is not None or answers(url), 30, 0.1)
    return proc.poll() is None and answers(url)


async def test_the_example_host_shows_an_order_paid_from_its_verified_events(tmp_path: Path):
    host_port = free_port()
    with serve(tmp_path, {"DUEFLOW_WEBHOOK_ALLOW_PRIVATE": "true"}) as served:
        key_id, key, secret = await _set_up(served.base, served.tokens["admin"], host_port)
        env = {"HOST_DUEFLOW_URL": served.base, "HOST_DUEFLOW_KEY": key}
        with host_app(tmp_path, host_port, {**env, "HOST_WEBHOOK_SECRET": secret}) as base:
            async with (
                httpx.AsyncClient(base_url=base, cookies={"user": "ada"}, timeout=10) as ada,
                httpx.AsyncClient(base_url=base, cookies={"user": "ben"}, timeout=10) as ben,
            ):
                order_id = await _place_twice(ada)
                await _pay(ada, order_id)

                async def paid() -> bool:
                    order = (await ada.get(f"/api/orders/{order_id}")).json()["order"]
                    return order is not None and order["status"] == "pending_shipment"

                assert await eventually(paid, 30, 0.1)
                view = (await ada.get(f"/api/orders/{order_id}")).json()
                _check_paid(view, key_id)
                assert (await ben.get(f"/api/orders/{order_id}")).status_code == 404

                forged = await _forge(ada, view)
                assert forged.status_code == 400, forged.text
                unsigned = await ada.post("/webhooks/dueflow", content=b"{}")
                assert unsigned.status_code == 400
                assert (await ada.get(f"/api/orders/{order_id}")).json() == view
        assert served.stop() == 0


async def _set_up(dueflow_url: str, admin_token: str, host_port: int) -> tuple[int, str, str]:
    """The admin makes the host's service key and an admin key, which registers the host's
    webhook endpoint: (the host key's id, its secret, the endpoint's whsec_ secret)."""
    admin = {"Authorization": f"Bearer {admin_token}"}
    async with httpx.AsyncClient(base_url=dueflow_url, timeout=10) as http:
        host = await http.post(
            "/api/admin/keys",
            json={"name": "host", "scopes": ["orders", "catalog", "payments"]},
            headers=admin,
        )
        assert host.status_code == 201, host.text
        setup = await http.post(
            "/api/admin/keys", json={"name": "host setup", "scopes": ["admin"]}, headers=admin
        )
        endpoint = await http.post(
            "/api/admin/webhooks",
            json={"url": f"http://127.0.0.1:{host_port}/webhooks/dueflow"},
            headers={"Authorization": f"Bearer {setup.json()['secret']}"},
        )
        assert endpoint.status_code == 201, endpoint.text
    return host.json()["id"], host.json()["secret"], endpoint.json()["secret"]


async def _place_twice(ada: httpx.AsyncClient) -> int:
    """Buy two of the first product; the same form sent again is the same order."""
    home = await ada.get("/")
    sku_id, checkout = BUY_FORM.findall(home.text)[0]
    form = {"sku_id": sku_id, "quantity": "2", "checkout": checkout}
    first = await ada.post("/orders", data=form)
    again = await ada.post("/orders", data=form)
    assert first.status_code == again.status_code == 303, first.text
    assert first.headers["location"] == again.headers["location"]
    return int(first.headers["location"].rsplit("/", 1)[1])


async def _pay(ada: httpx.AsyncClient, order_id: int) -> None:
    """The host sends the buyer to the pay page; the buyer opens it and presses Pay."""
    started = await ada.post(f"/orders/{order_id}/pay")
    assert started.status_code == 303, started.text
    async with httpx.AsyncClient(timeout=10) as browser:
        assert (await browser.get(started.headers["location"])).status_code == 200
        paid = await browser.post(started.headers["location"])
        assert paid.status_code == 200 and "<h1>Paid</h1>" in paid.text, paid.text


def _check_paid(view: dict, key_id: int) -> None:
    events = view["events"]
    assert [e["type"] for e in events] == ["place", "payment_started", "pay"]
    assert events[0]["actor"]["type"] == "user" and events[0]["actor"]["key_id"] == key_id
    order = view["order"]
    assert order == events[-1]["order"]
    assert (order["flow"], order["amount"]) == ("shop", "25.00")
    assert [(line["label"], line["quantity"], line["price"]) for line in order["lines"]] == [
        ("green tea", 2, "12.50")
    ]
    assert [(p["provider"], p["amount"], p["state"]) for p in order["payments"]] == [
        ("wechatpay", "25.00", "paid")
    ]


async def _forge(ada: httpx.AsyncClient, view: dict) -> httpx.Response:
    """The order's last event, claimed completed under a new id, signed with another secret."""
    last = view["events"][-1]
    fake = {**last, "id": "evt_999", "order": {**last["order"], "status": "completed"}}
    body = json.dumps(fake).encode()
    wrong = Webhook("whsec_" + base64.b64encode(b"not the endpoint's secret").decode())
    now = datetime.now(UTC)
    headers = {
        "webhook-id": fake["id"],
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": wrong.sign(fake["id"], now, body),
        "content-type": "application/json",
    }
    return await ada.post("/webhooks/dueflow", content=body, headers=headers)

"""The admin pages in a real headless browser: Playwright driving Debian's chromium
(/usr/bin/chromium, installed by .ci/run; never a downloaded browser) against `dueflow serve`.

An operator logs in, watches an overdue order become cancelled without reloading, and approves
a refund. Screenshots go to $DUEFLOW_SCREENSHOTS (docs/ holds the committed ones) or tmp_path.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from tests.conftest import eventually_sync, in_ci
from tests.e2e.live import Served, serve

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [  # this machine's network is closed: no background calls home
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SHORT = {
    "DUEFLOW_REMINDER_AFTER": "2s",
    "DUEFLOW_PAY_TIMEOUT": "8s",
    "DUEFLOW_SCAN_INTERVAL": "1s",
    "DUEFLOW_SCAN_GRACE": "1s",
}

try:
    from playwright import sync_api as playwright_api
except ImportError:  # pragma: no cover - a dev install has it (pyproject's dev extra)
    playwright_api = None


@pytest.fixture
def chromium_path() -> Path:
    missing = []
    if playwright_api is None:
        missing.append("playwright (pip install -e '.[dev]')")
    if not CHROMIUM.exists():
        missing.append("Debian's chromium (apt-get install chromium)")
    if missing:
        message = "not installed: " + ", ".join(missing)
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    return CHROMIUM


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    target = Path(os.environ.get("DUEFLOW_SCREENSHOTS", tmp_path / "shots"))
    target.mkdir(parents=True, exist_ok=True)
    return target


def api(served: Served, name: str) -> httpx.Client:
    return httpx.Client(
        base_url=served.base,
        headers={"Authorization": f"Bearer {served.tokens[name]}"},
        timeout=10,
    )


def paid_then_cancelled_by_seller(served: Served, alice: httpx.Client, bob: httpx.Client) -> int:
    """An order paid through the simulated Alipay, then cancelled by its seller: a refund
    waits for review. Returns the order id."""
    goods = alice.post("/api/goods", json={"title": "vase", "price": "88.00"}).json()
    order = bob.post("/api/orders", json={"goods_id": goods["id"]}).json()
    pay_no = bob.post(f"/api/orders/{order['id']}/payments", json={"provider": "alipay"}).json()
    trade = {"provider": "alipay", "out_trade_no": pay_no["pay_no"]}
    with httpx.Client(base_url=f"{served.base}/sim", timeout=10) as sim:
        assert sim.post("/control/scan", json=trade).status_code == 200
        assert sim.post("/control/pay", json=trade).status_code == 200
    assert eventually_sync(
        lambda: bob.get(f"/api/orders/{order['id']}").json()["status"] == "pending_shipment",
        20,
        0.1,
    )
    assert alice.post(f"/api/orders/{order['id']}/cancel").status_code == 200
    return int(order["id"])


def test_an_operator_watches_an_order_expire_and_approves_a_refund(
    tmp_path: Path, chromium_path: Path, shots: Path
) -> None:
    with (
        serve(tmp_path, SHORT) as served,
        api(served, "alice") as alice,
        api(served, "bob") as bob,
        playwright_api.sync_playwright() as pw,
    ):
        refund_order = paid_then_cancelled_by_seller(served, alice, bob)
        lamp = alice.post("/api/goods", json={"title": "lamp", "price": "35.00"}).json()
        unpaid = bob.post("/api/orders", json={"goods_id": lamp["id"]}).json()

        browser = pw.chromium.launch(executable_path=str(chromium_path), args=FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        expect = playwright_api.expect

        # Log in: a wrong token is refused, the admin's opens the dashboard.
        page.goto(f"{served.base}/admin/orders/{unpaid['id']}")
        assert "/admin/login" in page.url
        page.fill("input[name=token]", "not-a-token")
        page.click("button[type=submit]")
        expect(page.locator("[role=alert]")).to_contain_text("not an admin token")
        page.fill("input[name=token]", served.tokens["admin"])
        page.click("button[type=submit]")

        # Back on the order page it asked for; it refreshes itself until the deadline passes.
        expect(page.locator("h1")).to_contain_text(f"Order #{unpaid['id']}")
        expect(page.locator("#order-status")).to_have_text("pending_payment")
        page.screenshot(path=str(shots / "admin-order-pending.png"), full_page=True)
        expect(page.locator("#order-status")).to_have_text("cancelled_unpaid", timeout=30_000)
        expect(page.locator("#timeline")).to_contain_text("pay_timeout")
        page.screenshot(path=str(shots / "admin-order.png"), full_page=True)
        goods = alice.get(f"/api/goods/{lamp['id']}").json()
        assert (goods["status"], goods["reserved_order_id"]) == ("on_sale", None)

        # The dashboard counts it; the refund queue shows the seller's cancel.
        page.click("text=Dashboard")
        expect(page.locator("#orders-by-status")).to_contain_text("cancelled_unpaid")
        expect(page.locator("#invariants")).to_contain_text("hold")
        page.screenshot(path=str(shots / "admin-dashboard.png"), full_page=True)

        page.click("text=Refunds")
        row = page.locator("tr", has=page.locator(f"a[href='/admin/orders/{refund_order}']"))
        expect(row).to_contain_text("pending_review")
        page.screenshot(path=str(shots / "admin-refunds.png"), full_page=True)
        row.locator("button", has_text="Approve").click()
        expect(page.locator(".flash")).to_contain_text("approved")

        page.click("text=all")
        expect(row).to_contain_text("succeeded", timeout=30_000)
        refund = bob.get(f"/api/orders/{refund_order}").json()["refunds"][0]
        assert refund["state"] == "succeeded"

        # The same dashboard on a phone.
        phone = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True)
        phone.context.add_cookies(page.context.cookies())
        phone.goto(f"{served.base}/admin")
        expect(phone.locator("#orders-by-status")).to_be_visible()
        width = phone.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"the phone page scrolls sideways ({width}px)"
        phone.screenshot(path=str(shots / "admin-phone.png"), full_page=True)
        browser.close()
        assert served.stop() == 0

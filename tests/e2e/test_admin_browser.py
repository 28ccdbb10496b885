"""The admin pages in a real headless browser: Playwright driving Debian's chromium
(/usr/bin/chromium, installed by .ci/run; never a downloaded browser) against `dueflow serve`.

An operator logs in, watches an overdue order become cancelled without reloading, and approves
a refund; on a show's page the seat grid is drawn and a taken seat opens its order. Screenshots go to $DUEFLOW_SCREENSHOTS (docs/ holds the committed ones) or tmp_path.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from tests.conftest import eventually_sync, in_ci
from tests.e2e.live import Served, serve

pytestmark = pytest.mark.serial

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
    "DUEFLOW_PAY_TIMEOUT": "15s",  # long enough to log in before it; the page waits 30 s
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


def pay_through_alipay(served: Served, buyer: httpx.Client, order_id: int, paid: str) -> None:
    """The buyer pays the order through the simulated Alipay; waits for its status ``paid``."""
    pay_no = buyer.post(f"/api/orders/{order_id}/payments", json={"provider": "alipay"}).json()
    trade = {"provider": "alipay", "out_trade_no": pay_no["pay_no"]}
    with httpx.Client(base_url=f"{served.base}/sim", timeout=10) as sim:
        assert sim.post("/control/scan", json=trade).status_code == 200
        assert sim.post("/control/pay", json=trade).status_code == 200
    assert eventually_sync(
        lambda: buyer.get(f"/api/orders/{order_id}").json()["status"] == paid, 20, 0.1
    )


#: What an operator acts with on a refund in review: every one must be on screen.
REFUND_ACTIONS = ("Approve", "Reject", "Settled off-line")


def outside_the_view(page: playwright_api.Page, row: playwright_api.Locator) -> list[str]:
    """The row's buttons and fields that do not lie wholly inside the viewport and inside the
    box their table scrolls in (seen only by scrolling sideways), with their boxes; and the
    refund actions missing from the row."""
    boxes = row.locator("button, input:not([type=hidden])").evaluate_all(
        """elements => elements.map(el => {
            const box = el.getBoundingClientRect();
            const scroller = el.closest('.scroll');
            const clip = scroller ? scroller.getBoundingClientRect() : {left: 0, right: innerWidth};
            return {
                name: el.textContent.trim() || el.getAttribute('aria-label'),
                left: box.left, right: box.right, top: box.top, bottom: box.bottom,
                from: Math.max(0, clip.left), to: Math.min(innerWidth, clip.right),
            };
        })"""
    )
    names = {box["name"] for box in boxes}
    missing = [f"{name}: not in the row" for name in REFUND_ACTIONS if name not in names]
    return missing + [
        f"{b['name']}: x {b['left']:.0f}-{b['right']:.0f}, visible {b['from']:.0f}-{b['to']:.0f}"
        for b in boxes
        if b["left"] < b["from"] - 0.5 or b["right"] > b["to"] + 0.5 or b["bottom"] <= b["top"]
    ]


def paid_then_cancelled_by_seller(served: Served, alice: httpx.Client, bob: httpx.Client) -> int:
    """An order paid through the simulated Alipay, then cancelled by its seller: a refund
    waits for review. Returns the order id."""
    goods = alice.post("/api/goods", json={"title": "vase", "price": "88.00"}).json()
    order = bob.post("/api/orders", json={"goods_id": goods["id"]}).json()
    pay_through_alipay(served, bob, order["id"], "pending_shipment")
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
        # The browser first: its cold start on a fresh machine took longer than the order's
        # pay deadline (a CI run found the order cancelled before the page first showed it).
        browser = pw.chromium.launch(executable_path=str(chromium_path), args=FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        expect = playwright_api.expect
        lamp = alice.post("/api/goods", json={"title": "lamp", "price": "35.00"}).json()
        unpaid = bob.post("/api/orders", json={"goods_id": lamp["id"]}).json()

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
        # Every action on the refund is on screen, at a desk's width and on a phone.
        assert outside_the_view(page, row) == []
        page.screenshot(path=str(shots / "admin-refunds.png"), full_page=True)
        phone = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True)
        phone.context.add_cookies(page.context.cookies())
        phone.goto(f"{served.base}/admin/refunds")
        phone_row = phone.locator(
            "tr", has=phone.locator(f"a[href='/admin/orders/{refund_order}']")
        )
        expect(phone_row).to_contain_text("pending_review")
        assert outside_the_view(phone, phone_row) == []
        width = phone.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"the phone page scrolls sideways ({width}px)"
        phone.screenshot(path=str(shots / "admin-refunds-phone.png"), full_page=True)
        phone.close()
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


def log_in(page: playwright_api.Page, served: Served, path: str) -> None:
    """Open an admin page through the login form with the admin's token."""
    page.goto(f"{served.base}{path}")
    page.fill("input[name=token]", served.tokens["admin"])
    page.click("button[type=submit]")


def test_an_operator_reads_a_shows_seat_map_and_opens_a_seats_order(
    tmp_path: Path, chromium_path: Path, shots: Path
) -> None:
    with (
        serve(tmp_path) as served,
        api(served, "alice") as alice,
        api(served, "bob") as bob,
        playwright_api.sync_playwright() as pw,
    ):
        # alice's show of 2 x 8 seats: bob holds A-1 and A-2 (unpaid) and bought B-3.
        show = alice.post(
            "/api/shows",
            json={
                "title": "Winter <concert>",
                "venue": "Hall 1",
                "starts_at": "2099-12-24T19:30:00+08:00",
                "sales_close_at": "2099-12-24T18:00:00+08:00",
                "seats": [
                    {"label": f"{section}-{n}", "price": price}
                    for section, price in (("A", "380.00"), ("B", "180.00"))
                    for n in range(1, 9)
                ],
            },
        ).json()
        held = bob.post("/api/orders", json={"show_id": show["id"], "seats": ["A-1", "A-2"]})
        assert held.status_code == 201, held.text
        bought = bob.post("/api/orders", json={"show_id": show["id"], "seats": ["B-3"]}).json()
        pay_through_alipay(served, bob, bought["id"], "paid")
        [ticket] = bob.get(f"/api/orders/{bought['id']}").json()["tickets"]

        browser = pw.chromium.launch(executable_path=str(chromium_path), args=FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        expect = playwright_api.expect
        log_in(page, served, "/admin/shows")

        # The list counts the show's seats; its title (markup and all) opens its page.
        row = page.locator("#shows tr", has_text="Winter <concert>")
        expect(row).to_contain_text("13")
        page.screenshot(path=str(shots / "admin-shows.png"), full_page=True)
        row.get_by_role("link", name="Winter <concert>").click()
        expect(page.locator("#show-title")).to_have_text("Winter <concert>")
        grid = page.locator("#seat-map .seat-row")
        expect(grid.locator(".seat")).to_have_count(16)
        expect(grid.locator(".seat.held")).to_have_count(2)
        expect(grid.locator(".seat.sold")).to_have_count(1)
        expect(grid.locator(".seat.free")).to_have_count(13)
        expect(grid.locator("a.seat")).to_have_count(3)  # only taken seats link to an order
        expect(page.locator("#seat-counts")).to_contain_text("2 held")
        expect(page.locator("#show-orders")).to_contain_text("A-1, A-2")
        colours = {
            state: grid.locator(f".seat.{state}").first.evaluate(
                "seat => getComputedStyle(seat).backgroundColor"
            )
            for state in ("free", "held", "sold")
        }
        assert len(set(colours.values())) == 3, colours  # each state its own colour
        page.screenshot(path=str(shots / "admin-show.png"), full_page=True)

        # A held seat opens the order holding it; a sold one shows the ticket's code.
        grid.locator("[data-seat='A-2']").click()
        expect(page.locator("h1")).to_contain_text(f"Order #{held.json()['id']}")
        expect(page.locator("#order-status")).to_have_text("pending_payment")
        expect(page.locator("#order-lines")).to_contain_text("A-1")
        page.go_back()
        grid.locator("[data-seat='B-3']").click()
        expect(page.locator("h1")).to_contain_text(f"Order #{bought['id']}")
        expect(page.locator("#order-tickets")).to_contain_text(ticket["code"])
        page.screenshot(path=str(shots / "admin-ticket-order.png"), full_page=True)

        # The dashboard counts held and sold seats; its nav leads to the shows.
        page.click("text=Dashboard")
        expect(page.locator("#seats-held")).to_contain_text("2")
        expect(page.locator("#seats-sold")).to_contain_text("1")
        page.click("header >> text=Shows")
        expect(page.locator("#shows")).to_contain_text("Winter <concert>")

        # The show's page on a phone: the grid wraps, nothing scrolls sideways.
        phone = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True)
        phone.context.add_cookies(page.context.cookies())
        phone.goto(f"{served.base}/admin/shows/{show['id']}")
        expect(phone.locator("#seat-map")).to_be_visible()
        width = phone.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"the phone page scrolls sideways ({width}px)"
        browser.close()
        assert served.stop() == 0


def controls_outside(page: playwright_api.Page, where: str) -> list[str]:
    """The fields, buttons and links under ``where`` that are not wholly inside the viewport's
    width (seen only by scrolling sideways) or have no size, with their boxes."""
    boxes = (
        page.locator(where)
        .locator("input, select, button, a")
        .evaluate_all(
            """elements => elements.map(el => {
            const box = el.getBoundingClientRect();
            return {
                name: el.getAttribute('name') || el.textContent.trim(),
                left: box.left, right: box.right, width: box.width, height: box.height,
            };
        })"""
        )
    )
    assert boxes, f"no controls under {where}"
    width = page.evaluate("innerWidth")
    return [
        f"{b['name']}: x {b['left']:.0f}-{b['right']:.0f} of {width}"
        for b in boxes
        if b["left"] < -0.5 or b["right"] > width + 0.5 or not (b["width"] and b["height"])
    ]


def test_an_operator_finds_orders_searches_them_and_exports_the_csv(
    tmp_path: Path, chromium_path: Path, shots: Path
) -> None:
    with (
        serve(tmp_path) as served,
        api(served, "alice") as alice,
        api(served, "bob") as bob,
        playwright_api.sync_playwright() as pw,
    ):
        # bob buys two of alice's goods and pays for the second through Alipay.
        placed = []
        for title in ("kettle", "teapot"):
            goods = alice.post("/api/goods", json={"title": title, "price": "20.00"}).json()
            placed.append(bob.post("/api/orders", json={"goods_id": goods["id"]}).json()["id"])
        unpaid, paid = placed
        pay_through_alipay(served, bob, paid, "pending_shipment")
        [payment] = bob.get(f"/api/orders/{paid}").json()["payments"]

        browser = pw.chromium.launch(executable_path=str(chromium_path), args=FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        expect = playwright_api.expect
        log_in(page, served, "/admin")

        # The nav opens every order, newest first, the people named and linked.
        page.click("header >> text=Orders")
        rows = page.locator("#orders tbody tr")
        expect(rows).to_have_count(2)
        expect(rows.first).to_contain_text(f"#{paid}")
        expect(rows.first.get_by_role("link", name="bob")).to_be_visible()
        expect(rows.first.get_by_role("link", name="alice")).to_be_visible()
        assert controls_outside(page, "#order-search") == []

        # Kept to one status by the form; the CSV link carries the same filter.
        page.select_option("#order-search select[name=status]", "pending_payment")
        page.click("#order-search button[type=submit]")
        expect(rows).to_have_count(1)
        expect(rows.first).to_contain_text(f"#{unpaid}")
        csv_link = page.locator("#orders-csv")
        assert csv_link.get_attribute("href") == "/admin/orders.csv?status=pending_payment"
        page.screenshot(path=str(shots / "admin-orders.png"), full_page=True)
        with page.expect_download() as download:
            csv_link.click()
        lines = Path(download.value.path()).read_text().splitlines()
        assert lines[0].startswith("order_id,status,flow")
        assert [line.split(",")[0] for line in lines[1:]] == [str(unpaid)]

        # The top bar's box finds an order by its payment number.
        page.fill("header input[name=q]", payment["pay_no"])
        page.press("header input[name=q]", "Enter")
        expect(rows).to_have_count(1)
        expect(rows.first).to_contain_text(f"#{paid}")
        expect(page.locator("#order-search input[name=q]")).to_have_value(payment["pay_no"])
        rows.first.get_by_role("link", name="bob").click()
        expect(page.locator("h1")).to_contain_text("bob")
        expect(page.locator("#bought")).to_contain_text("2 orders")

        # On a phone: the list and a search, every control on screen, nothing sideways.
        phone = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True)
        phone.context.add_cookies(page.context.cookies())
        for path in ("/admin/orders", f"/admin/orders?q={payment['pay_no']}"):
            phone.goto(f"{served.base}{path}")
            expect(phone.locator("#orders tbody tr").first).to_be_visible()
            assert controls_outside(phone, "main") == [], path
            width = phone.evaluate("document.documentElement.scrollWidth")
            assert width <= 390, f"{path} scrolls sideways on a phone ({width}px)"
        phone.screenshot(path=str(shots / "admin-orders-phone.png"), full_page=True)
        browser.close()
        assert served.stop() == 0


def gate_controls_outside(page: playwright_api.Page, width: int) -> list[str]:
    """The gate page's controls (fields, buttons, links) not wholly inside ``width`` or not
    drawn at all."""
    boxes = page.locator("main textarea, main input:not([type=hidden]), main button, main a")
    found = boxes.evaluate_all(
        """elements => elements.map(el => {
            const box = el.getBoundingClientRect();
            return {name: el.name || el.textContent.trim(), left: box.left, right: box.right,
                    height: box.height};
        })"""
    )
    return [
        f"{b['name']}: x {b['left']:.0f}-{b['right']:.0f}, height {b['height']:.0f}"
        for b in found
        if b["left"] < -0.5 or b["right"] > width + 0.5 or b["height"] <= 0
    ]


def test_an_organizer_checks_tickets_in_at_the_gate_on_a_phone_and_an_admin_on_a_laptop(
    tmp_path: Path, chromium_path: Path, shots: Path
) -> None:
    with (
        serve(tmp_path) as served,
        api(served, "alice") as alice,
        api(served, "bob") as bob,
        playwright_api.sync_playwright() as pw,
    ):
        show = alice.post(
            "/api/shows",
            json={
                "title": "Spring <gala>",
                "venue": "Hall 2",
                "starts_at": "2099-04-01T19:30:00+08:00",
                "sales_close_at": "2099-04-01T18:00:00+08:00",
                "seats": [{"label": f"B-{n}", "price": "180.00"} for n in range(1, 5)],
            },
        ).json()
        bought = bob.post("/api/orders", json={"show_id": show["id"], "seats": ["B-3", "B-4"]})
        assert bought.status_code == 201, bought.text
        pay_through_alipay(served, bob, bought.json()["id"], "paid")
        first, second = (
            t["code"] for t in bob.get(f"/api/orders/{bought.json()['id']}").json()["tickets"]
        )
        gate_path = f"/admin/shows/{show['id']}/gate"
        expect = playwright_api.expect
        browser = pw.chromium.launch(executable_path=str(chromium_path), args=FLAGS)

        # alice, the organizer (no admin), signs in at her show's gate on a phone.
        phone = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True)
        phone.goto(f"{served.base}{gate_path}")
        phone.fill("input[name=token]", served.tokens["alice"])
        phone.click("button[type=submit]")
        expect(phone.locator("#gate-title")).to_have_text("Spring <gala>")
        expect(phone.locator("#gate-counts")).to_contain_text("0 of 2 checked in")
        phone.fill("input[name=gate]", "East")
        # A barcode scanner types the code and presses Enter: that sends it.
        phone.focus("textarea[name=codes]")
        phone.keyboard.type(first)
        phone.keyboard.press("Enter")
        verdicts = phone.locator(".verdict strong")
        expect(verdicts).to_have_text(["Valid"])
        expect(phone.locator(".verdict.v-valid")).to_contain_text("seat B-3")
        background = "v => getComputedStyle(v).backgroundColor"
        valid_colour = phone.locator(".verdict.v-valid").evaluate(background)
        expect(phone.locator("textarea[name=codes]")).to_be_focused()  # ready for the next
        expect(phone.locator("textarea[name=codes]")).to_have_value("")
        # Shift+Enter starts a line; a paste of several lines stays; Enter sends them all.
        phone.keyboard.type("typo")
        phone.keyboard.press("Shift+Enter")
        expect(phone.locator("textarea[name=codes]")).to_have_value("typo\n")
        phone.fill("textarea[name=codes]", f"{first}\nnot-a-ticket")
        phone.focus("textarea[name=codes]")
        phone.keyboard.press("Enter")
        expect(verdicts).to_have_text(["Checked in already", "Unknown code"])
        expect(phone.locator(".verdict.v-checked_in")).to_contain_text("at gate East")
        expect(phone.locator("#gate-counts")).to_contain_text("1 of 2 checked in")
        expect(phone.locator("input[name=gate]")).to_have_value("East")
        assert gate_controls_outside(phone, 390) == []
        width = phone.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"the gate page scrolls sideways on a phone ({width}px)"
        colours = {
            kind: phone.locator(f".verdict.v-{kind}").evaluate(background)
            for kind in ("checked_in", "unknown")
        }
        assert len({valid_colour, *colours.values()}) == 3, (valid_colour, colours)
        phone.screenshot(path=str(shots / "admin-gate-phone.png"), full_page=True)
        # Her gate session opens no other admin page.
        phone.goto(f"{served.base}/admin/shows/{show['id']}")
        expect(phone.locator("input[name=token]")).to_be_visible()  # the admin log in

        # An operator opens the gate from the show's page on a laptop.
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        log_in(page, served, f"/admin/shows/{show['id']}")
        page.click("#show-door >> text=Gate")
        page.fill("textarea[name=codes]", second)
        page.click("text=Check in")
        expect(page.locator(".verdict strong")).to_have_text(["Valid"])
        expect(page.locator("#gate-counts")).to_contain_text("2 of 2 checked in")
        assert gate_controls_outside(page, 1280) == []
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 1280, f"the gate page scrolls sideways ({width}px)"
        page.screenshot(path=str(shots / "admin-gate.png"), full_page=True)
        with page.expect_download() as download:
            page.click("text=Tickets CSV")
        rows = Path(download.value.path()).read_text().splitlines()
        assert rows[0] == "seat,code,buyer,state,checked_in_at,gate"
        assert [r.split(",")[0] for r in rows[1:]] == ["B-3", "B-4"]
        browser.close()
        assert served.stop() == 0

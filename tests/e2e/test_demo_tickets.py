"""`dueflow demo --flow tickets`, in process (fast time) and over HTTP against a `dueflow serve`
subprocess whose ticket orders pay within a few seconds: buyers race for the same seats, the
show is cancelled, and the run ends with every invariant holding, exit 0."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx
import pytest

from tests.e2e.live import serve
from tests.e2e.test_demo_http import demo

TICKET_WINDOWS = {"DUEFLOW_ORDER_TYPES": '{"ticket": {"pay": "4s"}}', "DUEFLOW_SCAN_INTERVAL": "1s"}
DEAD = {"cancelled_unpaid", "cancelled_paid"}


def _tables_after(db: Path) -> dict[str, int]:
    with sqlite3.connect(db) as conn:
        return {
            "seat_holds": conn.execute("select count(*) from seat_holds").fetchone()[0],
            "buyers_counted": conn.execute(
                "select coalesce(sum(seats), 0) from show_buyers"
            ).fetchone()[0],
            "valid_tickets": conn.execute(
                "select count(*) from tickets where state = 'valid'"
            ).fetchone()[0],
            "paid_unrefunded": conn.execute(
                "select count(*) from payments p join orders o on o.id = p.order_id "
                "left join refunds r on r.payment_id = p.id "
                "where p.state = 'paid' and r.id is null"
            ).fetchone()[0],
            "cancelled_paid": conn.execute(
                "select count(*) from orders where status = 'cancelled_paid'"
            ).fetchone()[0],
            "live": conn.execute(
                "select count(*) from orders where status in ('pending_payment', 'paid')"
            ).fetchone()[0],
        }


def test_the_tickets_demo_races_cancels_and_keeps_every_promise(tmp_path: Path):
    db = tmp_path / "tickets.db"
    result = demo(
        "--flow", "tickets", "--orders", "16", "--speed", "60", "--db", str(db), timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "dueflow demo --flow tickets: 16 buyers" in out
    for promise in (
        "no seat held or sold twice",
        "no seat held by a cancelled order",
        "every buyer within the show's seat limit",
        "no seat in the lines of two live orders",
        "every paid-then-cancelled order has a refund",
        "the cancelled show: every seat free, every ticket void",
    ):
        assert promise in out
    assert "FAIL" not in out
    assert "order (seat_unavailable)" in out  # buyers raced for the same front seats
    assert "order (sales_closed)" in out  # the latecomers came after the show cancel
    assert "all invariants hold" in out
    after = _tables_after(db)
    assert after["seat_holds"] == after["buyers_counted"] == after["valid_tickets"] == 0
    assert after["live"] == 0 and after["paid_unrefunded"] == 0
    assert after["cancelled_paid"] >= 1, out


def test_the_marketplace_stays_the_default_flow(tmp_path: Path):
    result = demo("--orders", "3", "--speed", "300", "--db", str(tmp_path / "m.db"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "dueflow demo: 3 orders" in result.stdout
    bad = demo("--flow", "bakery")
    assert bad.returncode == 2
    assert "bakery" in bad.stderr


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """A dev-profile server whose ticket orders pay within 4 s, its database and admin token."""
    with serve(tmp_path_factory.mktemp("demo-tickets"), TICKET_WINDOWS) as served:
        yield served.base, served.db, served.tokens["admin"]


def test_the_tickets_demo_over_http_keeps_every_promise(server):
    base, db, admin = server
    result = demo(
        "--url", base, "--admin-token", admin, "--flow", "tickets", "--orders", "12", timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "dueflow demo --flow tickets over HTTP: 12 buyers" in out
    assert "order (seat_unavailable)" in out
    assert "order (sales_closed)" in out
    assert "every order of the cancelled show ended cancelled" in out
    assert "FAIL" not in out and "all invariants hold" in out
    headers = {"Authorization": f"Bearer {admin}"}
    summary = httpx.get(f"{base}/api/admin/summary", headers=headers, timeout=10).json()
    assert set(summary["orders"]) <= DEAD, summary["orders"]
    assert summary["invariants"]["ok"]
    seats = httpx.get(f"{base}/api/shows/1/seats", headers=headers, timeout=10).json()["seats"]
    assert len(seats) == 60 and {s["state"] for s in seats} == {"not_for_sale"}  # cancelled
    after = _tables_after(db)
    assert after["seat_holds"] == after["buyers_counted"] == after["valid_tickets"] == 0
    assert after["live"] == 0 and after["paid_unrefunded"] == 0

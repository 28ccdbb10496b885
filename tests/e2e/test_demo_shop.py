"""`dueflow demo --url ... --flow shop` against a `dueflow serve` subprocess whose shop orders
pay within 10 s (flash 6 s) and ship and arrive within 8 s: the shop over HTTP only, ending with
every invariant holding, exit 0, and the server's own tables agreeing."""

from __future__ import annotations

import sqlite3

import httpx
import pytest

from dueflow.demo import shop_checks as demo_shop_checks
from tests.e2e.live import serve
from tests.e2e.test_demo_http import demo

SHOP_WINDOWS = {
    "DUEFLOW_ORDER_TYPES": '{"shop": {"pay": "10s", "ship": "8s", "receive": "8s"}, '
    '"flash": {"pay": "6s", "reminder": "3s", "ship": "8s", "receive": "8s"}}',
    "DUEFLOW_SCAN_INTERVAL": "1s",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """A dev-profile server with short shop windows, its database and admin token."""
    with serve(tmp_path_factory.mktemp("demo-shop"), SHOP_WINDOWS) as served:
        yield served.base, served.db, served.tokens["admin"]


def test_the_shop_demo_over_http_keeps_every_promise(server):
    base, db, admin = server
    result = demo(
        "--url", base, "--admin-token", admin, "--flow", "shop", "--orders", "12", timeout=180
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "dueflow demo --flow shop over HTTP: 12 buyers" in out
    flat = " ".join(out.split())
    for promise in (demo_shop_checks.SOLD, demo_shop_checks.COUPONS, demo_shop_checks.NOTIFIED):
        assert promise in flat, promise
    assert "(not_allowed)" in flat and "(invalid_input)" in flat  # the wrong turns
    assert "FAIL" not in out and "all invariants hold" in out
    headers = {"Authorization": f"Bearer {admin}"}
    summary = httpx.get(f"{base}/api/admin/summary", headers=headers, timeout=10).json()
    assert summary["invariants"]["ok"], summary["invariants"]
    with sqlite3.connect(db) as conn:
        (unbalanced,) = conn.execute(
            "select count(*) from skus where stock + held + sold != stocked or held != 0"
        ).fetchone()
        (locked,) = conn.execute("select count(*) from coupons where state = 'locked'").fetchone()
        (untold,) = conn.execute(
            "select count(*) from orders o left join reminders r on r.order_id = o.id "
            "and r.kind = 'order_closed' where o.status like 'cancelled%' "
            "and (r.id is null or r.state != 'sent')"
        ).fetchone()
    assert unbalanced == locked == untold == 0

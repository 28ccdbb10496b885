"""`dueflow demo --url` against a `dueflow serve` subprocess on the dev profile with short
windows: the run ends with its outcomes and the invariants holding and every order final; a
wrong token, a missing one or an unreachable server is one error and exit 2."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.e2e.live import DUEFLOW, free_port, serve

WINDOWS = {
    "DUEFLOW_PAY_TIMEOUT": "8s",
    "DUEFLOW_REMINDER_AFTER": "2s",
    "DUEFLOW_SHIP_TIMEOUT": "4s",
    "DUEFLOW_RECEIVE_TIMEOUT": "4s",
    "DUEFLOW_REVIEW_TIMEOUT": "4s",
    "DUEFLOW_SCAN_INTERVAL": "1s",
}
FINAL = {"completed", "cancelled_unpaid", "cancelled_unshipped"}


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUEFLOW_")}
    env["COLUMNS"] = "200"
    return env


def demo(*args: str, env: dict[str, str] | None = None, timeout: float = 90):
    return subprocess.run(
        [str(DUEFLOW), "demo", *args, "--no-live"],
        env={**clean_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """A dev-profile server with short windows, and its admin's token."""
    with serve(tmp_path_factory.mktemp("demo-http"), WINDOWS) as served:
        yield served.base, served.tokens["admin"]


def test_the_demo_runs_over_http_and_every_order_ends_final(server):
    base, admin = server
    result = demo("--url", base, "--admin-token", admin, "--orders", "12")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "dueflow demo over HTTP: 12 orders" in out
    assert "outcomes" in out
    assert "figures" in out
    assert "all invariants hold" in out
    assert "FAIL" not in out
    headers = {"Authorization": f"Bearer {admin}"}
    summary = httpx.get(f"{base}/api/admin/summary", headers=headers, timeout=10).json()
    assert set(summary["orders"]) <= FINAL, summary["orders"]
    assert sum(summary["orders"].values()) == 12
    assert summary["invariants"]["ok"]
    for order_id in range(1, 13):
        view = httpx.get(f"{base}/api/orders/{order_id}", headers=headers, timeout=10).json()
        assert view["status"] in FINAL, view


def test_a_wrong_or_missing_admin_token_is_one_error_and_exit_2(server):
    base, admin = server
    wrong = demo("--url", base, "--admin-token", "not-a-token", "--orders", "1")
    assert wrong.returncode == 2
    assert "error: the admin token is not valid" in wrong.stderr
    assert "Traceback" not in wrong.stderr + wrong.stdout
    plain = httpx.post(
        f"{base}/api/admin/users",
        json={"name": "not-an-admin"},
        headers={"Authorization": f"Bearer {admin}"},
        timeout=10,
    ).json()["token"]
    from_env = demo("--url", base, "--orders", "1", env={"DUEFLOW_ADMIN_TOKEN": plain})
    assert from_env.returncode == 2
    assert "error: the token given is not an admin's" in from_env.stderr
    missing = demo("--url", base, "--orders", "1")
    assert missing.returncode == 2
    assert "needs an admin token" in missing.stderr


def test_an_unreachable_server_is_one_error_and_exit_2():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    result = demo("--url", url, "--admin-token", "whatever", "--orders", "1", timeout=30)
    assert result.returncode == 2
    assert f"error: cannot reach dueflow at {url}" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    bad = demo("--url", "localhost:8000", "--admin-token", "whatever", timeout=30)
    assert bad.returncode == 2
    assert "--url must look like http://HOST:PORT" in bad.stderr


def test_the_http_habits_swap_only_the_late_payment():
    from dueflow.demo.http import HTTP_BUYER_HABITS
    from dueflow.demo.marketplace import BUYER_HABITS

    assert set(HTTP_BUYER_HABITS) == (set(BUYER_HABITS) - {"pays_late"}) | {"pays_on_cancel"}
    assert sum(HTTP_BUYER_HABITS.values()) == pytest.approx(sum(BUYER_HABITS.values()))


def test_demo_without_url_ignores_the_admin_token_setting(tmp_path: Path):
    """DUEFLOW_ADMIN_TOKEN is read by the command line only, never as a setting."""
    result = demo(
        "--orders",
        "3",
        "--speed",
        "300",
        env={"DUEFLOW_ADMIN_TOKEN": "x", "DUEFLOW_DATABASE_URL": f"sqlite:///{tmp_path / 'd.db'}"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all invariants hold" in result.stdout

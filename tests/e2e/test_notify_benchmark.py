"""The notification benchmark stays honest: ``benchmarks/http_notify.py`` runs end to end at a
tiny size (the simulator's signed notifications, sent by wrk to ``dueflow serve``) with every
notification accepted once and every database check passing. No timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SERVICE_URLS, require_service
from tests.e2e.test_place_benchmark import need_wrk

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"

pytestmark = pytest.mark.serial


def run_notify(*args: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "http_notify.py"), *args],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.slow
@pytest.mark.parametrize(
    "database", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_a_tiny_notify_run_pays_each_order_once(database: str) -> None:
    need_wrk()
    # 200 notifications and 20 seconds: they run out first, every one sent once.
    args = ["--orders", "200", "--warmup", "20", "--seconds", "20", "--connections", "8"]
    if database == "postgres":
        require_service("postgres", "127.0.0.1", 5432)
        args += ["--backend", "postgres", "--postgres-url", str(SERVICE_URLS["postgres"])]
    result = run_notify(*args)
    assert result["ok"]
    assert result["place"] is None and result["ratio"] == {}
    run = result["notify"]
    assert isinstance(run, dict)
    assert run["failed"] == [], run["failed"]
    assert run["notifications"] == 200 and run["non_2xx"] == {}
    assert run["db"] == {
        "statuses": {"pending_shipment": 220},
        "pay_events_per_order": {"1": 220},
        "inbox": {"confirmed": 220},
    }
    assert all(value == 0 for value in run["transport_errors"].values())
    for field in ("notifications_per_s", "p50_ms", "p99_ms", "server_cpu_ms_per_notification"):
        assert run[field], field
    assert run["statements_per_notification"] and run["server_peak_rss_mib"]

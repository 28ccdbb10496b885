"""The chaos soak's short leg (issue 14): the real fleet (2 API processes, 3 workers, one with its
clock 30 s fast) on PostgreSQL, RabbitMQ and Redis, under load of every flow, with one fault of
each kind, then every invariant checked (about two minutes). ``make soak`` runs the long legs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from tests.conftest import SERVICE_URLS, require_service
from tests.soak.chaos import FAULTS

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.rabbitmq,
    pytest.mark.slow,
    pytest.mark.serial,
]


@pytest.mark.timeout(900)
def test_the_short_soak_breaks_no_promise(tmp_path: Path) -> None:
    require_service("postgres", "127.0.0.1", 5432)
    require_service("redis", "127.0.0.1", 6379)
    require_service("rabbitmq", "127.0.0.1", 5672)
    args = [sys.executable, "-m", "tests.soak", "--short", "--workdir", str(tmp_path)]
    args += ["--database", f"{make_url(str(SERVICE_URLS['postgres'])).database}_soak"]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=840)
    assert done.returncode == 0, done.stdout + done.stderr
    (results_path,) = tmp_path.glob("soak-*/results.json")
    (leg,) = json.loads(results_path.read_text())
    injected = {fault["kind"] for fault in leg["faults"]}
    assert injected == {*FAULTS, "clock_fast_worker"}
    assert all(n > 0 for n in leg["load"]["orders"].values())
    assert set(leg["load"]["orders"]) == {"marketplace", "tickets", "shop"}
    for check in leg["checks"]:
        assert check["checked"] > 0, check
        assert check["violations"] == 0, check
    assert leg["lateness"], "no timer ran"

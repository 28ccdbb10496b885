"""benchmarks/rabbitmq_queues.py runs end to end at a tiny size on the real RabbitMQ: every timer
published on each kind of queue comes out (else it exits non-zero), and it prints a run per kind
and path and the ratios. No timing is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_service

BENCHMARK = Path(__file__).parents[2] / "benchmarks" / "rabbitmq_queues.py"
URL = os.environ.get("DUEFLOW_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")


@pytest.mark.rabbitmq
def test_the_queue_kinds_benchmark_runs_at_a_tiny_size():
    require_service("rabbitmq", "127.0.0.1", 5672)
    done = subprocess.run(
        [sys.executable, str(BENCHMARK), "--url", URL, "--timers", "40", "--rounds", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    runs = [(r["kind"], r["path"], r["timers"]) for r in lines if "kind" in r]
    assert sorted(runs) == sorted(
        (kind, path, 40) for kind in ("classic", "quorum") for path in ("direct", "via level")
    )
    summaries = [r for r in lines if "quorum/classic" in r]
    assert [s["path"] for s in summaries] == ["direct", "via level"]
    assert all(s["quorum/classic"]["handed_over_per_s"] > 0 for s in summaries)

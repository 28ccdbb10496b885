"""The chaos soak's report (tests/soak/report.py): two small legs written by hand, one passing,
one with a violation, and the markdown and PNG made of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tests.soak.report import (
    failures,
    percentiles,
    render_markdown,
    render_plot,
    write_report,
)

COMMAND = ".venv/bin/python -m tests.soak --minutes 10"


def passing_leg() -> dict[str, Any]:
    """PostgreSQL + Redis: three faults, every check looked at something and found nothing."""
    return {
        "name": "postgresql-redis",
        "title": "PostgreSQL + Redis, 2 API processes, 3 workers",
        "started": "2026-03-01T12:00:00+00:00",
        "ended": "2026-03-01T12:01:00+00:00",
        "seconds": 60.0,
        "fleet": {"api_processes": 2, "workers": 3, "trigger": "redis", "database": "postgresql"},
        "settings": {"DUEFLOW_PAY_TIMEOUT": "10s", "DUEFLOW_SCAN_INTERVAL": "1s"},
        "load": {
            "orders": {"marketplace": 5, "shop": 4},
            "habits": {"prompt": 6, "never_pays": 3},
            "paid": 6,
            "order_ids": list(range(1, 10)),
            "errors": {},
        },
        "faults": [
            {"at": "2026-03-01T12:00:10+00:00", "kind": "sigkill_worker", "detail": "worker 1"},
            {"at": "2026-03-01T12:00:25+00:00", "kind": "restart_api", "detail": "api 0"},
            {"at": "2026-03-01T12:00:40.5+00:00", "kind": "sigkill_worker", "detail": "worker 2"},
        ],
        "checks": [
            {
                "name": "exactly_once",
                "promise": "Every order moved once at its deadline.",
                "checked": 9,
                "violations": 0,
                "evidence": [],
            },
            {
                "name": "money",
                "promise": "Every paid trade is an order's payment or refunded.",
                "checked": 6,
                "violations": 0,
                "evidence": [],
            },
        ],
        "lateness": [
            {
                "kind": "cancel_unpaid",
                "order_id": 3,
                "deadline": "2026-03-01T12:00:20+00:00",
                "acted": "2026-03-01T12:00:20.5+00:00",
                "late_s": 0.5,
            },
            {
                "kind": "cancel_unpaid",
                "order_id": 4,
                "deadline": "2026-03-01T12:00:30+00:00",
                "acted": "2026-03-01T12:00:31.25+00:00",
                "late_s": 1.25,
            },
            {
                "kind": "pay_reminder",
                "order_id": 5,
                "deadline": "2026-03-01T12:00:12+00:00",
                "acted": "2026-03-01T12:00:14+00:00",
                "late_s": 2.0,
            },
        ],
        "figures": {
            "orders": {
                "marketplace": {"cancelled_unpaid": 2, "reviewed": 3},
                "shop": {"cancelled_unpaid": 1, "received": 3},
            },
            "payments": {"paid": 6, "closed": 2},
            "timers": {"done": 17, "cancelled": 12},
            "deliveries": {"notices": 5, "events": 0, "repeats": 1, "repeats_unexplained": 0},
            "lateness": {
                "cancel_unpaid": {"p50": 0.5, "p99": 1.25, "max": 1.25, "n": 2},
                "pay_reminder": {"p50": 2.0, "p99": 2.0, "max": 2.0, "n": 1},
                "all": {"p50": 1.25, "p99": 2.0, "max": 2.0, "n": 3},
            },
        },
        "bounds": {"late_limit": 9.5, "scan_interval": 1.0, "lease": 5.0, "grace": 1.5},
    }


def failing_leg() -> dict[str, Any]:
    """SQLite: one check broken twice, one check that looked at nothing, one timer too late."""
    return {
        "name": "sqlite",
        "title": "SQLite, 1 process",
        "started": "2026-03-01T12:05:00+00:00",
        "ended": "2026-03-01T12:05:30+00:00",
        "seconds": 30.0,
        "fleet": {"api_processes": 1, "workers": 0, "trigger": "db", "database": "sqlite"},
        "settings": {"DUEFLOW_PAY_TIMEOUT": "10s"},
        "load": {"orders": {"tickets": 3}, "paid": 2, "refused": {"invalid_transition": 4}},
        "faults": [
            {"at": "2026-03-01T12:05:08+00:00", "kind": "sigstop_worker", "detail": "4 s"},
        ],
        "checks": [
            {
                "name": "money",
                "promise": "Every paid trade is an order's payment or refunded.",
                "checked": 2,
                "violations": 2,
                "evidence": [
                    "trade 2026030100aa (order 7) paid at 12:05:12 but order 7 is cancelled_unpaid",
                    "trade 2026030100bb (order 8) refunded twice: refunds 3, 4 `succeeded`",
                ],
            },
            {
                "name": "events",
                "promise": "Every event seq is delivered in order.",
                "checked": 0,
                "violations": 0,
                "evidence": [],
            },
        ],
        "lateness": [
            {
                "kind": "cancel_unpaid",
                "order_id": 7,
                "deadline": "2026-03-01T12:05:10+00:00",
                "acted": "2026-03-01T12:05:11+00:00",
                "late_s": 1.0,
            },
            {
                "kind": "cancel_unpaid",
                "order_id": 8,
                "deadline": "2026-03-01T12:05:10+00:00",
                "acted": "2026-03-01T12:05:22+00:00",
                "late_s": 12.0,
            },
            {
                "kind": "order_closed",
                "order_id": 7,
                "deadline": "2026-03-01T12:05:11+00:00",
                "acted": "2026-03-01T12:05:14+00:00",
                "late_s": 3.0,
            },
        ],
        "figures": {"payments": {"paid": 2}},
        "bounds": {"late_limit": 9.5},
    }


def test_percentiles_are_nearest_rank():
    assert percentiles([]) == {"n": 0}
    assert percentiles([4.5]) == {"p50": 4.5, "p99": 4.5, "max": 4.5, "n": 1}
    assert percentiles([2.0, 1.0]) == {"p50": 1.0, "p99": 2.0, "max": 2.0, "n": 2}
    hundred = [float(v) for v in range(100, 0, -1)]
    assert percentiles(hundred) == {"p50": 50.0, "p99": 99.0, "max": 100.0, "n": 100}
    # ten values: p99's rank is ceil(9.9) = 10, the largest; p50's is the 5th smallest
    ten = [0.3, 9.0, 0.1, 0.7, 0.2, 0.5, 0.9, 0.4, 0.6, 0.8]
    assert percentiles(ten) == {"p50": 0.5, "p99": 9.0, "max": 9.0, "n": 10}


def test_failures_name_every_reason():
    assert failures(passing_leg()) == []
    assert failures(failing_leg()) == [
        "check money: 2 violation(s)",
        "check events looked at nothing (checked 0)",
    ]
    assert failures({"name": "empty"}) == ["no check ran"]


def test_markdown_summary_has_the_figures_and_verdicts():
    text = render_markdown([passing_leg(), failing_leg()], plot_name="soak.png", command=COMMAND)
    assert text.startswith("# Reliability: the chaos soak\n")
    assert f"```sh\n{COMMAND}\n```" in text
    assert "Run of 2026-03-01 12:00 UTC. Verdict: **FAIL** (1 of 2 legs: sqlite)." in text
    # orders from dueflow's database (2 + 3 + 1 + 3), payments paid, faults, lateness, limit
    assert "| postgresql-redis | 9 | 6 | 3 | 1.250 | 2.000 | 2.000 | 9.500 | 0 | PASS |" in text
    # no database orders: the load's count; lateness worked out from the list (1, 3, 12)
    assert "| sqlite | 3 | 2 | 1 | 3.000 | 12.000 | 12.000 | 9.500 | 2 | FAIL |" in text
    assert (
        "Faults injected over all legs: restart_api 1, sigkill_worker 2, sigstop_worker 1 "
        "(4 in all)." in text
    )
    assert "![lateness](img/soak.png)" in text
    assert all(ord(char) < 0x2000 for char in text)


def test_markdown_leg_sections_have_faults_load_checks_and_lateness():
    text = render_markdown([passing_leg(), failing_leg()], plot_name="soak.png", command=COMMAND)
    passing, failing = text.split("## Leg postgresql-redis: ")[1].split("## Leg sqlite: ")
    assert "From 2026-03-01 12:00:00 UTC to 2026-03-01 12:01:00 UTC (60.000 s)." in passing
    assert "Verdict: **PASS**." in passing
    assert "| fleet: workers | 3 |" in passing
    assert "| `DUEFLOW_PAY_TIMEOUT` | 10s |" in passing
    assert "| bound: late_limit | 9.500 |" in passing
    assert "| sigkill_worker | 2 | +10.000 s (12:00:10) | +40.500 s (12:00:40) |" in passing
    assert "| restart_api | 1 | +25.000 s (12:00:25) | +25.000 s (12:00:25) |" in passing
    assert "3 faults in all." in passing
    assert "| orders | marketplace 5, shop 4 |" in passing
    assert "| order_ids | 9 ids |" in passing
    assert "| errors | none |" in passing
    assert "| flow | cancelled_unpaid | received | reviewed | all |" in passing
    assert "| marketplace | 2 | - | 3 | 5 |" in passing
    assert "| deliveries | notices 5, events 0, repeats 1, repeats_unexplained 0 |" in passing
    assert "| exactly_once | Every order moved once at its deadline. | 9 | 0 | ok |" in passing
    assert "| cancel_unpaid | 0.500 | 1.250 | 1.250 | 2 |" in passing
    assert "| all | 1.250 | 2.000 | 2.000 | 3 |" in passing
    assert "Evidence" not in passing

    assert "Verdict: **FAIL**." in failing
    assert "- check money: 2 violation(s)" in failing
    assert "| sigstop_worker | 1 | +8.000 s (12:05:08) | +8.000 s (12:05:08) |" in failing
    assert "| refused | invalid_transition 4 |" in failing
    assert "| money | Every paid trade is an order's payment or refunded. | 2 | 2 | VIOLATED |" in (
        failing
    )
    assert "| events | Every event seq is delivered in order. | 0 | 0 | checked nothing |" in (
        failing
    )
    evidence = failing.split("Evidence of money:\n\n")[1].split("\n\n")[0]
    assert evidence.splitlines() == [
        "```text",
        "trade 2026030100aa (order 7) paid at 12:05:12 but order 7 is cancelled_unpaid",
        "trade 2026030100bb (order 8) refunded twice: refunds 3, 4 `succeeded`",
        "```",
    ]
    assert "| cancel_unpaid | 1.000 | 12.000 | 12.000 | 2 |" in failing
    assert "| order_closed | 3.000 | 3.000 | 3.000 | 1 |" in failing
    assert "| all | 3.000 | 12.000 | 12.000 | 3 |" in failing


def test_evidence_with_a_fence_in_it_keeps_its_block_closed():
    leg = failing_leg()
    leg["checks"][0]["evidence"] = ["detail ```three``` and | pipe"]
    text = render_markdown([leg], plot_name="soak.png", command=COMMAND)
    assert "````text\ndetail ```three``` and | pipe\n````" in text


def test_missing_figures_are_shown_as_missing_not_invented():
    leg = {"name": "bare", "checks": [{"name": "x", "checked": 1, "violations": 0}]}
    text = render_markdown([leg], plot_name="soak.png", command=COMMAND)
    assert "| bare | - | - | 0 | - | - | - | - | 0 | PASS |" in text
    assert "Run of an unrecorded date." in text
    assert "No fault was injected." in text
    assert "No fault was injected in any leg." in text
    assert "No timer was done." in text


def test_plot_is_a_png_of_the_expected_size(tmp_path: Path):
    path = tmp_path / "soak.png"
    render_plot([passing_leg(), failing_leg()], path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 20_000
    with Image.open(path) as image:
        # 11 x (3.2 per leg) inches at 110 dpi
        assert image.size == (1210, 704)
        # not a blank canvas: the dots, lines and text put many colours on it
        assert len(image.convert("RGB").getcolors(maxcolors=1_000_000) or []) > 50


def test_write_report_puts_the_plot_beside_the_markdown(tmp_path: Path):
    markdown = tmp_path / "docs" / "reliability.md"
    markdown.parent.mkdir()
    plot = tmp_path / "docs" / "img" / "reliability-lateness.png"
    write_report([passing_leg()], markdown, plot, command=COMMAND)
    assert "![lateness](img/reliability-lateness.png)" in markdown.read_text()
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="img"):
        write_report([passing_leg()], markdown, tmp_path / "elsewhere.png", command=COMMAND)


def test_no_leg_is_refused():
    with pytest.raises(ValueError, match="no leg"):
        render_markdown([], plot_name="soak.png", command=COMMAND)


def test_markdown_has_the_machine_and_each_legs_pace():
    leg = passing_leg()
    leg["pace"] = {
        "rate": 4.8,
        "share": 0.4,
        "bound_by": "place",
        "person_cost": 50.0,
        "machine": {
            "place": {
                "postgresx2": {
                    "orders_per_s": 600.0,
                    "server_cpu_ms_per_order": 2.0,
                    "p99_ms": 90.0,
                    "processes": 2,
                    "database": "postgres",
                }
            },
            "herd": {
                "postgresql-redis": {
                    "cancels_per_s": 3000,
                    "orders": 20000,
                    "lateness_p99_s": 6.5,
                    "trigger": "redis",
                    "workers": 2,
                }
            },
            "seconds": 41.5,
        },
    }
    leg["load"]["placed_per_s"] = 4.6
    leg["cpu"] = {"measured": True, "places_per_person": 47.5}
    text = render_markdown([leg, failing_leg()], plot_name="soak.png", command=COMMAND)
    assert "## The machine, and the pace of each leg" in text
    assert "| place rate, postgres, 2 API | 600.000/s, 2.000 ms CPU an order, p99 90.000 ms |" in (
        text
    )
    assert "| herd rate, postgresql-redis (redis, 2 workers) | 3000 cancels/s (20000 orders)" in (
        text
    )
    assert "| postgresql-redis | 40% | 4.800 | 4.600 | place | 50.000 | 47.500 |" in text
    # a leg without a pace (an older result) has no row
    assert "| sqlite | " not in text.split("## The machine")[1].split("## How")[0]

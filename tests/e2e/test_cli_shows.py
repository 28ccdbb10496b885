"""``dueflow shows`` and ``dueflow orders place --show`` in subprocesses, on a fresh SQLite
file: a show put on sale, seats held, paid and drawn in the grid, refusals with exit 2."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

DUEFLOW = Path(sys.executable).parent / "dueflow"
STARTS = "2030-12-24T19:30:00+08:00"
CLOSES = "2030-12-24T19:00:00+08:00"


@pytest.fixture
def db_file(tmp_path: Path) -> Path:
    return tmp_path / "shows.db"


@pytest.fixture
def cli(db_file: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUEFLOW_")}
    env.update({"DUEFLOW_DATABASE_URL": f"sqlite:///{db_file}", "COLUMNS": "200"})

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(DUEFLOW), *args], env=env, capture_output=True, text=True, timeout=60
        )

    return run


@pytest.fixture
def show(cli) -> int:
    """org's show 1 (A-1..A-20 at 380, B-1..B-10 at 180, limit 4); bea and cy may buy."""
    for name in ("org", "bea", "cy"):
        assert cli("users", "add", name).returncode == 0
    added = add_show(cli, "--seats", "A:1-20,B:1-10", "--price", "A=380", "--price", "B=180")
    assert added.returncode == 0, added.stderr
    return 1


def add_show(cli, *args: str):
    return cli(
        "shows", "add", "--organizer", "org", "--title", "Nutcracker", "--venue", "Hall",
        "--starts-at", STARTS, "--sales-close-at", CLOSES, *args,
    )  # fmt: skip


def rows(db_file: Path, sql: str) -> list[tuple]:
    conn = sqlite3.connect(db_file)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def test_a_show_is_added_with_its_seats_per_tier(cli, db_file):
    assert cli("users", "add", "org").returncode == 0
    added = add_show(
        cli, "--limit", "2", "--seats", "A:1-20,B:1-10", "--price", "A=380", "--price", "B=180"
    )
    assert added.returncode == 0, added.stderr
    assert "show 1 on sale: Nutcracker at Hall, 30 seats (A 20 at 380.00, B 10 at 180.00)" in (
        added.stdout
    )
    assert rows(db_file, "SELECT seat_limit, status FROM shows") == [(2, "on_sale")]
    assert rows(db_file, "SELECT tier, count(*), min(price) FROM seats GROUP BY tier") == [
        ("A", 20, "380.00"),
        ("B", 10, "180.00"),
    ]


def test_seats_are_held_paid_and_drawn_in_the_grid(cli, show, db_file):
    placed = cli("orders", "place", "--show", "1", "--seats", "A-1,A-2", "--buyer", "bea")
    assert placed.returncode == 0, placed.stderr
    assert re.search(
        r"order 1 pending_payment: 760\.00 for seats A-1, A-2 of show 1", placed.stdout
    )
    other = cli("orders", "place", "--show", "1", "--seats", "B-10", "--buyer", "cy")
    assert other.returncode == 0, other.stderr
    paid = cli("payments", "record", "2", "--amount", "180")
    assert paid.returncode == 0, paid.stderr

    shown = cli("shows", "show", "1")
    assert shown.returncode == 0, shown.stderr
    assert "show 1 on_sale: Nutcracker at Hall" in shown.stdout
    assert "starts at: 2030-12-24 11:30:00 UTC" in shown.stdout
    assert "seats: 27 free, 2 held, 1 sold" in shown.stdout
    grid = [line.strip() for line in shown.stdout.splitlines() if line.startswith("  A ")]
    grid += [line.strip() for line in shown.stdout.splitlines() if line.startswith("  B ")]
    assert grid == ["A hh" + "." * 18, "B " + "." * 9 + "S"]
    assert rows(db_file, "SELECT order_id, state FROM seat_holds ORDER BY seat_id") == [
        (1, "held"),
        (1, "held"),
        (2, "sold"),
    ]


def test_refusals_exit_2_with_the_seat_or_the_rule_named(cli, show, db_file):
    assert cli("orders", "place", "--show", "1", "--seats", "A-1", "--buyer", "bea").returncode == 0
    taken = cli("orders", "place", "--show", "1", "--seats", "A-1,A-3", "--buyer", "cy")
    assert (taken.returncode, "A-1" in taken.stderr) == (2, True)
    unknown = cli("orders", "place", "--show", "1", "--seats", "C-1", "--buyer", "cy")
    assert (unknown.returncode, "no seat C-1" in unknown.stderr) == (2, True)
    too_many = cli("orders", "place", "--show", "1", "--seats", "B-1,B-2,B-3,B-4", "--buyer", "bea")
    assert (too_many.returncode, "4 seats" in too_many.stderr) == (2, True)
    both = cli("orders", "place", "1", "--show", "1", "--seats", "A-5", "--buyer", "cy")
    assert (both.returncode, "give a goods id, --show with --seats" in both.stderr) == (2, True)
    neither = cli("orders", "place", "--buyer", "cy")
    assert neither.returncode == 2
    no_seats = cli("orders", "place", "--show", "1", "--buyer", "cy")
    assert no_seats.returncode == 2
    typed = cli(
        "orders", "place", "--show", "1", "--seats", "A-5", "--type", "flash", "--buyer", "cy"
    )
    # the buyer cannot pick the order type (it sets their own deadline): no such option
    assert (typed.returncode, "No such option: --type" in typed.stderr) == (2, True)
    own = cli("orders", "place", "--show", "1", "--seats", "A-5", "--buyer", "org")
    assert (own.returncode, "your own show" in own.stderr) == (2, True)
    missing = cli("shows", "show", "9")
    assert (missing.returncode, "no show 9" in missing.stderr) == (2, True)
    assert rows(db_file, "SELECT count(*) FROM orders") == [(1,)]
    assert rows(db_file, "SELECT count(*) FROM seat_holds") == [(1,)]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--seats", "A:1-5", "--price", "A=x"), "not an amount"),
        (("--seats", "A:1-5", "--price", "B=10"), "section A has no price"),
        (("--seats", "A:5-1", "--price", "A=10"), "runs backwards"),
        (("--seats", "A1-5", "--price", "A=10"), "not a seat range"),
        (("--seats", "A:1-5", "--price", "A10"), "SECTION=YUAN"),
        (("--seats", "A:1-5", "--price", "A=10", "--limit", "0"), "--limit"),
    ],
)
def test_a_bad_show_exits_2_and_adds_nothing(cli, db_file, args, message):
    assert cli("users", "add", "org").returncode == 0
    refused = add_show(cli, *args)
    assert refused.returncode == 2
    assert message in refused.stderr
    assert rows(db_file, "SELECT count(*) FROM shows") == [(0,)]


def test_a_time_without_its_offset_is_a_usage_error(cli, db_file):
    assert cli("users", "add", "org").returncode == 0
    refused = cli(
        "shows", "add", "--organizer", "org", "--title", "T", "--venue", "V",
        "--starts-at", "2030-12-24T19:30", "--sales-close-at", CLOSES,
        "--seats", "A:1-2", "--price", "A=1",
    )  # fmt: skip
    assert refused.returncode == 2
    assert "give the offset" in refused.stderr
    assert rows(db_file, "SELECT count(*) FROM shows") == [(0,)]


@pytest.mark.parametrize(
    ("starts", "closes", "option"),
    [
        ("9999-12-31T23:59:59-12:00", CLOSES, "--starts-at"),
        (STARTS, "0001-01-01T00:00:00+14:00", "--sales-close-at"),
    ],
)
def test_a_time_outside_what_is_stored_is_a_usage_error(cli, db_file, starts, closes, option):
    assert cli("users", "add", "org").returncode == 0
    refused = cli(
        "shows", "add", "--organizer", "org", "--title", "T", "--venue", "V",
        "--starts-at", starts, "--sales-close-at", closes, "--seats", "A:1-2", "--price", "A=1",
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert option in refused.stderr and "outside the times dueflow stores" in refused.stderr
    assert rows(db_file, "SELECT count(*) FROM shows") == [(0,)]


def test_only_the_organizer_cancels_and_only_once(cli, show, db_file):
    assert cli("orders", "place", "--show", "1", "--seats", "A-1", "--buyer", "bea").returncode == 0
    stranger = cli("shows", "cancel", "1", "--as", "bea")
    assert (stranger.returncode, "only the organizer" in stranger.stderr) == (2, True)
    cancelled = cli("shows", "cancel", "1", "--as", "org")
    assert cancelled.returncode == 0, cancelled.stderr
    assert "show 1 cancelled: 1 live order to cancel" in cancelled.stdout
    again = cli("shows", "cancel", "1", "--as", "org")
    assert (again.returncode, "already cancelled" in again.stderr) == (2, True)
    closed = cli("orders", "place", "--show", "1", "--seats", "A-9", "--buyer", "cy")
    assert (closed.returncode, "cancelled" in closed.stderr) == (2, True)
    assert rows(db_file, "SELECT status FROM shows") == [("cancelled",)]
    assert rows(db_file, "SELECT kind, state FROM timers WHERE kind = 'show_cancel'") == [
        ("show_cancel", "scheduled")
    ]

"""``dueflow tickets check-in`` in subprocesses, on a fresh SQLite file: the door's four
verdicts (valid, checked in already with when and where, void, unknown), each with its exit
status, and bad input refused with 2 and nothing recorded."""

from __future__ import annotations

import pytest

from tests.e2e.test_cli_shows import add_show, cli, db_file, rows

__all__ = ["cli", "db_file"]  # the fixtures, shared with the shows' tests


@pytest.fixture
def codes(cli, db_file) -> list[str]:
    """org's show 1 with two paid tickets, A-1 (bea's order 1) and A-2 (order 2)."""
    for name in ("org", "bea"):
        assert cli("users", "add", name).returncode == 0
    assert add_show(cli, "--seats", "A:1-5", "--price", "A=100").returncode == 0
    for order_id, seat in ((1, "A-1"), (2, "A-2")):
        placed = cli("orders", "place", "--show", "1", "--seats", seat, "--buyer", "bea")
        assert placed.returncode == 0, placed.stderr
        paid = cli("payments", "record", str(order_id), "--amount", "100")
        assert paid.returncode == 0, paid.stderr
    return [code for (code,) in rows(db_file, "SELECT code FROM tickets ORDER BY order_id")]


def test_each_verdict_has_its_exit_status(cli, db_file, codes):
    first, second = codes
    valid = cli("tickets", "check-in", first, "--gate", "North 2", "--as", "org")
    assert valid.returncode == 0, valid.stderr
    assert "valid: seat A-1 of show 1 (order 1, buyer bea), checked in at " in valid.stdout
    assert valid.stdout.rstrip().endswith("UTC at gate North 2")

    again = cli("tickets", "check-in", first, "--gate", "South", "--as", "org")
    assert again.returncode == 3, again.stderr
    assert "checked in already at " in again.stdout and "at gate North 2 (seat A-1)" in again.stdout

    for who, code in (("org", "no-such-code"), ("bea", second), ("org", "bad code!")):
        unknown = cli("tickets", "check-in", code, "--as", who)
        assert (unknown.returncode, unknown.stdout.strip()) == (5, "unknown: no such ticket")

    assert cli("shows", "cancel", "1", "--as", "org").returncode == 0
    void = cli("tickets", "check-in", second, "--as", "org")
    assert (void.returncode, void.stdout.strip()) == (4, "void: show 1 was cancelled (seat A-2)")
    assert rows(
        db_file, "SELECT code, checked_in_gate FROM tickets WHERE checked_in_at IS NOT NULL"
    ) == [(first, "North 2")]
    assert rows(db_file, "SELECT count(*) FROM order_events WHERE event = 'ticket_checked_in'") == [
        (1,)
    ]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--gate", "x" * 41, "--as", "org"], "at most 40"),
        (["--gate", "a\x01", "--as", "org"], "gate"),
        (["--as", "nobody"], "nobody"),
        ([], "--as"),
    ],
)
def test_bad_input_exits_2_and_checks_nothing_in(cli, db_file, codes, args, says):
    refused = cli("tickets", "check-in", codes[0], *args)
    assert refused.returncode == 2, refused.stdout
    assert says in refused.stderr
    assert rows(db_file, "SELECT count(*) FROM tickets WHERE checked_in_at IS NOT NULL") == [(0,)]

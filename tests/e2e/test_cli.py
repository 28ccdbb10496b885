"""The real ``dueflow`` program in subprocesses, on a fresh SQLite file."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import eventually_sync

DUEFLOW = Path(sys.executable).parent / "dueflow"


@pytest.fixture
def cli(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUEFLOW_")}
    env["DUEFLOW_DATABASE_URL"] = f"sqlite:///{tmp_path / 'cli.db'}"
    env["COLUMNS"] = "200"

    def run(*args: str, extra: dict[str, str] | None = None, timeout: float = 60):
        return subprocess.run(
            [str(DUEFLOW), *args],
            env={**env, **(extra or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run


#: What a command imports when it runs, never when ``dueflow`` starts (seconds of imports);
#: pydantic is not here: typer itself imports it to read a command's options.
HEAVY = (
    "sqlalchemy",
    "fastapi",
    "starlette",
    "pydantic_settings",
    "httpx",
    "redis",
    "aio_pika",
    "cryptography",
)


def test_help_imports_no_database_api_or_provider_code():
    # Every command's --help too: typer reads the options of each, so none may need them.
    probe = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "import dueflow.cli\n"
        "runner = CliRunner()\n"
        "for args in ([], ['orders', 'place'], ['shows', 'add'], ['skus', 'add'], ['demo'],\n"
        "             ['webhooks', 'add'], ['webhooks', 'replay'], ['tickets', 'check-in']):\n"
        "    result = runner.invoke(dueflow.cli.app, [*args, '--help'])\n"
        "    assert result.exit_code == 0, result.output\n"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    loaded = set(result.stdout.split())
    assert "typer" in loaded
    assert loaded.isdisjoint(HEAVY), sorted(loaded.intersection(HEAVY))


def test_status_imports_only_the_adapters_the_settings_choose(cli, tmp_path):
    # SQLite and the database trigger: no Redis or RabbitMQ client, no HTTP client, no API,
    # no Alipay or WeChat Pay (none configured).
    assert cli("migrate").returncode == 0
    probe = (
        "import sys\n"
        "from dueflow import cli\n"
        "try:\n"
        "    cli.app(['status'], standalone_mode=False)\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    env = {**os.environ, "DUEFLOW_DATABASE_URL": f"sqlite:///{tmp_path / 'cli.db'}"}
    result = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    loaded = result.stdout.split()
    assert "dueflow.service.report" in loaded  # it did run the status
    unneeded = ("redis", "aio_pika", "httpx", "fastapi", "dueflow.api", "dueflow.payments.alipay")
    assert [m for m in loaded if m.startswith((*unneeded, "dueflow.payments.wechatpay"))] == []


def test_migrate_then_status(cli):
    result = cli("migrate")
    assert result.returncode == 0, result.stderr
    assert "up to date" in result.stdout
    status = cli("status")
    assert status.returncode == 0, status.stderr
    assert "orders pending_payment" in status.stdout
    assert "timers overdue" in status.stdout


def test_users_add_prints_a_token_once_and_refuses_duplicates(cli):
    first = cli("users", "add", "alice", "--admin")
    assert first.returncode == 0, first.stderr
    assert re.search(r"admin alice \(id 1\) token: \S{20,}", first.stdout)
    again = cli("users", "add", "alice")
    assert again.returncode == 2
    assert "already exists" in again.stderr
    bad = cli("users", "add", "no spaces allowed")
    assert bad.returncode == 2
    assert "user name" in bad.stderr


def test_bad_settings_exit_2_with_the_variable_named(cli):
    result = cli("status", extra={"DUEFLOW_PAY_TIMEOUT": "3x"})
    assert result.returncode == 2
    assert "DUEFLOW_PAY_TIMEOUT" in result.stderr
    assert "not a duration" in result.stderr
    unknown = cli("status", extra={"DUEFLOW_TRIGGER_URL": "kafka://x"})
    assert unknown.returncode == 2
    assert "unsupported trigger" in unknown.stderr
    database = cli("status", extra={"DUEFLOW_DATABASE_URL": "oracle://x"})
    assert database.returncode == 2
    assert "unsupported database" in database.stderr


def test_bad_arguments_exit_2(cli):
    assert cli("orders", "place", "notanumber", "--buyer", "x").returncode == 2
    assert cli("worker", "--concurrency", "0").returncode == 2
    assert cli("no-such-command").returncode == 2


def test_order_placed_paid_and_shown(cli):
    assert cli("users", "add", "sam").returncode == 0
    assert cli("users", "add", "bea").returncode == 0
    goods = cli("goods", "add", "--seller", "sam", "--title", "camera", "--price", "12.50")
    assert goods.returncode == 0, goods.stderr
    assert "goods 1 on sale" in goods.stdout
    placed = cli("orders", "place", "1", "--buyer", "bea")
    assert placed.returncode == 0, placed.stderr
    assert "order 1 pending_payment: 12.50" in placed.stdout
    taken = cli("orders", "place", "1", "--buyer", "bea")
    assert taken.returncode == 2
    assert "held by another order" in taken.stderr
    wrong = cli("payments", "record", "1", "--amount", "12.00")
    assert wrong.returncode == 2
    assert "differs" in wrong.stderr
    malformed = cli("payments", "record", "1", "--amount", "twelve")
    assert malformed.returncode == 2
    assert "not an amount" in malformed.stderr
    paid = cli("payments", "record", "1", "--amount", "12.5")
    assert paid.returncode == 0, paid.stderr
    assert "confirmed" in paid.stdout
    shown = cli("orders", "show", "1")
    assert shown.returncode == 0, shown.stderr
    assert "pending_shipment" in shown.stdout
    assert "cancel_unshipped" in shown.stdout
    assert "manual" in shown.stdout
    missing = cli("orders", "show", "99")
    assert missing.returncode == 2
    assert "no order 99" in missing.stderr


def test_scan_reports_what_it_did(cli):
    result = cli("scan")
    assert result.returncode == 0, result.stderr
    assert re.search(r"scan: claimed 0 timers in 0 batches, 0 failed, 0 errors", result.stdout)


def test_demo_runs_and_checks_its_invariants(cli):
    result = cli("demo", "--orders", "12", "--speed", "120", "--no-live", timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "outcomes" in result.stdout
    assert "all invariants hold" in result.stdout
    assert "FAIL" not in result.stdout


def test_simulator_serves_its_keys_and_an_alipay_gateway(cli, tmp_path):
    import socket

    import httpx

    from tests.e2e.live import answers

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUEFLOW_")}
    with (tmp_path / "sim.log").open("wb") as log:
        proc = subprocess.Popen(
            [str(DUEFLOW), "simulator", "--port", str(port)], env=env, stdout=log, stderr=log
        )
    try:
        url = f"http://127.0.0.1:{port}/control/keys"
        assert eventually_sync(lambda: answers(url), 30, 0.1), (tmp_path / "sim.log").read_text()
        keys = httpx.get(url, timeout=5).json()
        assert keys["alipay_app_id"].startswith("2021")
        assert keys["wechatpay_public_key_id"].startswith("PUB_KEY_ID_")
        unsigned = httpx.get(f"http://127.0.0.1:{port}/alipay/gateway.do", timeout=5)
        assert unsigned.status_code == 200
        assert "error_response" in unsigned.text  # the gateway refuses an unsigned call
    finally:
        proc.terminate()
        assert proc.wait(timeout=20) in (0, -15)


def test_timers_run_again_revives_a_parked_timer(cli, tmp_path):
    assert cli("users", "add", "sam").returncode == 0
    assert cli("users", "add", "bea").returncode == 0
    assert cli("goods", "add", "--seller", "sam", "--title", "cam", "--price", "1").returncode == 0
    assert cli("orders", "place", "1", "--buyer", "bea").returncode == 0
    with sqlite3.connect(tmp_path / "cli.db") as db:
        # As the worker leaves a timer whose handler failed on its last attempt.
        db.execute(
            "UPDATE timers SET state = 'parked', deadline_at = created_at, due_at = created_at,"
            " attempts = 20, outcome = 'parked', done_at = created_at"
            " WHERE kind = 'cancel_unpaid'"
        )
        (timer_id,) = db.execute("SELECT id FROM timers WHERE state = 'parked'").fetchone()
    again = cli("timers", "run-again", str(timer_id))
    assert again.returncode == 0, again.stderr
    assert f"timer {timer_id} scheduled, due now" in again.stdout
    with sqlite3.connect(tmp_path / "cli.db") as db:
        row = db.execute(
            "SELECT state, outcome, done_at, attempts FROM timers WHERE id = ?", (timer_id,)
        ).fetchone()
    assert row == ("scheduled", None, None, 20)
    missing = cli("timers", "run-again", "999")
    assert missing.returncode == 2
    assert "no timer 999" in missing.stderr

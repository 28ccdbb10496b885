"""A ``DUEFLOW_*`` variable that is no setting (a misspelling) stops every entry point with exit
status 2, naming the closest valid name; the variables dueflow reads besides its settings (and
the test suite's own) stay allowed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dueflow import cli
from dueflow.config import NOT_SETTINGS, Settings, check_environment, load_settings
from dueflow.exceptions import ConfigError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def env(monkeypatch, tmp_path):
    """No DUEFLOW_* variable from outside; relative paths land in tmp_path."""
    import os

    for name in list(os.environ):
        if name.upper().startswith("DUEFLOW_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return monkeypatch


@pytest.mark.parametrize(
    ("variable", "meant"),
    [
        ("DUEFLOW_PAY_REMINDER", "DUEFLOW_REMINDER_AFTER"),
        ("DUEFLOW_DATABSE_URL", "DUEFLOW_DATABASE_URL"),
        ("DUEFLOW_PAYTIMEOUT", "DUEFLOW_PAY_TIMEOUT"),
        ("DUEFLOW_NOTIFY_URL", "DUEFLOW_NOTIFIER_URL"),
        ("DUEFLOW_CONFIG", "DUEFLOW_CONFIG_FILE"),
        ("dueflow_ship_timeouts", "DUEFLOW_SHIP_TIMEOUT"),
    ],
)
def test_a_misspelled_variable_is_refused_naming_the_closest(env, variable, meant):
    env.setenv(variable, "5m")
    with pytest.raises(ConfigError) as refused:
        load_settings()
    assert refused.value.message == f"unknown setting {variable}; did you mean {meant}?"


def test_a_name_like_no_setting_points_to_the_docs(env):
    env.setenv("DUEFLOW_XYZZY", "1")
    with pytest.raises(ConfigError, match=r"unknown setting DUEFLOW_XYZZY; docs/configuration"):
        load_settings()


@pytest.mark.parametrize(
    "variable",
    [
        "DUEFLOW_SERVICE_HOST",
        "DUEFLOW_SERVICE_PORT",
        "DUEFLOW_SERVICE_PORT_HTTP",
        "DUEFLOW_PORT",
        "DUEFLOW_PORT_8000_TCP",
        "DUEFLOW_PORT_8000_TCP_ADDR",
        "DUEFLOW_WORKER_SERVICE_HOST",
        "DUEFLOW_POSTGRES_PORT_5432_TCP_PROTO",
        "DUEFLOW_NAME",
        "DUEFLOW_ENV_PATH",
    ],
)
def test_what_orchestrators_set_for_a_service_named_dueflow_is_not_refused(env, variable):
    """Found in review: Kubernetes service links and Docker links put these in every container
    of a namespace with a service named dueflow...; refusing them would crash-loop every pod."""
    env.setenv(variable, "tcp://10.0.0.7:8000")
    assert load_settings().profile == "prod"


def test_a_name_that_is_not_text_is_named_safely(env):
    with pytest.raises(ConfigError, match="unknown setting DUEFLOW_X"):
        check_environment({"DUEFLOW_X\udcff": "1"})


def test_every_unknown_variable_is_named_at_once(env):
    env.setenv("DUEFLOW_PAY_REMINDER", "1")
    env.setenv("DUEFLOW_LEASES", "1")
    with pytest.raises(ConfigError) as refused:
        load_settings()
    assert refused.value.message.splitlines() == [
        "unknown setting DUEFLOW_LEASES; did you mean DUEFLOW_LEASE?",
        "unknown setting DUEFLOW_PAY_REMINDER; did you mean DUEFLOW_REMINDER_AFTER?",
    ]


def test_every_setting_and_the_variables_dueflow_reads_besides_are_allowed(env, tmp_path):
    names = {f"DUEFLOW_{field.upper()}": "x" for field in Settings.model_fields}
    names.update({name: "x" for name in NOT_SETTINGS})
    names.update({"DUEFLOW_TEST_POSTGRES_URL": "x", "DUEFLOW_TEST_ANYTHING": "x", "OTHER": "x"})
    check_environment(names)  # raises on any it does not know
    config = tmp_path / "dueflow.toml"
    config.write_text('pay_timeout = "15m"\n')
    for name, value in {
        "DUEFLOW_CONFIG_FILE": str(config),
        "DUEFLOW_ADMIN_TOKEN": "token",
        "DUEFLOW_SCREENSHOTS": "docs/img",
        "DUEFLOW_TEST_REDIS_URL": "redis://127.0.0.1:6379/13",
        "DUEFLOW_PAY_TIMEOUT": "20m",
        "dueflow_ship_timeout": "2d",  # read in any case, as the settings read it
    }.items():
        env.setenv(name, value)
    settings = load_settings()
    assert settings.pay_timeout.total_seconds() == 20 * 60
    assert settings.ship_timeout.total_seconds() == 2 * 86400


def test_every_dueflow_variable_the_code_names_is_known():
    """A variable dueflow starts reading (a setting, a command-line envvar) cannot be refused as
    unknown: each DUEFLOW_* name in src/ is a setting, one of NOT_SETTINGS or a test variable."""
    from dueflow.config import ORCHESTRATOR, known_variables

    mentioned = {
        name
        for path in (ROOT / "src").rglob("*.py")
        for name in re.findall(r"DUEFLOW_[A-Z0-9_]*[A-Z0-9]", path.read_text())
    }
    assert mentioned  # the scan found the code
    unknown = {
        n
        for n in mentioned
        if n not in known_variables()
        and not n.startswith("DUEFLOW_TEST")
        and not ORCHESTRATOR.match(n)
    }
    assert unknown == set()


@pytest.mark.parametrize(
    "args",
    [["status"], ["migrate"], ["worker"], ["scan"], ["users", "add", "x"], ["demo"]],
)
def test_every_entry_point_exits_2_with_the_hint(env, args):
    env.setenv("DUEFLOW_PAY_REMINDER", "5m")
    env.setenv("DUEFLOW_DATABASE_URL", "sqlite:///./never.db")
    result = CliRunner().invoke(cli.app, args)
    assert result.exit_code == 2, result.output
    assert "unknown setting DUEFLOW_PAY_REMINDER; did you mean DUEFLOW_REMINDER_AFTER?" in (
        result.output
    )
    assert not Path("never.db").exists()  # stopped before touching anything

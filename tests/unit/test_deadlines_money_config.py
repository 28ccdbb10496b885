"""Pure rules: durations, deadline policy, backoff, money; and the settings built from them."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from dueflow.config import Settings, load_settings
from dueflow.domain import deadlines
from dueflow.domain.deadlines import (
    DEFAULT_ORDER_TYPE,
    PROFILES,
    DeadlinePolicy,
    StageDurations,
    format_duration,
    parse_duration,
)
from dueflow.domain.money import MAX_AMOUNT, from_fen, parse_yuan, to_fen
from dueflow.domain.timers import BACKOFF_CAP, STUCK_AFTER_ATTEMPTS, backoff, is_stuck
from dueflow.exceptions import ConfigError, InvalidInput
from dueflow.store.db import Database, async_url

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)

# ---------------------------------------------------------------- parse_duration / format_duration


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30m", timedelta(minutes=30)),
        ("10s", timedelta(seconds=10)),
        ("3d", timedelta(days=3)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("250ms", timedelta(milliseconds=250)),
        ("2w", timedelta(weeks=2)),
        ("1m30s", timedelta(seconds=90)),
        ("1.5h", timedelta(minutes=90)),
        ("45", timedelta(seconds=45)),
        ("0", timedelta(0)),
        ("2.5", timedelta(seconds=2.5)),
        (" 30M ", timedelta(minutes=30)),
        ("1h 30m", timedelta(minutes=90)),
        (45, timedelta(seconds=45)),
        (1.5, timedelta(seconds=1.5)),
        (timedelta(minutes=7), timedelta(minutes=7)),
    ],
)
def test_parse_duration(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    "text", ["3x", "", "   ", "-5s", "10q", "m", "s30", "30m!", "1h-5m", "abc", "--1", True]
)
def test_parse_duration_refuses(text):
    with pytest.raises(ConfigError):
        parse_duration(text)


@pytest.mark.parametrize("value", [-5, -0.5, timedelta(seconds=-1)])
def test_parse_duration_refuses_negative_numbers(value):
    with pytest.raises(ConfigError, match="negative"):
        parse_duration(value)


@pytest.mark.parametrize(
    "value", ["99999999999d", "1" * 400, 10**20, float("nan"), float("inf"), float("-inf")]
)
def test_parse_duration_out_of_range_is_config_error(value):
    with pytest.raises(ConfigError):
        parse_duration(value)


def test_parse_duration_error_names_the_text():
    with pytest.raises(ConfigError) as info:
        parse_duration("3x")
    assert "'3x'" in info.value.message


@pytest.mark.parametrize(
    ("delta", "text"),
    [
        (timedelta(0), "0s"),
        (timedelta(seconds=45), "45s"),
        (timedelta(minutes=30), "30m"),
        (timedelta(seconds=90), "1m30s"),
        (timedelta(days=1, hours=2), "1d2h"),
        (timedelta(days=3), "3d"),
        (timedelta(days=1, seconds=1), "1d1s"),
        (timedelta(hours=1, minutes=30), "1h30m"),
    ],
)
def test_format_duration(delta, text):
    assert format_duration(delta) == text


@pytest.mark.parametrize("text", ["45s", "30m", "1h30m", "3d", "1d2h3m4s"])
def test_format_and_parse_round_trip(text):
    assert format_duration(parse_duration(text)) == text


# ---------------------------------------------------------------- DeadlinePolicy


def _policy() -> DeadlinePolicy:
    return Settings(profile="prod").deadline_policy()


def test_profiles_are_the_designed_durations():
    assert PROFILES["prod"] == StageDurations(
        reminder=timedelta(minutes=5),
        pay=timedelta(minutes=30),
        ship=timedelta(days=3),
        receive=timedelta(days=10),
        review=timedelta(days=15),
    )
    assert PROFILES["dev"] == StageDurations(
        reminder=timedelta(seconds=30),
        pay=timedelta(seconds=60),
        ship=timedelta(minutes=2),
        receive=timedelta(minutes=3),
        review=timedelta(minutes=3),
    )


def test_deadlines_count_from_the_opening_event():
    policy = _policy()
    placed = T0
    paid = T0 + timedelta(minutes=17, seconds=3)
    shipped = paid + timedelta(hours=40)
    received = shipped + timedelta(days=2, minutes=1)
    assert policy.pay_deadline("normal", placed) == placed + timedelta(minutes=30)
    assert policy.reminder_at("normal", placed) == placed + timedelta(minutes=5)
    assert policy.ship_deadline("normal", paid) == paid + timedelta(days=3)
    assert policy.receive_deadline("normal", shipped) == shipped + timedelta(days=10)
    assert policy.review_deadline("normal", received) == received + timedelta(days=15)


def test_order_type_overrides():
    policy = _policy()
    assert policy.pay_deadline("flash", T0) == T0 + timedelta(minutes=5)
    assert policy.pay_deadline("normal", T0) == T0 + timedelta(minutes=30)
    assert policy.reminder_at("flash", T0) == T0 + timedelta(minutes=2)
    # What flash does not override is the profile's.
    assert policy.ship_deadline("flash", T0) == T0 + timedelta(days=3)
    assert policy.durations("flash").review == timedelta(days=15)


def test_unknown_order_type_is_invalid_input():
    policy = _policy()
    for call in (
        policy.durations,
        lambda t: policy.pay_deadline(t, T0),
        lambda t: policy.reminder_at(t, T0),
        lambda t: policy.ship_deadline(t, T0),
    ):
        with pytest.raises(InvalidInput, match="bulk"):
            call("bulk")


@pytest.mark.parametrize(
    ("reminder", "expected"),
    [
        ("29m", T0 + timedelta(minutes=29)),
        ("30m", None),
        ("31m", None),
        ("0s", None),
    ],
)
def test_reminder_at_or_after_pay_deadline_is_none(reminder, expected):
    durations = PROFILES["prod"].override({"reminder": reminder})
    policy = DeadlinePolicy(by_type={DEFAULT_ORDER_TYPE: durations})
    assert policy.reminder_at(DEFAULT_ORDER_TYPE, T0) == expected


def test_stage_override_accepts_suffixed_names_and_refuses_unknown():
    base = PROFILES["prod"]
    changed = base.override({"pay_timeout": "10s", "reminder_after": "2s"})
    assert changed.pay == timedelta(seconds=10)
    assert changed.reminder == timedelta(seconds=2)
    assert changed.ship == base.ship
    assert base.pay == timedelta(minutes=30)  # the original is untouched
    with pytest.raises(ConfigError, match="bogus"):
        base.override({"bogus": "1s"})
    with pytest.raises(ConfigError, match="positive"):
        base.override({"pay": "0s"})
    with pytest.raises(ConfigError):
        base.override({"ship": "3x"})


# ---------------------------------------------------------------- backoff / stuck


@pytest.mark.parametrize(
    ("attempts", "seconds"),
    [(0, 30), (1, 30), (2, 60), (3, 120), (4, 240), (5, 480), (6, 600), (7, 600), (50, 600)],
)
def test_backoff(attempts, seconds):
    assert backoff(attempts) == timedelta(seconds=seconds)


def test_backoff_never_exceeds_cap_and_never_decreases():
    delays = [backoff(n) for n in range(1, 200)]
    assert max(delays) == BACKOFF_CAP == timedelta(minutes=10)
    assert delays == sorted(delays)


def test_is_stuck():
    assert STUCK_AFTER_ATTEMPTS == 5
    assert [is_stuck(n) for n in range(8)] == [False] * 5 + [True] * 3


# ---------------------------------------------------------------- money


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("12.5", Decimal("12.50")),
        ("12.50", Decimal("12.50")),
        ("0.01", Decimal("0.01")),
        (" 7 ", Decimal("7.00")),
        (7, Decimal("7.00")),
        (Decimal("3.10"), Decimal("3.10")),
        ("100000000.00", MAX_AMOUNT),
    ],
)
def test_parse_yuan(value, expected):
    parsed = parse_yuan(value)
    assert parsed == expected
    assert isinstance(parsed, Decimal)
    assert parsed.as_tuple().exponent == -2


def test_parse_yuan_equal_spellings():
    assert parse_yuan("10.0") == parse_yuan("10.00") == parse_yuan("10") == Decimal("10.00")
    assert str(parse_yuan("10.0")) == "10.00"


@pytest.mark.parametrize(
    "value",
    [
        12.5,  # floats are refused, even exact ones
        0.5,
        True,
        "1.005",  # three decimals
        "0.001",
        "12.345",
        "0",
        "0.00",
        "-1",
        "-0.01",
        "100000000.01",
        "1e2",  # plain decimal notation only: an amount reads as what it is
        "1_000",
        "+5",
        "1 000",
        ".5",
        "5.",
        "1e30",  # huge: must be refused, not overflow the decimal context
        "1" + "0" * 40,
        "NaN",
        "sNaN",
        "Infinity",
        "-Infinity",
        "",
        "abc",
        "12,50",
        "¥12",
        None,
    ],
)
def test_parse_yuan_refuses(value):
    with pytest.raises(InvalidInput):
        parse_yuan(value)


def test_parse_yuan_float_message():
    with pytest.raises(InvalidInput, match="float"):
        parse_yuan(0.1)


@pytest.mark.parametrize(
    ("amount", "fen"),
    [
        (Decimal("12.34"), 1234),
        (Decimal("0.01"), 1),
        (Decimal("10"), 1000),
        (Decimal("10.0"), 1000),
        (Decimal("100000000.00"), 10_000_000_000),
        (Decimal("0.10"), 10),
    ],
)
def test_to_fen_and_back(amount, fen):
    assert to_fen(amount) == fen
    assert isinstance(to_fen(amount), int)
    assert from_fen(fen) == amount
    assert from_fen(fen).as_tuple().exponent == -2


def test_to_fen_refuses_fractions_of_a_fen():
    with pytest.raises(InvalidInput):
        to_fen(Decimal("0.001"))
    with pytest.raises(InvalidInput):
        to_fen(Decimal("12.345"))


def test_from_fen_is_exact():
    assert from_fen(1) == Decimal("0.01")
    assert str(from_fen(1999)) == "19.99"
    # 0.1 + 0.2 in fen never drifts
    assert from_fen(to_fen(parse_yuan("0.1")) + to_fen(parse_yuan("0.2"))) == Decimal("0.30")


# ---------------------------------------------------------------- load_settings


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No DUEFLOW_* variable leaks in from the outside, and relative paths land in tmp_path."""
    for name in list(os.environ):
        if name.startswith("DUEFLOW_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return monkeypatch


def test_defaults(clean_env):
    settings = load_settings()
    assert settings.profile == "prod"
    assert settings.database_url == "sqlite:///./dueflow.db"
    assert settings.trigger_url == "db"
    assert settings.scan_interval == timedelta(seconds=60)
    policy = settings.deadline_policy()
    assert policy.durations("normal") == PROFILES["prod"]
    assert policy.pay_deadline("flash", T0) == T0 + timedelta(minutes=5)


def test_env_pay_timeout_changes_the_policy(clean_env):
    clean_env.setenv("DUEFLOW_PAY_TIMEOUT", "10s")
    settings = load_settings()
    assert settings.pay_timeout == timedelta(seconds=10)
    policy = settings.deadline_policy()
    assert policy.pay_deadline("normal", T0) == T0 + timedelta(seconds=10)
    # reminder (5 min) now comes after the pay deadline: no reminder
    assert policy.reminder_at("normal", T0) is None
    # the order type's own value still wins over the global override
    assert policy.pay_deadline("flash", T0) == T0 + timedelta(minutes=5)
    assert policy.ship_deadline("normal", T0) == T0 + timedelta(days=3)


def test_env_durations_of_each_stage(clean_env):
    clean_env.setenv("DUEFLOW_SHIP_TIMEOUT", "1h")
    clean_env.setenv("DUEFLOW_RECEIVE_TIMEOUT", "2d")
    clean_env.setenv("DUEFLOW_REVIEW_TIMEOUT", "90")
    clean_env.setenv("DUEFLOW_REMINDER_AFTER", "1m")
    durations = load_settings().deadline_policy().durations("normal")
    assert durations == StageDurations(
        reminder=timedelta(minutes=1),
        pay=timedelta(minutes=30),
        ship=timedelta(hours=1),
        receive=timedelta(days=2),
        review=timedelta(seconds=90),
    )


def test_env_dev_profile(clean_env):
    clean_env.setenv("DUEFLOW_PROFILE", "dev")
    settings = load_settings()
    assert settings.profile == "dev"
    policy = settings.deadline_policy()
    assert policy.durations("normal") == PROFILES["dev"]
    assert policy.pay_deadline("normal", T0) == T0 + timedelta(seconds=60)
    assert policy.reminder_at("normal", T0) == T0 + timedelta(seconds=30)
    assert policy.pay_deadline("flash", T0) == T0 + timedelta(seconds=20)


def test_env_unknown_profile(clean_env):
    clean_env.setenv("DUEFLOW_PROFILE", "staging")
    with pytest.raises(ConfigError, match="DUEFLOW_PROFILE"):
        load_settings()


def test_env_bad_duration_names_the_variable(clean_env):
    clean_env.setenv("DUEFLOW_PAY_TIMEOUT", "3x")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "DUEFLOW_PAY_TIMEOUT" in info.value.message
    assert "3x" in info.value.message


@pytest.mark.parametrize("value", ["99999999999d", "nan", "inf", "-5s", ""])
def test_env_unusable_duration_names_the_variable(clean_env, value):
    clean_env.setenv("DUEFLOW_SHIP_TIMEOUT", value)
    if value == "":
        # an empty optional duration means "not set": the profile's value applies
        assert load_settings().deadline_policy().durations("normal").ship == timedelta(days=3)
        return
    with pytest.raises(ConfigError, match="DUEFLOW_SHIP_TIMEOUT"):
        load_settings()


def test_env_zero_pay_timeout_refused(clean_env):
    clean_env.setenv("DUEFLOW_PAY_TIMEOUT", "0s")
    with pytest.raises(ConfigError, match="positive"):
        load_settings()


def test_env_scan_interval_must_be_positive(clean_env):
    clean_env.setenv("DUEFLOW_SCAN_INTERVAL", "0")
    with pytest.raises(ConfigError, match="DUEFLOW_SCAN_INTERVAL"):
        load_settings()


def test_env_batch_size_range(clean_env):
    clean_env.setenv("DUEFLOW_BATCH_SIZE", "0")
    with pytest.raises(ConfigError, match="DUEFLOW_BATCH_SIZE"):
        load_settings()


def test_env_order_types_json(clean_env):
    clean_env.setenv(
        "DUEFLOW_ORDER_TYPES",
        json.dumps({"normal": {"pay": "20m"}, "auction": {"pay": "2m", "reminder": "1m"}}),
    )
    policy = load_settings().deadline_policy()
    assert policy.pay_deadline("normal", T0) == T0 + timedelta(minutes=20)
    assert policy.pay_deadline("auction", T0) == T0 + timedelta(minutes=2)
    assert policy.reminder_at("auction", T0) == T0 + timedelta(minutes=1)
    # the overrides layer over the defaults: the server's own types keep theirs
    assert policy.pay_deadline("flash", T0) == T0 + timedelta(minutes=5)
    assert policy.reminder_at("flash", T0) == T0 + timedelta(minutes=2)
    assert policy.pay_deadline("shop", T0) == T0 + timedelta(minutes=15)
    assert policy.pay_deadline("ticket", T0) == T0 + timedelta(minutes=15)
    with pytest.raises(InvalidInput):
        policy.durations("bulk")


def test_env_order_types_set_one_stage_of_a_server_type(clean_env):
    clean_env.setenv("DUEFLOW_ORDER_TYPES", json.dumps({"shop": {"pay": "10s"}}))
    policy = load_settings().deadline_policy()
    assert policy.pay_deadline("shop", T0) == T0 + timedelta(seconds=10)
    # what the override does not name is the shop type's default, then the profile's
    assert policy.ship_deadline("shop", T0) == T0 + timedelta(days=3)
    assert policy.pay_deadline("flash", T0) == T0 + timedelta(minutes=5)
    assert policy.pay_deadline("normal", T0) == T0 + timedelta(minutes=30)


def test_env_order_types_without_normal_still_has_normal(clean_env):
    clean_env.setenv("DUEFLOW_ORDER_TYPES", json.dumps({"auction": {"pay": "2m"}}))
    policy = load_settings().deadline_policy()
    assert policy.durations(DEFAULT_ORDER_TYPE) == PROFILES["prod"]


def test_env_order_types_unknown_stage(clean_env):
    clean_env.setenv("DUEFLOW_ORDER_TYPES", json.dumps({"flash": {"payment": "5m"}}))
    with pytest.raises(ConfigError, match="payment"):
        load_settings()


def test_env_order_types_bad_duration(clean_env):
    clean_env.setenv("DUEFLOW_ORDER_TYPES", json.dumps({"flash": {"pay": "5x"}}))
    with pytest.raises(ConfigError, match="5x"):
        load_settings()


def test_env_order_types_not_json(clean_env):
    clean_env.setenv("DUEFLOW_ORDER_TYPES", "{not json")
    with pytest.raises(ConfigError, match="DUEFLOW_ORDER_TYPES"):
        load_settings()


def test_overrides_beat_env(clean_env):
    clean_env.setenv("DUEFLOW_PROFILE", "dev")
    settings = load_settings(profile="prod", pay_timeout="15m")
    assert settings.profile == "prod"
    assert settings.deadline_policy().pay_deadline("normal", T0) == T0 + timedelta(minutes=15)


def test_toml_file(clean_env, tmp_path):
    path = tmp_path / "dueflow.toml"
    path.write_text(
        'profile = "dev"\npay_timeout = "45s"\nbatch_size = 50\n[order_types.flash]\npay = "10s"\n'
    )
    clean_env.setenv("DUEFLOW_CONFIG_FILE", str(path))
    settings = load_settings()
    assert settings.profile == "dev"
    assert settings.batch_size == 50
    policy = settings.deadline_policy()
    assert policy.pay_deadline("normal", T0) == T0 + timedelta(seconds=45)
    assert policy.pay_deadline("flash", T0) == T0 + timedelta(seconds=10)
    assert policy.ship_deadline("normal", T0) == T0 + timedelta(minutes=2)


def test_env_beats_toml_file(clean_env, tmp_path):
    path = tmp_path / "dueflow.toml"
    path.write_text('pay_timeout = "45s"\n')
    clean_env.setenv("DUEFLOW_CONFIG_FILE", str(path))
    clean_env.setenv("DUEFLOW_PAY_TIMEOUT", "20s")
    assert load_settings().pay_timeout == timedelta(seconds=20)


def test_toml_file_with_bad_value(clean_env, tmp_path):
    path = tmp_path / "dueflow.toml"
    path.write_text('ship_timeout = "3x"\n')
    clean_env.setenv("DUEFLOW_CONFIG_FILE", str(path))
    with pytest.raises(ConfigError, match="SHIP_TIMEOUT"):
        load_settings()


def test_toml_file_with_unknown_key(clean_env, tmp_path):
    path = tmp_path / "dueflow.toml"
    path.write_text('no_such_setting = "1"\n')
    clean_env.setenv("DUEFLOW_CONFIG_FILE", str(path))
    with pytest.raises(ConfigError, match="NO_SUCH_SETTING"):
        load_settings()


def test_missing_config_file(clean_env, tmp_path):
    missing = tmp_path / "nowhere" / "dueflow.toml"
    clean_env.setenv("DUEFLOW_CONFIG_FILE", str(missing))
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "DUEFLOW_CONFIG_FILE" in info.value.message
    assert str(missing) in info.value.message


# ---------------------------------------------------------------- database URLs


@pytest.mark.parametrize(
    "url",
    [
        "not a url",
        "",
        "oracle://scott:tiger@db/orcl",
        "mongodb://localhost/dueflow",
        "sqlite://",
        "sqlite:///:memory:",
        "sqlite+aiosqlite://",
        "sqlite+aiosqlite:///:memory:",
    ],
)
def test_bad_database_url(url):
    with pytest.raises(ConfigError):
        Database.from_url(url)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("sqlite:///x.db", "sqlite+aiosqlite:///x.db"),
        ("postgresql://u:p@h/d", "postgresql+asyncpg://u:p@h/d"),
        ("postgres://u:p@h/d", "postgresql+asyncpg://u:p@h/d"),
        ("mysql://u:p@h/d", "mysql+asyncmy://u:p@h/d"),
        ("mariadb://u:p@h/d", "mysql+asyncmy://u:p@h/d"),
        ("sqlite+aiosqlite:///y.db", "sqlite+aiosqlite:///y.db"),
    ],
)
def test_async_url(url, expected):
    assert async_url(url) == expected


async def test_good_sqlite_url_builds_a_database(tmp_path):
    db = Database.from_url(f"sqlite:///{tmp_path}/sub/dir/x.db")
    try:
        assert db.dialect == "sqlite"
        assert (tmp_path / "sub" / "dir").is_dir()
    finally:
        await db.dispose()


def test_domain_imports_nothing_else_of_dueflow():
    import ast
    import inspect

    from dueflow.domain import lifecycle, money, timers

    for module in (deadlines, lifecycle, money, timers):
        tree = ast.parse(inspect.getsource(module))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and "dueflow" in node.module:
                assert node.module.startswith(("dueflow.domain", "dueflow.exceptions")), (
                    module.__name__,
                    node.module,
                )


def test_absurdly_long_durations_are_refused():
    from dueflow.domain.deadlines import parse_duration
    from dueflow.exceptions import ConfigError

    with pytest.raises(ConfigError, match="at most 3650 days"):
        parse_duration("9999999d")
    assert parse_duration("3650d").days == 3650


@pytest.mark.parametrize(
    "url", ["http://host:99999/x", "http://a b/x", "ftp://host/x", "host:8000", "http:///x"]
)
@pytest.mark.parametrize("setting", ["notifier_url", "events_webhook_url"])
def test_a_webhook_url_that_can_never_be_sent_to_is_refused_at_start(setting, url):
    """Found in review: such a URL failed on every send, outside the retry and failure counts."""
    with pytest.raises(ConfigError, match=setting.upper()):
        load_settings(**{setting: url, "events_webhook_secret": "s" * 16})


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:9000/hook", "https://hooks.example/x", "http://[::1]/h"]
)
def test_webhook_urls_that_can_be_sent_to_are_taken(url):
    settings = load_settings(events_webhook_url=url, events_webhook_secret="s" * 16)
    assert settings.events_webhook_url == url

"""Settings as an operator writes them: ``DUEFLOW_*`` variables of any value, and the URLs among
them (the database, the trigger with its query options, locks, the seat cache, the webhooks) as
the adapters read them at start. Only ConfigError comes out (the CLI prints its message and exits
2); nothing is connected to and nothing is written."""

from __future__ import annotations

import os
from unittest import mock

from hypothesis import given
from hypothesis import strategies as st

from dueflow import bootstrap
from dueflow.config import Settings, load_settings
from dueflow.exceptions import ConfigError
from dueflow.seatcache.redis import RedisSeatCache
from dueflow.store.db import async_url
from dueflow.timers import registry
from tests.unit.fuzz import any_text, fuzz_settings, mutated_text, number_text, raises_only
from tests.unit.fuzz.test_fuzz_durations import duration_texts

#: Valid URLs of each kind dueflow reads, with the query options each takes.
VALID_URLS = [
    "sqlite:///./dueflow.db",
    "postgresql://postgres@127.0.0.1:5432/dueflow",
    "mysql://root@127.0.0.1:3306/dueflow",
    "postgresql+asyncpg://u:p@[::1]:5432/d",
    "db",
    "redis://127.0.0.1:6379/0?horizon=1h&prefix=dueflow&lease=60s&batch=1000",
    "rediss://:secret@cache:6380/2?prefix=x",
    "amqp://guest:guest@127.0.0.1:5672/%2F?prefix=dueflow&horizon=2h&connect_timeout=5s",
    "amqps://u:p@mq/vh?prefetch=10&batch=5&redeliver_after=30s&heartbeat=30&queues=quorum",
    "redis://127.0.0.1:6379/0?prefix=dueflow",
    "http://127.0.0.1:8000",
    "https://hooks.example/dueflow?token=1",
    "http://[::1]:9000/events",
]
#: Pieces that break URLs in the ways parsers trip on.
BREAKERS = ["[", "]", "[::1", ":99999", ":-1", ":abc", "%", "%ff", "?batch=0", "?horizon=-1s"]
BREAKERS += ["?lease=", "?prefetch=1e3", "?prefix=", "?x=1", "://", "@", "#", "\x00", " ", "é"]
url_values = st.one_of(
    st.sampled_from(VALID_URLS),
    st.sampled_from(VALID_URLS).flatmap(mutated_text),
    st.tuples(st.sampled_from(VALID_URLS), st.sampled_from(BREAKERS)).map("".join),
    st.tuples(st.sampled_from(VALID_URLS), st.sampled_from(BREAKERS)).map(
        lambda t: t[0].replace("127.0.0.1", t[1])
    ),
    st.sampled_from(
        ["", "redis", "amqp", "redis://", "amqp://", "sqlite://", "sqlite:///:memory:"]
    ),
    any_text,
)
#: What each setting is given, by kind.
VALUES = {
    "url": url_values,
    "duration": duration_texts,
    "number": number_text,
    "text": st.one_of(any_text, st.sampled_from(["dev", "prod", "json", "webhook", "full"])),
    "json": st.one_of(
        st.sampled_from(['{"normal": {"pay": "10m"}}', '{"vip": {"pay": "1x"}}', "{", "[]"]),
        st.sampled_from(['{"normal": {"unknown": "1m"}}', '{"normal": {"pay": "0s"}}', "null"]),
        any_text,
    ),
}
KINDS = {
    "DATABASE_URL": "url",
    "TRIGGER_URL": "url",
    "LOCKS_URL": "url",
    "SEAT_CACHE_URL": "url",
    "NOTIFIER_URL": "url",
    "EVENTS_WEBHOOK_URL": "url",
    "PUBLIC_URL": "url",
    "ALIPAY_GATEWAY_URL": "url",
    "WECHATPAY_BASE_URL": "url",
    "LOCK_TTL": "duration",
    "LOCK_WAIT": "duration",
    "LEASE": "duration",
    "PAY_TIMEOUT": "duration",
    "REMINDER_AFTER": "duration",
    "SESSION_TTL": "duration",
    "SEAT_RECONCILE_INTERVAL": "duration",
    "BATCH_SIZE": "number",
    "MAX_BATCH_SIZE": "number",
    "PROVIDER_CONCURRENCY": "number",
    "NOTIFIER_MAX_DELIVERIES": "number",
    "PROFILE": "text",
    "LOG_FORMAT": "text",
    "NOTIFIER": "text",
    "SQLITE_SYNCHRONOUS": "text",
    "SESSION_SECRET": "text",
    "EVENTS_WEBHOOK_SECRET": "text",
    "ORDER_TYPES": "json",
}
#: Variable names: the settings (any case), misspellings and strangers.
names = st.one_of(
    st.sampled_from(sorted(KINDS)).map(lambda n: f"DUEFLOW_{n}"),
    st.sampled_from(["dueflow_pay_timeout", "DUEFLOW_PAY_TIMEOT", "DUEFLOW_", "DUEFLOW_X"]),
    st.from_regex(r"\ADUEFLOW_[A-Z_]{1,12}\Z"),
)


def env_value(name: str) -> st.SearchStrategy[str]:
    """A value for the variable ``name``: of its own kind mostly, of any other kind sometimes."""
    kind = KINDS.get(name.upper().removeprefix("DUEFLOW_"), "text")
    # Environment values cannot hold NUL characters.
    return st.one_of(VALUES[kind], *VALUES.values()).map(lambda v: v.replace("\x00", ""))


environments = st.dictionaries(names, st.just(""), max_size=6).flatmap(
    lambda chosen: st.fixed_dictionaries({name: env_value(name) for name in chosen})
)


def start_adapters(settings: Settings) -> None:
    """What ``bootstrap.build`` reads from the URLs, without connecting or writing anything."""
    async_url(settings.database_url)
    registry.from_url(settings.trigger_url)
    bootstrap.build_locks(settings)
    bootstrap.build_seat_cache(settings)


@fuzz_settings(150)
@given(environ=environments)
def test_any_environment_gives_settings_or_a_config_error(environ):
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("DUEFLOW_")}
    with mock.patch.dict(os.environ, {**clean, **environ}, clear=True):
        settings = raises_only((ConfigError,), load_settings)
    if settings is None:
        return
    assert isinstance(settings, Settings)
    assert settings.batch_size <= settings.max_batch_size
    raises_only((ConfigError,), lambda: start_adapters(settings))


@fuzz_settings(120)
@given(url=url_values)
def test_every_url_parser_refuses_with_a_config_error(url):
    """Each parser on its own, on any URL (not only the ones its setting would let through)."""
    raises_only((ConfigError,), lambda: async_url(url))
    raises_only((ConfigError,), lambda: registry.from_url(url))
    raises_only((ConfigError,), lambda: RedisSeatCache.from_url(url))
    for setting in ("notifier_url", "events_webhook_url", "locks_url", "seat_cache_url"):
        extra = {"events_webhook_secret": "s"} if setting == "events_webhook_url" else {}
        settings = raises_only(
            (ConfigError,), lambda s=setting, e=extra: load_settings(**{s: url}, **e)
        )
        if settings is not None:
            raises_only((ConfigError,), lambda s=settings: start_adapters(s))

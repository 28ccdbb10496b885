"""Settings: one object, built at each entry point from the environment (``DUEFLOW_*``) or a TOML
file named by ``DUEFLOW_CONFIG_FILE``, and passed in. Nothing reads the environment elsewhere.

A ``DUEFLOW_*`` variable that is no setting (a misspelling) is refused, naming the closest one:
left alone, it would silently leave the setting it meant at its default."""

from __future__ import annotations

import base64
import binascii
import difflib
import os
import re
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BeforeValidator,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from dueflow.domain import deadlines
from dueflow.domain.timers import MAX_ATTEMPTS
from dueflow.exceptions import ConfigError


def _duration(value: Any) -> timedelta:
    try:
        return deadlines.parse_duration(value)
    except ConfigError as exc:
        raise ValueError(exc.message) from None


Duration = Annotated[timedelta, BeforeValidator(_duration)]
OptionalDuration = Annotated[
    timedelta | None, BeforeValidator(lambda v: None if v in (None, "") else _duration(v))
]

DEFAULT_ORDER_TYPES: dict[str, dict[str, dict[str, str]]] = {
    "prod": {
        "normal": {},
        "ticket": {"pay": "15m"},
        "shop": {"pay": "15m"},
        "flash": {"pay": "5m", "reminder": "2m"},
    },
    "dev": {
        "normal": {},
        "ticket": {"pay": "60s"},
        "shop": {"pay": "60s"},
        "flash": {"pay": "20s", "reminder": "10s"},
    },
}
#: The order types, each picked by the server from what is bought (marketplace goods, seats,
#: SKU lines, a flash sale): always known, with their defaults unless ``order_types`` sets them.
SERVER_ORDER_TYPES = ("normal", "ticket", "shop", "flash")


class Settings(BaseSettings):
    """Everything dueflow can be told. Durations take ``30m``, ``10s``, ``3d`` or seconds."""

    model_config = SettingsConfigDict(env_prefix="DUEFLOW_", extra="forbid", frozen=True)

    database_url: str = "sqlite:///./dueflow.db"
    #: SQLite's ``PRAGMA synchronous``: NORMAL (a power cut may lose the last commits) or FULL
    #: (every commit synced to the disk before it is answered).
    sqlite_synchronous: Annotated[
        Literal["NORMAL", "FULL"], BeforeValidator(lambda v: v.upper() if isinstance(v, str) else v)
    ] = "NORMAL"
    trigger_url: str = "db"
    locks_url: str | None = None
    lock_ttl: Duration = timedelta(seconds=10)
    lock_wait: Duration = Field(default=timedelta(seconds=2), le=timedelta(seconds=4))
    #: The Redis of the seat cache (``redis://host:6379/0?prefix=dueflow``); unset: the Redis of
    #: ``locks_url`` or of a ``redis://`` trigger, and no cache without either.
    seat_cache_url: str | None = None
    #: How often the worker compares the seat cache with the database and repairs it.
    seat_reconcile_interval: Duration = timedelta(seconds=60)
    profile: Literal["dev", "prod"] = "prod"

    reminder_after: OptionalDuration = None
    pay_timeout: OptionalDuration = None
    ship_timeout: OptionalDuration = None
    receive_timeout: OptionalDuration = None
    review_timeout: OptionalDuration = None
    order_types: dict[str, dict[str, str]] | None = None

    batch_size: int = Field(default=200, ge=1, le=10_000)
    max_batch_size: int = Field(default=2000, ge=1, le=10_000)
    lease: Duration = timedelta(seconds=60)
    max_idle: Duration = timedelta(seconds=1)
    scan_interval: Duration = timedelta(seconds=60)
    scan_grace: Duration = timedelta(seconds=5)
    provider_concurrency: int = Field(default=32, ge=1, le=1000)
    #: Claimed batches one worker runs at once: a batch waiting on a provider does not hold
    #: up the next one.
    worker_batches: int = Field(default=4, ge=1, le=64)
    #: Consecutive failures of its handler after which a timer is parked for an operator (a
    #: handler's own retry, such as a refund still processing, is no failure and ends a run).
    timer_max_attempts: int = Field(default=MAX_ATTEMPTS, ge=1, le=1000)

    #: Where providers reach dueflow's notify routes (``{public_url}/notify/alipay`` ...).
    public_url: str = "http://127.0.0.1:8000"
    alipay_gateway_url: str | None = None
    alipay_app_id: str | None = None
    alipay_seller_id: str | None = None
    alipay_app_private_key: str | None = None
    alipay_public_key: str | None = None
    wechatpay_base_url: str | None = None
    wechatpay_appid: str | None = None
    wechatpay_mchid: str | None = None
    wechatpay_merchant_serial: str | None = None
    wechatpay_merchant_private_key: str | None = None
    wechatpay_public_key_id: str | None = None
    wechatpay_public_key: str | None = None
    wechatpay_api_v3_key: str | None = None

    log_format: Literal["text", "json"] = "text"
    #: ``dueflow serve``'s access log: a line a request at INFO (``off`` for none).
    access_log: bool = True

    #: Signs admin page sessions; a random one per start when unset (sessions end at restart).
    session_secret: str | None = Field(default=None, min_length=16)
    session_ttl: Duration = timedelta(hours=12)

    notifier: Literal["log", "webhook"] = "log"
    notifier_url: str | None = None
    notifier_secret: str = ""
    notifier_timeout: Duration = timedelta(seconds=5)
    #: Sends of one reminder that may each have reached the receiver (no answer) before giving up.
    notifier_max_deliveries: int = Field(default=3, ge=1, le=20)

    #: Where order events are POSTed (docs/events.md); none: the feed only.
    events_webhook_url: str | None = None
    events_webhook_secret: str = Field(default="", validate_default=True)
    #: Webhook endpoints made over the API may name private, loopback, link-local (and other
    #: non-public) addresses: for tests, examples and a host on the same network only.
    webhook_allow_private: bool = False

    @field_validator("lease", "max_idle", "scan_interval", "seat_reconcile_interval")
    @classmethod
    def _positive(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError("must be positive")
        return value

    @field_validator("notifier_url", "events_webhook_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        """A webhook URL is refused at start, not on every send: http(s), a host, a valid port."""
        if value is None:
            return None
        try:
            url = urlsplit(value)
            url.port  # noqa: B018 - a port out of range raises here
        except ValueError:
            raise ValueError("not a URL (check the port)") from None
        host = url.hostname or ""
        if url.scheme not in ("http", "https") or not host or not _HOST.fullmatch(host):
            raise ValueError("must be an http:// or https:// URL with a host")
        return value

    @field_validator("events_webhook_secret")
    @classmethod
    def _signed(cls, value: str, info: ValidationInfo) -> str:
        if info.data.get("events_webhook_url") and not value:
            raise ValueError("needed to sign what is sent to DUEFLOW_EVENTS_WEBHOOK_URL")
        return _secret(value)

    @field_validator("notifier_secret")
    @classmethod
    def _notifier_signed(cls, value: str) -> str:
        return _secret(value)

    @model_validator(mode="after")
    def _batches(self) -> Settings:
        if self.max_batch_size < self.batch_size:
            raise ValueError("max_batch_size must be at least batch_size")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = os.environ.get("DUEFLOW_CONFIG_FILE")
        if config_file:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=Path(config_file)))
        return tuple(sources)

    def deadline_policy(self) -> deadlines.DeadlinePolicy:
        """Stage durations per order type: the profile's, then the global overrides, then the type's."""
        base = deadlines.PROFILES[self.profile]
        overrides = {
            name: value
            for name, value in (
                ("reminder", self.reminder_after),
                ("pay", self.pay_timeout),
                ("ship", self.ship_timeout),
                ("receive", self.receive_timeout),
                ("review", self.review_timeout),
            )
            if value is not None
        }
        base = base.override(overrides)
        # Each type: the profile's defaults for it, then what ``order_types`` changes.
        defaults = DEFAULT_ORDER_TYPES[self.profile]
        given = self.order_types or {}
        by_type = {
            name: base.override(defaults.get(name, {})).override(given.get(name, {}))
            for name in (*SERVER_ORDER_TYPES, *given)
        }
        return deadlines.DeadlinePolicy(by_type=by_type)


def _secret(value: str) -> str:
    """A signing secret: a ``whsec_`` one must decode (any other string is the older scheme's,
    kept working: :mod:`dueflow.notifiers.signing`)."""
    if value.startswith("whsec_"):
        try:
            key = base64.b64decode(value.removeprefix("whsec_"), validate=True)
        except binascii.Error:
            raise ValueError("a whsec_ secret is whsec_ followed by base64") from None
        if len(key) < 24:
            raise ValueError("a whsec_ secret holds at least 24 bytes")
    return value


PREFIX = "DUEFLOW_"
#: ``DUEFLOW_*`` variables read by dueflow that are not settings: the settings file, the admin
#: token of ``dueflow demo --url``, and where the browser test keeps its screenshots.
NOT_SETTINGS = frozenset({"DUEFLOW_CONFIG_FILE", "DUEFLOW_ADMIN_TOKEN", "DUEFLOW_SCREENSHOTS"})
#: A host name or an IP address (IPv6 without its brackets), as a webhook URL may name it.
_HOST = re.compile(r"[A-Za-z0-9._:%-]+")
#: The test suite's own variables (its database, Redis and RabbitMQ URLs).
TEST_PREFIX = "DUEFLOW_TEST_"
#: What orchestrators put in every container's environment for a service or link named
#: ``dueflow...`` (Kubernetes service links: ``DUEFLOW_SERVICE_HOST``, ``DUEFLOW_PORT_8000_TCP``;
#: Docker links: ``DUEFLOW_NAME``, ``DUEFLOW_ENV_PATH``): not settings, never refused.
ORCHESTRATOR = re.compile(
    r"^DUEFLOW(_[A-Z0-9]+)*_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT(_\d+_(TCP|UDP|SCTP)"
    r"(_(ADDR|PORT|PROTO))?)?|NAME|ENV_[A-Z0-9_]+)$"
)


def known_variables() -> frozenset[str]:
    """Every ``DUEFLOW_*`` name dueflow reads (test variables aside), in capitals."""
    return frozenset(PREFIX + name.upper() for name in Settings.model_fields) | NOT_SETTINGS


def check_environment(environ: Mapping[str, str]) -> None:
    """Refuse ``DUEFLOW_*`` variables dueflow does not read. Names are compared in capitals,
    as the settings read them (``dueflow_pay_timeout`` sets ``pay_timeout`` too).

    Raises:
        ConfigError: naming each unknown variable and the closest known name, if any is close.
    """
    known = known_variables()
    unknown = sorted(
        name
        for name in environ
        if name.upper().startswith(PREFIX)
        and name.upper() not in known
        and not name.upper().startswith(TEST_PREFIX)
        and not ORCHESTRATOR.match(name.upper())
    )
    if unknown:
        raise ConfigError("\n".join(_unknown(name, known) for name in unknown))


def _unknown(name: str, known: frozenset[str]) -> str:
    # Compared without the prefix every name shares, which would make any two look alike.
    rest = {k.removeprefix(PREFIX): k for k in known}
    close = difflib.get_close_matches(name.upper().removeprefix(PREFIX), sorted(rest), n=1)
    shown = ascii(name)[1:-1]  # a name is any bytes: never let one break the message
    if close:
        return f"unknown setting {shown}; did you mean {rest[close[0]]}?"
    return f"unknown setting {shown}; docs/configuration.md lists the settings"


def load_settings(**overrides: Any) -> Settings:
    """Build the settings from the environment, the TOML file and ``overrides``.

    Raises:
        ConfigError: a setting is invalid, or a ``DUEFLOW_*`` variable is no setting; the
            message names it and says why.
    """
    check_environment(os.environ)
    config_file = os.environ.get("DUEFLOW_CONFIG_FILE")
    if config_file and not Path(config_file).is_file():
        raise ConfigError(f"DUEFLOW_CONFIG_FILE {config_file!r} does not exist")
    try:
        settings = Settings(**overrides)
        settings.deadline_policy()
    except ValidationError as exc:
        problems = "; ".join(
            f"DUEFLOW_{'_'.join(str(p) for p in err['loc']).upper()}: {err['msg']}"
            for err in exc.errors()
        )
        raise ConfigError(f"invalid settings: {problems}") from None
    return settings

"""The ``rabbitmq`` trigger's URL: its own query options (prefix, horizon, timeouts, counts,
the kind of queues) taken out, the rest left for aio-pika; and the URL as logs may show it."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from dueflow.domain.deadlines import parse_duration
from dueflow.exceptions import ConfigError

_OUR_OPTIONS = (
    "prefix",
    "horizon",
    "connect_timeout",
    "redeliver_after",
    "prefetch",
    "batch",
    "queues",
)
#: The kinds of queue the trigger can declare (``?queues=``); the first is the default.
QUEUE_KINDS = ("classic", "quorum")


def parse_url(url: str) -> tuple[str, dict[str, Any]]:
    """The URL for aio-pika (without our options) and the trigger's keyword options.

    Raises:
        ConfigError: Not an amqp:// URL, or a malformed option.
    """
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # an unclosed IPv6 bracket, say
        raise ConfigError(f"bad rabbitmq trigger URL {url!r}: {exc}") from None
    if parts.scheme not in ("amqp", "amqps"):
        raise ConfigError(f"not an amqp:// or amqps:// URL: {url!r}")
    ours: dict[str, str] = {}
    rest: list[tuple[str, str]] = []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key in _OUR_OPTIONS:
            ours[key] = value
        else:
            rest.append((key, value))
    options: dict[str, Any] = {}
    if "prefix" in ours:
        options["prefix"] = ours["prefix"]
    if "horizon" in ours:
        options["horizon"] = parse_duration(ours["horizon"])
    if "connect_timeout" in ours:
        options["connect_timeout"] = parse_duration(ours["connect_timeout"]).total_seconds()
    if "redeliver_after" in ours:
        options["redeliver_after"] = parse_duration(ours["redeliver_after"])
    if "queues" in ours:
        options["queues"] = queue_kind(ours["queues"])
    for name in ("prefetch", "batch"):
        if name in ours:
            options[name] = _positive_int(name, ours[name])
    return urlunsplit(parts._replace(query=urlencode(rest))), options


def safe_url(url: str) -> str:
    """``url`` with its password masked."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def queue_kind(value: str) -> str:
    """``value`` if it names a kind of queue the trigger can declare.

    Raises:
        ConfigError: it does not.
    """
    if value not in QUEUE_KINDS:
        raise ConfigError(
            f"the rabbitmq trigger's queues must be one of {', '.join(QUEUE_KINDS)}: {value!r}"
        )
    return value


def _positive_int(name: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise ConfigError(f"the rabbitmq trigger's {name} must be a positive integer: {value!r}")
    return number

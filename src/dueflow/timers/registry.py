"""Map trigger URL schemes to trigger classes."""

from __future__ import annotations

from dueflow.clock import Clock
from dueflow.exceptions import ConfigError
from dueflow.timers.base import Trigger
from dueflow.timers.db import DbTrigger
from dueflow.timers.rabbitmq import RabbitTrigger
from dueflow.timers.redis import RedisTrigger

TRIGGERS: dict[str, type[Trigger]] = {
    "db": DbTrigger,
    "redis": RedisTrigger,
    "amqp": RabbitTrigger,
    "amqps": RabbitTrigger,
}


def from_url(url: str, *, clock: Clock | None = None) -> Trigger:
    """The trigger for ``url``: ``db``, ``redis://...`` or ``amqp://...``.

    Raises:
        ConfigError: An unsupported scheme, or a URL or option the trigger refuses.
    """
    scheme = url.split("://", 1)[0] if "://" in url else url
    try:
        cls = TRIGGERS[scheme]
    except KeyError:
        known = ", ".join(sorted(TRIGGERS))
        raise ConfigError(f"unsupported trigger {url!r}; known: {known}") from None
    return cls.from_url(url, clock=clock)

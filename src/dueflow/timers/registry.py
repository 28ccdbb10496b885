"""Map trigger URL schemes to trigger classes."""

from __future__ import annotations

import importlib

from dueflow.clock import Clock
from dueflow.exceptions import ConfigError
from dueflow.timers.base import Trigger

#: Trigger classes by URL scheme, as ``module:class``: a process imports only the one its URL
#: names (the Redis and RabbitMQ clients take a while to import, and a command such as
#: ``dueflow status`` on the database trigger needs neither).
TRIGGERS: dict[str, str] = {
    "db": "dueflow.timers.db:DbTrigger",
    "redis": "dueflow.timers.redis:RedisTrigger",
    "rediss": "dueflow.timers.redis:RedisTrigger",
    "redis+cluster": "dueflow.timers.redis:RedisTrigger",
    "rediss+cluster": "dueflow.timers.redis:RedisTrigger",
    "amqp": "dueflow.timers.rabbitmq:RabbitTrigger",
    "amqps": "dueflow.timers.rabbitmq:RabbitTrigger",
}


def from_url(url: str, *, clock: Clock | None = None) -> Trigger:
    """The trigger for ``url``: ``db``, ``redis://...``, ``redis+cluster://...`` or
    ``amqp://...``.

    Raises:
        ConfigError: An unsupported scheme, or a URL or option the trigger refuses.
    """
    scheme = url.split("://", 1)[0] if "://" in url else url
    try:
        module, name = TRIGGERS[scheme].split(":")
    except KeyError:
        known = ", ".join(sorted(TRIGGERS))
        raise ConfigError(f"unsupported trigger {url!r}; known: {known}") from None
    cls: type[Trigger] = getattr(importlib.import_module(module), name)
    return cls.from_url(url, clock=clock)

"""Map trigger URL schemes to trigger classes."""

from __future__ import annotations

from dueflow.exceptions import ConfigError
from dueflow.timers.base import Trigger
from dueflow.timers.db import DbTrigger

TRIGGERS: dict[str, type[DbTrigger]] = {"db": DbTrigger}


def from_url(url: str) -> Trigger:
    """The trigger for ``url`` (``db`` today; ``redis://`` and ``amqp://`` are planned)."""
    scheme = url.split("://", 1)[0] if "://" in url else url
    try:
        cls = TRIGGERS[scheme]
    except KeyError:
        known = ", ".join(sorted(TRIGGERS))
        raise ConfigError(f"unsupported trigger {url!r}; known: {known}") from None
    return cls.from_url(url)

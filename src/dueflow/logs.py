"""Logging set-up: plain text for people, JSON lines for machines (``DUEFLOW_LOG_FORMAT=json``).

A line carries the ids it was logged with (``extra={"order_id": ...}``) and those bound around
the code that logged it (:func:`bound`): the request id of the HTTP request being served, the
timer (its id, order and trace id) a worker's handler runs for. JSON lines have them as fields
(:data:`CONTEXT_KEYS`), text lines as ``key=value`` after the message. The access log
(:data:`ACCESS`, a line a request) adds its own fields (:data:`ACCESS_KEYS`).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager
from contextvars import ContextVar, Token
from datetime import UTC, datetime
from types import MappingProxyType

from dueflow import tracing
from dueflow.exceptions import BackendUnavailable

CONTEXT_KEYS = (
    "request_id",
    "trace_id",
    "timer_kind",
    "timer_id",
    "order_id",
    "pay_no",
    "reminder_id",
    "refund_no",
)
#: The access log's logger: a line a request at INFO (``dueflow serve`` sets its level).
ACCESS = "dueflow.access"
#: The fields of an access line beside its context: the user the request was for and the
#: service key that made it (either may be None).
ACCESS_KEYS = ("method", "route", "status", "duration_ms", "user_id", "key_id")
_FIELDS = CONTEXT_KEYS + ACCESS_KEYS
# The fields bound around the code running now (a request, a timer handler's run): each task
# has its own, as asyncio copies the context into every task it starts.
_bound: ContextVar[Mapping[str, object]] = ContextVar(
    "dueflow_log_fields", default=MappingProxyType({})
)
#: Seconds between two lines of one :func:`throttled` kind: a sustained outage logs a line a
#: second (with how many it stands for), not a line, or a traceback, a request.
THROTTLE_SECONDS = 1.0
#: Kinds remembered at most; past it the memory starts again (a line more, never one fewer).
_THROTTLE_KINDS = 256
# When each kind of throttled line was last written, and how many were held back since. A
# process-wide memory, as the loggers themselves are: every request and loop shares it.
_throttled: dict[tuple[str, str], tuple[float, int]] = {}


def bound(**fields: object) -> AbstractContextManager[None]:
    """Within the block, every line logged (by this task and the tasks it starts) carries
    ``fields`` besides those bound already, unless it was logged with its own value of one
    (``extra=``). Read by :class:`ContextFilter`."""
    return _Bound(fields)


class _Bound:
    """:func:`bound`'s block, as a class: a request enters one, and a generator-based context
    manager costs several times as much."""

    __slots__ = ("fields", "token")

    def __init__(self, fields: Mapping[str, object]) -> None:
        self.fields = fields
        self.token: Token[Mapping[str, object]] | None = None

    def __enter__(self) -> None:
        self.token = _bound.set({**_bound.get(), **self.fields})

    def __exit__(self, *exc: object) -> None:
        if self.token is not None:
            _bound.reset(self.token)


class ContextFilter(logging.Filter):
    """Puts the fields :func:`bound` around the logging code on each record (a handler's
    filter: the formatters read them as record attributes)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _bound.get().items():
            if getattr(record, key, None) is None:
                setattr(record, key, value)
        if getattr(record, "trace_id", None) is None:
            # The trace of the span current where the line was logged (a request's, a timer
            # handler's): None, at the cost of one test, while tracing is off.
            record.trace_id = tracing.current_trace_id()
        return True


class TextFormatter(logging.Formatter):
    """``at LEVEL logger message key=value ...``: the context ids a record carries after its
    message."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        ids = [
            f"{key}={value}"
            for key in CONTEXT_KEYS
            if (value := getattr(record, key, None)) is not None
        ]
        return f"{line} {' '.join(ids)}" if ids else line


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "at": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in _FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                entry[key] = value
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def throttled(logger: logging.Logger, level: int, kind: str, message: str, *args: object) -> bool:
    """Log ``message % args`` unless a line of the same ``kind`` went out less than
    :data:`THROTTLE_SECONDS` ago; the next one that goes out says how many it stands for.

    Returns:
        Whether the line was written.
    """
    key = (logger.name, kind)
    now = time.monotonic()
    last, held = _throttled.get(key, (float("-inf"), 0))
    if now - last < THROTTLE_SECONDS:
        _throttled[key] = (last, held + 1)
        return False
    if len(_throttled) >= _THROTTLE_KINDS:
        _throttled.clear()
    _throttled[key] = (now, 0)
    if held:
        message += f" ({held} more like it held back)"
    logger.log(level, message, *args)
    return True


def failed(logger: logging.Logger, what: str, error: BaseException) -> None:
    """Log that ``what`` failed with ``error``: a backend that cannot be reached as a line a
    second at most (an outage fails loop after loop alike: a traceback each time says nothing
    new), anything else with its traceback."""
    if isinstance(error, BackendUnavailable):
        throttled(logger, logging.WARNING, what, "%s: %s", what, error)
    else:
        logger.error("%s", what, exc_info=error)


#: The attribute an error logged with its request's id carries (:func:`logged`).
_LOGGED = "_dueflow_logged"


def logged(error: BaseException) -> None:
    """``error`` was logged, with its request id, where it was answered: the server's own
    line of it (uvicorn's "Exception in ASGI application") is dropped (:class:`NotTwice`)."""
    setattr(error, _LOGGED, True)


class NotTwice(logging.Filter):
    """Drops a record whose error :func:`logged` already wrote down (set on uvicorn's error
    logger by :func:`configure`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not getattr(error, _LOGGED, False)


def configure(*, verbose: bool, json_lines: bool, access_log: bool = False) -> None:
    """Send dueflow's logs to standard error, as text or JSON lines; the access log's lines
    too (at INFO, verbose or not) with ``access_log``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else TextFormatter())
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    logging.getLogger(ACCESS).setLevel(logging.INFO if access_log else logging.WARNING)
    server = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, NotTwice) for f in server.filters):
        server.addFilter(NotTwice())

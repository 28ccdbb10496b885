"""Logging set-up: plain text for people, JSON lines for machines (``DUEFLOW_LOG_FORMAT=json``).

JSON lines carry the ids a record was logged with (``extra={"order_id": ...}``): order_id,
timer_id, pay_no, reminder_id, refund_no.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from datetime import UTC, datetime

from dueflow.exceptions import BackendUnavailable

CONTEXT_KEYS = ("order_id", "timer_id", "pay_no", "reminder_id", "refund_no")
#: Seconds between two lines of one :func:`throttled` kind: a sustained outage logs a line a
#: second (with how many it stands for), not a line, or a traceback, a request.
THROTTLE_SECONDS = 1.0
#: Kinds remembered at most; past it the memory starts again (a line more, never one fewer).
_THROTTLE_KINDS = 256
# When each kind of throttled line was last written, and how many were held back since. A
# process-wide memory, as the loggers themselves are: every request and loop shares it.
_throttled: dict[tuple[str, str], tuple[float, int]] = {}


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "at": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in CONTEXT_KEYS:
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


def configure(*, verbose: bool, json_lines: bool) -> None:
    """Send dueflow's logs to standard error, as text or JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    if json_lines:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO if verbose else logging.WARNING)

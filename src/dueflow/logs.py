"""Logging set-up: plain text for people, JSON lines for machines (``DUEFLOW_LOG_FORMAT=json``).

JSON lines carry the ids a record was logged with (``extra={"order_id": ...}``): order_id,
timer_id, pay_no, reminder_id, refund_no.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

CONTEXT_KEYS = ("order_id", "timer_id", "pay_no", "reminder_id", "refund_no")


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

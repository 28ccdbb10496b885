"""The soak's webhook receiver: where every reminder, order-closed notice (``/notice``) and order
event (``/events``) of the fleet arrives, recorded as it came, so that the checker counts
deliveries where they are received, not where dueflow says it sent them."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.conftest import http_receiver


class Receiver:
    """Records every POST: path, lower-cased headers, body (parsed JSON), answer, time."""

    def __init__(self) -> None:
        self.deliveries: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def on_post(self, handler: BaseHTTPRequestHandler) -> None:
        """Read the request, record it, answer 200. Recorded before the answer: the sender
        sends its next event only once answered, so the records keep the order of arrival
        (recorded after, two handler threads could append in either order)."""
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length)
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = raw.decode(errors="replace")
        # A body cut off (the sender killed mid-request) never arrived: recorded, not delivered.
        status = 200 if len(raw) == length else 400
        record = {
            "path": "/" + handler.path.rstrip("/").rsplit("/", 1)[-1],
            "headers": {k.lower(): v for k, v in handler.headers.items()},
            "body": body,
            "status": status,
            "at": datetime.now(UTC).isoformat(),
        }
        with self._lock:
            self.deliveries.append(record)
        handler.send_response(status)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    def snapshot(self) -> list[dict[str, Any]]:
        """What arrived so far."""
        with self._lock:
            return list(self.deliveries)

    def count(self, path: str) -> int:
        """How many POSTs arrived at ``path``."""
        with self._lock:
            return sum(1 for d in self.deliveries if d["path"] == path)


@contextlib.contextmanager
def receiving() -> Iterator[tuple[Receiver, str]]:
    """A running receiver and its base URL (``/notice`` and ``/events`` under it)."""
    receiver = Receiver()
    with http_receiver(receiver.on_post) as url:
        yield receiver, url.rsplit("/", 1)[0]

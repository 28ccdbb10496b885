"""The events webhook: POSTs one order event as JSON, signed as the reminders' webhook signs.

Headers: ``X-Dueflow-Timestamp`` (unix seconds), ``X-Dueflow-Signature: sha256=<hex>`` over
``timestamp + "." + body`` (:func:`dueflow.notifiers.webhook.sign`), ``X-Dueflow-Delivery``
(the event's id: the same on every retry and every replay, so receivers drop repeats by it) and
``X-Dueflow-Replay: true`` on an operator's replay.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import httpx

from dueflow.exceptions import BackendUnavailable
from dueflow.notifiers import webhook


class EventWebhook:
    """POSTs events to ``url``. Any answer but a 2xx, and any transport error, is a failed
    delivery (:class:`BackendUnavailable`): the caller tries the same event again later. A send
    whose answer was lost may have reached the receiver; it drops the repeat by its id."""

    def __init__(
        self,
        *,
        url: str,
        secret: str,
        timeout: float = 5.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.url = url
        self.secret = secret
        self._client = client or httpx.AsyncClient(timeout=timeout)

    async def deliver(self, event: Mapping[str, Any], *, replay: bool = False) -> None:
        """Send one event (its ``id`` is the delivery id).

        Raises:
            BackendUnavailable: no 2xx answer; the message says what came back instead.
        """
        body = json.dumps(event, separators=(",", ":")).encode()
        timestamp = str(int(time.time()))
        headers = {
            "Content-Type": "application/json",
            "X-Dueflow-Timestamp": timestamp,
            "X-Dueflow-Delivery": str(event["id"]),
            "X-Dueflow-Signature": webhook.sign(self.secret, timestamp, body),
        }
        if replay:
            headers["X-Dueflow-Replay"] = "true"
        try:
            response = await self._client.post(self.url, content=body, headers=headers)
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise BackendUnavailable(f"{type(exc).__name__}: {exc}") from exc
        if not 200 <= response.status_code < 300:
            raise BackendUnavailable(f"HTTP {response.status_code}")

    async def close(self) -> None:
        """Close the HTTP client."""
        await self._client.aclose()

"""The ``webhook`` notifier: POSTs each reminder as JSON, signed with HMAC-SHA256.

Headers: ``X-Dueflow-Timestamp`` (unix seconds), ``X-Dueflow-Delivery`` (the reminder id, the
same on every retry) and ``X-Dueflow-Signature: sha256=<hex>`` over ``timestamp + "." + body``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time

import httpx

from dueflow.exceptions import BackendUnavailable
from dueflow.notifiers.base import Notifier, Reminder

RETRY_DELAYS = (0.2, 1.0)


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The signature header value for ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def payload(reminder: Reminder) -> bytes:
    """The JSON body of a reminder."""
    return json.dumps(
        {
            "event": reminder.kind,
            "reminder_id": reminder.reminder_id,
            "order_id": reminder.order_id,
            "buyer_id": reminder.buyer_id,
            "amount": str(reminder.amount),
            "pay_deadline": reminder.pay_deadline.isoformat(),
        },
        separators=(",", ":"),
    ).encode()


class WebhookNotifier(Notifier):
    """POSTs reminders to ``url``; retries transport errors and 5xx, gives up on 4xx."""

    def __init__(self, *, url: str, secret: str, timeout: float = 5.0) -> None:
        self.url = url
        self.secret = secret
        self._client = httpx.AsyncClient(timeout=timeout)

    async def send(self, reminder: Reminder) -> None:
        body = payload(reminder)
        last = ""
        for delay in (*RETRY_DELAYS, None):
            timestamp = str(int(time.time()))
            headers = {
                "Content-Type": "application/json",
                "X-Dueflow-Timestamp": timestamp,
                "X-Dueflow-Delivery": str(reminder.reminder_id),
                "X-Dueflow-Signature": sign(self.secret, timestamp, body),
            }
            try:
                response = await self._client.post(self.url, content=body, headers=headers)
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code < 300:
                    return
                last = f"HTTP {response.status_code}"
                if response.status_code < 500:
                    break
            if delay is not None:
                await asyncio.sleep(delay)
        raise BackendUnavailable(
            f"webhook {self.url} refused reminder {reminder.reminder_id}: {last}"
        )

    async def close(self) -> None:
        await self._client.aclose()

"""The ``webhook`` notifier: POSTs each reminder as JSON, signed per Standard Webhooks
(:mod:`dueflow.notifiers.signing`).

``webhook-id`` is the envelope's ``id`` (``ntc_<reminder id>``): the same on every retry and
every resend, so receivers drop repeats by it. A secret of the older scheme (not ``whsec_``) also
gets the older headers: ``X-Dueflow-Timestamp``, ``X-Dueflow-Delivery`` (the bare reminder id, as
it always was, for receivers written for it) and ``X-Dueflow-Signature: sha256=<hex>`` over
``timestamp + "." + body``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from typing import Any

import httpx

from dueflow import tracing
from dueflow.domain.events import ENVELOPE_VERSION
from dueflow.exceptions import BackendUnavailable, DeliveryUnknown
from dueflow.notifiers import signing
from dueflow.notifiers.base import Notifier, Reminder

RETRY_DELAYS = (0.2, 1.0)
#: Errors raised before a whole request left: the receiver cannot have taken it, so it is safe
#: to send again. Every other transport error (a read timeout, a connection dropped while
#: waiting for the answer) may come after the receiver took the reminder.
NOT_SENT = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.UnsupportedProtocol,
    httpx.LocalProtocolError,
)


def message_id(reminder_id: int) -> str:
    """A notice's ``webhook-id`` (prefixed, so it never equals an event's ``evt_`` id at a
    receiver that takes both)."""
    return f"ntc_{reminder_id}"


def envelope_of(reminder: Reminder) -> Mapping[str, Any]:
    """What a reminder's body holds: its envelope (docs/events.md). A reminder made without one
    (by hand) gets one without the order's snapshot."""
    envelope = reminder.envelope
    if envelope is None:
        data: dict[str, Any] = {"buyer_id": reminder.buyer_id}
        if reminder.reason is not None:
            data["reason"] = reminder.reason
        else:
            data.update(amount=str(reminder.amount), pay_deadline=reminder.pay_deadline.isoformat())
        envelope = {
            "id": message_id(reminder.reminder_id),
            "type": reminder.kind,
            "version": ENVELOPE_VERSION,
            "created_at": None,
            "actor": {"type": "system", "name": "notifier"},
            "data": data,
            "order": None,
        }
    return envelope


def encoded(envelope: Mapping[str, Any]) -> bytes:
    """An envelope as the body of a POST (compact JSON)."""
    return json.dumps(envelope, separators=(",", ":")).encode()


def payload(reminder: Reminder) -> bytes:
    """The JSON body of a reminder: its envelope."""
    return encoded(envelope_of(reminder))


class WebhookNotifier(Notifier):
    """POSTs reminders to ``url``. Retries what provably did not deliver (connection refused,
    5xx), gives up on 4xx, and never repeats a request that may have reached the receiver (a
    timeout or a dropped connection after sending): that raises :class:`DeliveryUnknown`."""

    def __init__(
        self, *, url: str, secret: str, timeout: float = 5.0, max_deliveries: int = 3
    ) -> None:
        self.url = url
        self.secret = secret
        self.max_deliveries = max_deliveries
        self._client = httpx.AsyncClient(timeout=timeout)

    async def send(self, reminder: Reminder) -> None:
        # One span for every try of the notice (a child of the handler's), on every POST.
        with tracing.span(
            "webhook notice",
            kind=tracing.CLIENT,
            attributes={"dueflow.notice": reminder.kind, "dueflow.order_id": reminder.order_id},
        ):
            await self._send(reminder)

    async def _send(self, reminder: Reminder) -> None:
        envelope = envelope_of(reminder)
        body = encoded(envelope)
        msg_id = str(envelope["id"])
        last = ""
        for delay in (*RETRY_DELAYS, None):
            try:
                response = await self._client.post(
                    self.url,
                    content=body,
                    headers=self._headers(msg_id, reminder.reminder_id, body),
                )
            except NOT_SENT as exc:
                last = f"{type(exc).__name__}: {exc}"
            except httpx.HTTPError as exc:
                raise DeliveryUnknown(
                    f"webhook {self.url}: reminder {reminder.reminder_id} sent, outcome unknown: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
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

    def _headers(self, msg_id: str, reminder_id: int, body: bytes) -> dict[str, str]:
        """The signed headers: ``webhook-id`` is the envelope's id; the older
        ``X-Dueflow-Delivery`` keeps the bare reminder id; ``traceparent`` while tracing."""
        headers = signing.signed_headers(
            [self.secret], msg_id, str(reminder_id), int(time.time()), body
        )
        tracing.inject(headers)
        return headers

    async def close(self) -> None:
        await self._client.aclose()

"""Delivering the outbox: notifications POSTed to notify URLs and retried until acknowledged.

* **Alipay**: a form-encoded POST, signed with Alipay's key (``sign`` and ``sign_type`` left
  out of the string, no empty values sent). Acknowledged only by HTTP 200 with the body exactly
  ``success``. Retried after 4m, 10m, 10m, 1h, 2h, 6h and 15h, then given up.
* **WeChat Pay**: a JSON POST whose resource is encrypted with the APIv3 key, with the five
  ``Wechatpay-*`` headers signed afresh for each attempt (the body stays the same). Acknowledged
  by 200 or 204 within 5 seconds. Retried after 15s, 15s, 30s, 3m, 10m, 20m, 30m, 30m, 30m, 60m,
  3h, 3h, 3h, 6h and 6h, then given up.

Intervals are divided by the configuration's ``time_scale``. Everything is driven by the
simulator's clock: :meth:`Notifier.deliver_due` sends what is due now (tests move a
``FakeClock`` and call it), and :meth:`Notifier.run` loops over it for real use.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import datetime, timedelta
from urllib.parse import urlencode

import httpx

from dueflow import tracing
from dueflow.payments.simulator import alipay, wechatpay
from dueflow.payments.simulator.state import (
    Attempt,
    Delivery,
    Notification,
    Provider,
    SimulatorState,
)

log = logging.getLogger(__name__)

RETRY_SCHEDULES: dict[Provider, tuple[timedelta, ...]] = {
    Provider.ALIPAY: tuple(timedelta(minutes=m) for m in (4, 10, 10, 60, 120, 360, 900)),
    Provider.WECHATPAY: tuple(
        timedelta(seconds=s)
        for s in (
            15,
            15,
            30,
            180,
            600,
            1200,
            1800,
            1800,
            1800,
            3600,
            10800,
            10800,
            10800,
            21600,
            21600,
        )
    ),
}
"""The waits between attempts, in provider time (before ``time_scale``)."""

TIMEOUTS = {Provider.ALIPAY: 15.0, Provider.WECHATPAY: 5.0}
"""Seconds to wait for an answer: WeChat gives the merchant 5 s (Alipay's limit is a guess)."""

IDLE_POLL = timedelta(seconds=60)
_DETAIL_CHARS = 200


class Notifier:
    """Sends the simulator's due notifications and schedules their retries."""

    def __init__(self, state: SimulatorState) -> None:
        self._state = state

    async def deliver_due(self) -> int:
        """Send every pending notification whose attempt time has come, at once.

        Expired trades and due refunds are settled first, so their notifications go too.

        Returns:
            How many attempts were made.
        """
        self._state.advance()
        due = self._state.due_notifications(self._state.now())
        if not due:
            return 0
        for notification in due:
            notification.next_attempt_at = None  # in flight: no second round picks it up
        transport = self._state.config.transport
        async with httpx.AsyncClient(
            transport=None if transport is None else _Borrowed(transport)
        ) as client:
            await asyncio.gather(*(self._attempt(client, n) for n in due))
        return len(due)

    async def run(self) -> None:
        """Deliver notifications as they come due, until cancelled."""
        state = self._state
        while True:
            state.wake.clear()
            try:
                await self.deliver_due()
            except Exception:
                log.exception("notification delivery round failed")
            await state.clock.sleep_until(self._wake_at(), wake=state.wake)

    def retry_delay(self, provider: Provider, failures: int) -> timedelta | None:
        """How long after the ``failures``-th failed attempt the next one goes, or None."""
        schedule = RETRY_SCHEDULES[provider]
        if failures > len(schedule):
            return None
        return schedule[failures - 1] / self._state.config.time_scale

    async def _attempt(self, client: httpx.AsyncClient, notification: Notification) -> None:
        started = self._state.now()
        headers, content = self._render(notification)
        try:
            name = f"simulator notify {notification.provider.value}"
            with tracing.span(name, kind=tracing.CLIENT, root=True):
                tracing.inject(headers)
                response = await client.post(
                    notification.url,
                    content=content,
                    headers=headers,
                    timeout=TIMEOUTS[notification.provider],
                )
        except httpx.HTTPError as exc:
            self._record(notification, started, None, f"{type(exc).__name__}: {exc}")
            return
        detail = response.content[:_DETAIL_CHARS].decode("utf-8", errors="replace")
        self._record(notification, started, response, detail)

    def _render(self, notification: Notification) -> tuple[dict[str, str], bytes]:
        state = self._state
        if notification.provider is Provider.ALIPAY:
            params = alipay.notification_params(state, notification)
            form_type = "application/x-www-form-urlencoded; charset=utf-8"
            return {"Content-Type": form_type}, urlencode(params).encode("ascii")
        if notification.body is None:
            notification.body = wechatpay.notification_body(state, notification)
        headers = wechatpay.platform_headers(state, notification.body)
        headers.update({"Content-Type": "application/json", "Request-ID": uuid.uuid4().hex})
        return headers, notification.body

    def _record(
        self,
        notification: Notification,
        started: datetime,
        response: httpx.Response | None,
        detail: str,
    ) -> None:
        status = None if response is None else response.status_code
        notification.attempts.append(Attempt(at=started, status_code=status, detail=detail))
        if response is not None and _acknowledged(notification.provider, response):
            notification.delivery = Delivery.ACKNOWLEDGED
            return
        delay = self.retry_delay(notification.provider, len(notification.attempts))
        if delay is None:
            notification.delivery = Delivery.GAVE_UP
            log.warning("gave up notification %s to %s", notification.seq, notification.url)
            return
        notification.next_attempt_at = started + delay

    def _wake_at(self) -> datetime:
        now = self._state.now()
        upcoming = self._state.next_event_at()
        return min(upcoming, now + IDLE_POLL) if upcoming is not None else now + IDLE_POLL


def _acknowledged(provider: Provider, response: httpx.Response) -> bool:
    if provider is Provider.ALIPAY:
        return response.status_code == 200 and response.content == b"success"
    return response.status_code in (200, 204)


class _Borrowed(httpx.AsyncBaseTransport):
    """An injected transport lent to one client: closing the client leaves it open."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._inner.handle_async_request(request)

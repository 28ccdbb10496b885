"""The events webhook: POSTs one order event as JSON to an endpoint, signed per Standard Webhooks
(:mod:`dueflow.notifiers.signing`).

``webhook-id`` is the event's id (``evt_<seq>``): the same on every retry and every replay, so
receivers drop repeats by it; an operator's replay also carries ``Dueflow-Replay: true`` (and
``X-Dueflow-Replay: true`` beside the older headers, which a secret of the older scheme still
gets: ``X-Dueflow-Timestamp``, ``X-Dueflow-Delivery``, ``X-Dueflow-Signature``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from dueflow import tracing
from dueflow.exceptions import BackendUnavailable, UnsafeURL
from dueflow.notifiers import addresses, signing


class _Unreachable(BackendUnavailable):
    """The connection to one address failed (nothing was sent)."""


@dataclass(frozen=True)
class Target:
    """Where one endpoint's events go and how they are signed."""

    url: str
    #: The secrets that sign, newest first (two while a rotated one is still honoured).
    secrets: tuple[str, ...]
    #: Check the addresses at every send (endpoints made over the API; the one in the settings
    #: is the operator's own and is not checked).
    checked: bool = False


class EventWebhook:
    """POSTs events to a :class:`Target` (by default the one given by ``url`` and ``secret``,
    the settings' endpoint). Any answer but a 2xx, any transport error and a refused address
    are failed deliveries (:class:`BackendUnavailable`): the caller tries the same event again
    later. A send whose answer was lost may have reached the receiver; it drops the repeat by
    its id."""

    def __init__(
        self,
        *,
        url: str | None = None,
        secret: str = "",
        timeout: float = 5.0,
        client: httpx.AsyncClient | None = None,
        allow_private: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.configured = Target(url, (secret,)) if url else None
        self.allow_private = allow_private
        self._clock = clock
        self._client = client or httpx.AsyncClient(timeout=timeout)

    async def deliver(
        self, event: Mapping[str, Any], *, replay: bool = False, target: Target | None = None
    ) -> None:
        """Send one event (its ``id`` is the message id) to ``target`` (default: the
        configured one).

        Raises:
            BackendUnavailable: no 2xx answer, or the address was refused; the message says
                what came back instead.
        """
        target = target or self.configured
        if target is None:
            raise BackendUnavailable("no webhook endpoint to send to")
        body = json.dumps(event, separators=(",", ":")).encode()
        event_id = str(event["id"])
        headers = signing.signed_headers(
            target.secrets, event_id, event_id, int(self._clock()), body
        )
        tracing.inject(headers)  # the delivery's span (service/webhooks.py)
        if replay:
            headers["Dueflow-Replay"] = "true"
            if "X-Dueflow-Delivery" in headers:
                headers["X-Dueflow-Replay"] = "true"
        if not target.checked:
            await self._post(target.url, body, headers)
            return
        try:
            checked = await addresses.resolve(target.url, allow_private=self.allow_private)
        except UnsafeURL as exc:
            raise BackendUnavailable(f"refused: {exc.message}") from exc
        for n, address in enumerate(checked, 1):
            url, host, sni = addresses.pinned(target.url, address)
            try:
                await self._post(url, body, {**headers, **host}, sni_hostname=sni)
                return
            except _Unreachable:
                if n == len(checked):
                    raise  # every address refused the connection

    async def _post(
        self, url: str, body: bytes, headers: dict[str, str], sni_hostname: str | None = None
    ) -> None:
        """One POST; a 2xx answer or :class:`BackendUnavailable` (:class:`_Unreachable` when
        the connection was not made: the next address may take it)."""
        extensions = {"sni_hostname": sni_hostname} if sni_hostname else {}
        try:
            response = await self._client.post(
                url, content=body, headers=headers, extensions=extensions
            )
        except httpx.ConnectError as exc:
            raise _Unreachable(f"{type(exc).__name__}: {exc}") from exc
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise BackendUnavailable(f"{type(exc).__name__}: {exc}") from exc
        if not 200 <= response.status_code < 300:
            raise BackendUnavailable(f"HTTP {response.status_code}")

    async def close(self) -> None:
        """Close the HTTP client."""
        await self._client.aclose()

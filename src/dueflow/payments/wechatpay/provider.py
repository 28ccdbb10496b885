"""The WeChat Pay v3 provider: native (QR code) payments, close-or-query, notifications, refunds.

Every request is signed with the merchant API key (``Authorization``; in public-key mode also
``Wechatpay-Serial: PUB_KEY_ID_...``), and every answer, a 204 included, is verified against the
platform keys before anything in it is believed. An answer that fails verification is an
unknown answer, never a success.

The path signed is the request path relative to ``base_url`` (``/v3/...``), which is what the
real host sees and what the simulator checks wherever it is mounted.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import quote

import httpx
from cryptography.hazmat.primitives.asymmetric import rsa as rsa_keys

from dueflow import tracing
from dueflow.clock import Clock, SystemClock
from dueflow.exceptions import (
    ConfigError,
    MalformedNotification,
    NotificationRejected,
    ProviderUnavailable,
    WrongMerchant,
)
from dueflow.payments.base import (
    GATEWAY_TIMEOUTS,
    Attempt,
    CloseOutcome,
    NotificationEvent,
    PaymentProvider,
    PayStart,
    ProviderNotification,
    RefundOutcome,
    RefundRequest,
    RefundResult,
    StartAnswer,
    VerifiedPayment,
)
from dueflow.payments.money_wire import WECHAT_MAX_AMOUNT, parse_wechat_total, wechat_total
from dueflow.payments.wechatpay import _wire, signing
from dueflow.payments.wechatpay._wire import DESCRIPTION_BYTES, PublicKeyLike

__all__ = ["DESCRIPTION_BYTES", "MAX_NOTIFICATION_BYTES", "WechatPayProvider"]

MAX_NOTIFICATION_BYTES = 64 * 1024
NATIVE_PATH = "/v3/pay/transactions/native"
REFUNDS_PATH = "/v3/refund/domestic/refunds"
#: How far WeChat Pay's clock may be ahead of ours.
CLOCK_SKEW = timedelta(minutes=2)


class WechatPayProvider(PaymentProvider):
    """WeChat Pay API v3, native payments."""

    name = "wechatpay"
    max_amount = WECHAT_MAX_AMOUNT

    def __init__(
        self,
        *,
        base_url: str,
        appid: str,
        mchid: str,
        merchant_serial: str,
        merchant_private_key: rsa_keys.RSAPrivateKey | str | bytes,
        platform_keys: Mapping[str, PublicKeyLike],
        api_v3_key: str | bytes,
        notify_url: str,
        refund_notify_url: str | None = None,
        client: httpx.AsyncClient | None = None,
        timeout: float = 10.0,
        clock: Clock | None = None,
    ) -> None:
        """Configure the client.

        Args:
            base_url: ``https://api.mch.weixin.qq.com`` or the simulator's ``.../wechatpay``.
            appid: The app id trades are made for.
            mchid: The merchant id.
            merchant_serial: The merchant API certificate serial.
            merchant_private_key: The merchant API private key (PEM or a loaded key).
            platform_keys: Platform certificate serials or ``PUB_KEY_ID_...`` ids, each mapped to
                its public key (a loaded key, a PEM public key or a PEM certificate).
            api_v3_key: The 32-byte APIv3 key that decrypts notifications.
            notify_url: Where payment notifications go.
            refund_notify_url: Where refund notifications go (default: ``notify_url``).
            client: An HTTP client to use (not closed by :meth:`aclose`); None makes one.
            timeout: Seconds to wait for any one call.
            clock: The source of "now" for signing and verifying (default: system time).

        Raises:
            ConfigError: A key is unreadable, no platform key is given or the APIv3 key is not
                32 bytes.
        """
        self._base_url = base_url.rstrip("/")
        self._appid = appid
        self._mchid = mchid
        self._merchant_serial = merchant_serial
        self._private_key = (
            merchant_private_key
            if isinstance(merchant_private_key, rsa_keys.RSAPrivateKey)
            else signing.load_private_key(merchant_private_key)
        )
        if not platform_keys:
            raise ConfigError("WeChat Pay needs at least one platform key")
        self._keys = {serial: _wire.public_key(key) for serial, key in platform_keys.items()}
        self._public_key_id = next(
            (s for s in self._keys if s.startswith(signing.PUBLIC_KEY_ID_PREFIX)), None
        )
        raw_v3_key = api_v3_key.encode("utf-8") if isinstance(api_v3_key, str) else api_v3_key
        if len(raw_v3_key) != signing.API_V3_KEY_BYTES:
            raise ConfigError(f"the APIv3 key must be {signing.API_V3_KEY_BYTES} bytes")
        self._api_v3_key = raw_v3_key
        self._notify_url = notify_url
        self._refund_notify_url = refund_notify_url or notify_url
        self._owns_client = client is None
        self._client = client if client is not None else httpx.AsyncClient(timeout=timeout)
        self._timeout = timeout
        self._clock = clock or SystemClock()

    async def aclose(self) -> None:
        """Close the HTTP client if this provider made it."""
        if self._owns_client:
            await self._client.aclose()

    # --- payments ------------------------------------------------------------------------------

    async def start(self, attempt: Attempt, *, subject: str) -> PayStart:
        """Place a native order; the answer's ``code_url`` is what the buyer scans. The
        subject is cut to :data:`DESCRIPTION_BYTES` on a character boundary.

        Raises:
            ProviderUnavailable: No verified ``code_url`` came back.
        """
        payload = {
            "appid": self._appid,
            "mchid": self._mchid,
            "description": _wire.description(subject),
            "out_trade_no": attempt.pay_no,
            "time_expire": _wire.rfc3339(attempt.expires_at),
            "notify_url": self._notify_url,
            "amount": {"total": wechat_total(attempt.amount), "currency": "CNY"},
        }
        answer = await self._call("POST", NATIVE_PATH, payload)
        code_url = answer.body.get("code_url")
        if answer.status != 200 or not isinstance(code_url, str) or not code_url:
            raise ProviderUnavailable(
                f"wechatpay native order {attempt.pay_no}: {answer.describe()}", answered=True
            )
        return PayStart(code_url)

    async def close_or_query(self, attempt: Attempt, now: datetime) -> CloseOutcome:
        """Close the trade; unless the close clearly worked, query it and decide from that."""
        try:
            return await self._close_or_query(attempt, now)
        except Exception as exc:  # never raise: an unexpected failure is an unknown answer
            return CloseOutcome.unknown(
                f"wechatpay close/query failed: {type(exc).__name__}: {exc}"
            )

    async def _close_or_query(self, attempt: Attempt, now: datetime) -> CloseOutcome:
        path = f"/v3/pay/transactions/out-trade-no/{_wire.segment(attempt.pay_no)}"
        try:
            closed = await self._call("POST", f"{path}/close", {"mchid": self._mchid})
        except ProviderUnavailable:
            closed = None
        if closed is not None and (
            closed.status == 204 or (closed.status == 400 and closed.code == "ORDER_CLOSED")
        ):
            return CloseOutcome.closed("closed" if closed.status == 204 else "ORDER_CLOSED")
        try:
            found = await self._call("GET", f"{path}?mchid={quote(self._mchid, safe='')}")
        except ProviderUnavailable as exc:
            return CloseOutcome.unknown(f"query: {exc.message}")
        if found.status == 404 and found.code == "ORDER_NOT_EXIST":
            if attempt.start is StartAnswer.REFUSED:
                # Our one native request was answered without a code_url and created nothing:
                # no request of ours is still on its way, so this order can never be paid.
                return CloseOutcome.closed("ORDER_NOT_EXIST after a refused start")
            # A native order still in flight (or not yet placed) could appear and be paid until
            # its expiry: closed only once that has passed, with a margin for clock skew.
            if now >= attempt.expires_at + CLOCK_SKEW:
                return CloseOutcome.closed("ORDER_NOT_EXIST")
            return CloseOutcome.unknown("ORDER_NOT_EXIST before the trade's expiry")
        if found.status != 200:
            return CloseOutcome.unknown(f"query: {found.describe()}")
        if found.body.get("out_trade_no") != attempt.pay_no or found.body.get("mchid") not in (
            None,
            self._mchid,
        ):
            return CloseOutcome.unknown("query answered about another trade")
        state = found.body.get("trade_state")
        if state in ("SUCCESS", "REFUND"):
            try:
                payment = _payment(found.body)
            except MalformedNotification as exc:
                return CloseOutcome.unknown(f"query: {exc.message}")
            return CloseOutcome.paid(payment)
        if state == "CLOSED":
            return CloseOutcome.closed("CLOSED")
        return CloseOutcome.unknown(f"trade_state {state!r}")

    # --- notifications -------------------------------------------------------------------------

    def verify_notification(
        self, body: bytes, headers: Mapping[str, str], now: datetime
    ) -> ProviderNotification:
        """Verify, decrypt and read a payment or refund notification.

        Raises:
            MalformedNotification: Too large, or a field is missing or unreadable.
            StaleTimestamp: Signed 5 minutes or more away from ``now``.
            BadSignature: A probe, an unknown serial, a bad signature or a failed decryption.
            WrongMerchant: It is for another app or merchant.
        """
        if len(body) > MAX_NOTIFICATION_BYTES:
            raise MalformedNotification(f"the notification is over {MAX_NOTIFICATION_BYTES} bytes")
        signing.verify_headers(headers, body, keys=self._keys, now=now)
        resource = signing.decrypt_notification(body, self._api_v3_key)
        event_type = _wire.event_type(body)
        if resource.get("mchid") != self._mchid:
            raise WrongMerchant(f"the notification is for merchant {resource.get('mchid')!r}")
        if "appid" in resource and resource["appid"] != self._appid:
            raise WrongMerchant(f"the notification is for app {resource.get('appid')!r}")
        if event_type == "TRANSACTION.SUCCESS":
            if resource.get("appid") != self._appid:
                raise WrongMerchant("the payment notification names no or another app")
            payment = _payment(resource)
            return ProviderNotification(
                NotificationEvent.PAID,
                payment.pay_no,
                amount=payment.amount,
                provider_trade_no=payment.provider_trade_no,
                state=_wire.text(resource, "trade_state", required=False),
            )
        refund_result = _wire.REFUND_EVENTS.get(event_type)
        if refund_result is not None:
            amount = resource.get("amount")
            refunded = amount.get("refund") if isinstance(amount, dict) else None
            return ProviderNotification(
                NotificationEvent.REFUND,
                _wire.text(resource, "out_trade_no"),
                amount=None if refunded is None else parse_wechat_total(refunded),
                provider_trade_no=_wire.text(resource, "transaction_id", required=False) or None,
                refund_no=_wire.text(resource, "out_refund_no"),
                refund=RefundOutcome(refund_result, event_type),
                state=_wire.text(resource, "refund_status", required=False),
            )
        return ProviderNotification(
            NotificationEvent.OTHER,
            _wire.text(resource, "out_trade_no", required=False),
            state=event_type,
        )

    # --- refunds -------------------------------------------------------------------------------

    async def refund(self, request: RefundRequest) -> RefundOutcome:
        """Ask for a refund; the same ``refund_no`` refunds once however often it is asked."""
        payload: dict[str, Any] = {
            "out_trade_no": request.pay_no,
            "out_refund_no": request.refund_no,
            "notify_url": self._refund_notify_url,
            "amount": {
                "refund": wechat_total(request.amount),
                "total": wechat_total(request.total),
                "currency": "CNY",
            },
        }
        if request.reason:
            payload["reason"] = request.reason
        try:
            answer = await self._call("POST", REFUNDS_PATH, payload)
        except ProviderUnavailable as exc:
            return RefundOutcome(RefundResult.UNKNOWN, exc.message)
        return _wire.refund_outcome(answer, request)

    async def refund_status(self, request: RefundRequest) -> RefundOutcome:
        """Where the refund stands now, by ``refund_no``: 404 ``RESOURCE_NOT_EXISTS`` is
        :attr:`RefundResult.NOT_FOUND` (never a failure); any other error is unknown, since a
        query's error says nothing about the refund itself."""
        try:
            answer = await self._call("GET", f"{REFUNDS_PATH}/{_wire.segment(request.refund_no)}")
        except ProviderUnavailable as exc:
            return RefundOutcome(RefundResult.UNKNOWN, exc.message)
        if answer.status == 200:
            return _wire.refund_found(answer, request)
        if answer.status == 404 and answer.code == "RESOURCE_NOT_EXISTS":
            return RefundOutcome(RefundResult.NOT_FOUND, answer.describe())
        return RefundOutcome(RefundResult.UNKNOWN, answer.describe())

    # --- the wire ------------------------------------------------------------------------------

    async def _call(
        self, method: str, path: str, payload: Mapping[str, Any] | None = None
    ) -> _wire.Answer:
        """One signed call, its answer verified.

        Args:
            method: ``GET`` or ``POST``.
            path: From ``/v3/`` on, with the query string, exactly as signed and sent.
            payload: The JSON body of a POST.

        Raises:
            ProviderUnavailable: A transport error, a timeout, an answer that fails verification
                or a body that is not a JSON object.
        """
        body = (
            b""
            if payload is None
            else json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        )
        headers = {
            "Authorization": signing.authorization(
                method=method,
                url=path,
                body=body,
                mchid=self._mchid,
                serial_no=self._merchant_serial,
                private_key=self._private_key,
                timestamp=int(self._clock.now().timestamp()),
                nonce=signing.new_nonce(),
            ),
            "Accept": "application/json",
            "User-Agent": "dueflow-wechatpay",
        }
        if self._public_key_id is not None:
            headers["Wechatpay-Serial"] = self._public_key_id
        if payload is not None:
            headers["Content-Type"] = "application/json"
        where = f"wechatpay {method} {path.partition('?')[0]}"
        try:
            with tracing.span(_span_name(method, path), kind=tracing.CLIENT):
                tracing.inject(headers)
                async with asyncio.timeout(self._timeout):
                    response = await self._client.request(
                        method, self._base_url + path, content=body, headers=headers
                    )
                tracing.annotate({"http.response.status_code": response.status_code})
        except TimeoutError:
            raise ProviderUnavailable(f"{where}: no answer in {self._timeout} s") from None
        except httpx.HTTPError as exc:
            raise ProviderUnavailable(f"{where}: {type(exc).__name__}: {exc}") from None
        try:
            signing.verify_headers(
                response.headers, response.content, keys=self._keys, now=self._clock.now()
            )
        except NotificationRejected as exc:
            raise ProviderUnavailable(
                f"{where}: HTTP {response.status_code} failed verification: {exc.message}",
                answered=response.status_code not in GATEWAY_TIMEOUTS,  # a proxy's 502 page
            ) from None
        if not response.content:
            return _wire.Answer(response.status_code)
        try:
            parsed = json.loads(response.content)
        except (UnicodeDecodeError, ValueError, RecursionError):  # RecursionError: nested too deep
            parsed = None
        if not isinstance(parsed, dict):
            raise ProviderUnavailable(
                f"{where}: HTTP {response.status_code} body is not JSON", answered=True
            )
        return _wire.Answer(response.status_code, parsed)


#: The merchant's own numbers in a call's path: a span is named by the path's shape.
_NUMBERS = re.compile(r"(?<=/out-trade-no/)[^/?]+|(?<=/refunds/)[^/?]+")


def _span_name(method: str, path: str) -> str:
    """``wechatpay POST /v3/pay/transactions/out-trade-no/{no}/close``: no order's number."""
    return f"wechatpay {method} {_NUMBERS.sub('{no}', path.partition('?')[0])}"


def _payment(transaction: Mapping[str, Any]) -> VerifiedPayment:
    """The payment a Transaction object (a query answer or a notification) reports."""
    amount = transaction.get("amount")
    if not isinstance(amount, dict):
        raise MalformedNotification("amount is missing")
    if amount.get("currency", "CNY") != "CNY":
        raise MalformedNotification(f"unexpected currency {amount.get('currency')!r}")
    total: Decimal = parse_wechat_total(amount.get("total"))
    return VerifiedPayment(
        _wire.text(transaction, "out_trade_no"),
        total,
        _wire.text(transaction, "transaction_id"),
    )

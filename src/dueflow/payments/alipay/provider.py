"""The Alipay client: precreate (QR code), close-or-query, notifications and refunds.

Every OpenAPI call is a form POST of the common parameters and ``biz_content``, signed RSA2 with
the app private key (``sign_type`` signed). Every answer is verified over its raw text with the
Alipay public key before anything in it is believed; an answer that fails is provider trouble,
never a fact.

Close-or-query (``payment-protocols.md`` §2):

* close ``10000``: closed, unpaid.
* ``ACQ.TRADE_STATUS_ERROR``: the trade is no longer waiting, so query it: ``TRADE_SUCCESS`` or
  ``TRADE_FINISHED`` is paid, ``TRADE_CLOSED`` is closed, anything else unknown.
* ``ACQ.TRADE_NOT_EXIST``: a QR trade exists only once scanned, and the code stays scannable
  until it expires. Once our precreate is over (answered, :class:`StartAnswer`), the code is
  voided with ``alipay.trade.cancel``: ``10000`` (``retry_flag`` not ``Y``) is closed. While
  the precreate's answer is unknown (it may still arrive and create the code), "not found"
  proves nothing until the code has expired: closed only from ``expires_at + clock_skew`` on.
* anything else (``ACQ.SYSTEM_ERROR``, other codes, HTTP trouble, a bad signature): unknown.

Refunds: ``fund_change=Y`` succeeded, ``N`` processing (a repeated ``out_request_no``), a
definite business ``sub_code`` failed, ``ACQ.TRADE_STATUS_ERROR`` decided by asking the trade
(already refunded by Alipay's own cancel, else failed), anything else unknown. The refund query answers
``REFUND_SUCCESS`` or nothing: nothing is "not found", and the refund is requested again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import httpx

from dueflow import tracing
from dueflow.exceptions import (
    MalformedNotification,
    NotificationRejected,
    ProviderUnavailable,
    WrongMerchant,
)
from dueflow.payments import money_wire
from dueflow.payments.alipay import _wire, signing
from dueflow.payments.alipay._wire import (
    BEIJING,
    DEFINITE_REFUND_FAILURES,
    MAX_NOTIFICATION_BYTES,
    PAID_STATUSES,
    SUCCESS_CODE,
)
from dueflow.payments.base import (
    GATEWAY_TIMEOUTS,
    Attempt,
    CloseOutcome,
    CloseResult,
    PaymentProvider,
    PayStart,
    ProviderNotification,
    RefundOutcome,
    RefundRequest,
    RefundResult,
    StartAnswer,
    VerifiedPayment,
)

__all__ = ["BEIJING", "DEFINITE_REFUND_FAILURES", "MAX_NOTIFICATION_BYTES", "AlipayProvider"]

log = logging.getLogger(__name__)
#: The most a trade's ``subject`` holds, in characters.
SUBJECT_CHARS = 256


class AlipayProvider(PaymentProvider):
    """Alipay through its OpenAPI gateway (real, sandbox or the simulator)."""

    name = "alipay"
    max_amount = money_wire.ALIPAY_MAX_AMOUNT

    def __init__(
        self,
        *,
        gateway_url: str,
        app_id: str,
        seller_id: str,
        app_private_key: str,
        alipay_public_key: str,
        notify_url: str,
        client: httpx.AsyncClient | None = None,
        timeout: float = 10.0,
        clock_skew: timedelta = timedelta(minutes=2),
    ) -> None:
        """Configure the client; nothing touches the network here.

        Args:
            gateway_url: The full gateway URL, e.g. ``https://openapi.alipay.com/gateway.do``.
            app_id: Our app id; notifications naming another are refused.
            seller_id: Our seller (partner) id, ``2088...``; likewise checked on notifications.
            app_private_key: The app private key (PEM or bare base64) requests are signed with.
            alipay_public_key: The Alipay public key answers and notifications are verified with.
            notify_url: Where Alipay sends notifications for the trades we create.
            client: An HTTP client to use (not closed by :meth:`aclose`); None: our own.
            timeout: Seconds per call before giving up (the answer is then unknown).
            clock_skew: How far Alipay's clock may be ahead of ours; a trade that was never
                found counts as closed only this long after it expired.
        """
        self._gateway_url = gateway_url
        self._app_id = app_id
        self._seller_id = seller_id
        self._private_key = signing.load_private_key(app_private_key)
        self._public_key = signing.load_public_key(alipay_public_key)
        self._notify_url = notify_url
        self._owns_client = client is None
        self._client = client if client is not None else httpx.AsyncClient()
        self._timeout = timeout
        self._clock_skew = clock_skew

    async def aclose(self) -> None:
        """Close the HTTP client if we made it."""
        if self._owns_client:
            await self._client.aclose()

    # --- the port --------------------------------------------------------------------------

    async def start(self, attempt: Attempt, *, subject: str) -> PayStart:
        """``alipay.trade.precreate``: the QR code URL for the attempt. The subject is cut to
        :data:`SUBJECT_CHARS`.

        Raises:
            ProviderUnavailable: Anything but a verified ``10000`` with a ``qr_code``.
        """
        biz = {
            "out_trade_no": attempt.pay_no,
            "total_amount": money_wire.alipay_amount(attempt.amount),
            "subject": subject[:SUBJECT_CHARS],
            "time_expire": _wire.beijing(attempt.expires_at),
        }
        method = "alipay.trade.precreate"
        try:
            content = await self._call(method, biz, notify=True)
        except _wire.CallFailed as exc:
            raise ProviderUnavailable(
                f"alipay precreate {attempt.pay_no}: {exc.reason}", answered=exc.answered
            ) from None
        qr_code = content.get("qr_code")
        if content.get("code") != SUCCESS_CODE or not isinstance(qr_code, str) or not qr_code:
            raise ProviderUnavailable(
                f"alipay precreate {attempt.pay_no}: {_wire.describe(content)}", answered=True
            )
        return PayStart(qr_code)

    async def close_or_query(self, attempt: Attempt, now: datetime) -> CloseOutcome:
        """Close the trade, or find out it was paid; unknown whenever in doubt. Never raises."""
        try:
            return await self._close_or_query(attempt, now)
        except _wire.CallFailed as exc:
            return CloseOutcome.unknown(exc.reason)
        except Exception as exc:  # the contract: never raise for the provider's trouble
            return CloseOutcome.unknown(f"unexpected {type(exc).__name__}: {exc}")

    def verify_notification(
        self, body: bytes, headers: Mapping[str, str], now: datetime
    ) -> ProviderNotification:
        """Verify an async notification (form body) and say what it reports.

        Raises:
            MalformedNotification: Too big, not UTF-8 form data, a field missing or unreadable.
            BadSignature: The RSA2 signature does not verify with the Alipay public key.
            WrongMerchant: It names another app or seller.
        """
        params = _wire.parse_form(body)
        signing.verify(params, self._public_key)
        app_id, seller_id = params.get("app_id", ""), params.get("seller_id", "")
        if not app_id or not seller_id:
            raise MalformedNotification("the notification names no app_id or seller_id")
        if app_id != self._app_id:
            raise WrongMerchant(f"the notification is for app {app_id}")
        if seller_id != self._seller_id:
            raise WrongMerchant(f"the notification is for seller {seller_id}")
        return _wire.notification(params)

    async def refund(self, request: RefundRequest) -> RefundOutcome:
        """``alipay.trade.refund``, idempotent by ``out_request_no = refund_no``."""
        biz = {
            "out_trade_no": request.pay_no,
            "refund_amount": money_wire.alipay_amount(request.amount),
            "out_request_no": request.refund_no,
            "refund_reason": request.reason,
        }
        try:
            content = await self._call("alipay.trade.refund", biz)
        except _wire.CallFailed as exc:
            return RefundOutcome(RefundResult.UNKNOWN, exc.reason)
        code, sub_code = content.get("code"), content.get("sub_code")
        if code == SUCCESS_CODE:
            if content.get("fund_change") == "Y":
                return RefundOutcome(RefundResult.SUCCEEDED, "fund_change Y")
            return RefundOutcome(RefundResult.PROCESSING, "fund_change N: query the refund")
        if isinstance(sub_code, str) and sub_code in DEFINITE_REFUND_FAILURES:
            return RefundOutcome(RefundResult.FAILED, sub_code)
        if sub_code == "ACQ.TRADE_STATUS_ERROR":
            # The trade takes no refund: closed, or given back already. Ask the trade.
            return await self._status_error(request)
        return RefundOutcome(RefundResult.UNKNOWN, _wire.describe(content))

    async def refunded_on_its_own(self, request: RefundRequest) -> RefundOutcome:
        """``alipay.trade.fastpay.refund.query`` with ``out_request_no = out_trade_no``: a
        refund made without a request number of ours (the one ``alipay.trade.cancel`` makes of
        a paid trade) is found by the trade's own number (Alipay's docs)."""
        content = await self._refund_query(request.pay_no, request.pay_no)
        if isinstance(content, RefundOutcome):
            return content
        if content.get("refund_status") != "REFUND_SUCCESS":
            return RefundOutcome(RefundResult.NOT_FOUND, "alipay gave nothing back by itself")
        try:
            refunded = money_wire.parse_alipay_amount(content.get("refund_amount"))
        except NotificationRejected:
            return RefundOutcome(RefundResult.UNKNOWN, "the refund query's amount is unreadable")
        if refunded < request.amount:
            return RefundOutcome(
                RefundResult.NOT_FOUND, f"alipay gave back {refunded} by itself, not the whole"
            )
        return RefundOutcome(
            RefundResult.ALREADY_REFUNDED, f"alipay gave back {refunded} by itself (trade cancel)"
        )

    async def _status_error(self, request: RefundRequest) -> RefundOutcome:
        """A refund answered ``ACQ.TRADE_STATUS_ERROR``: already refunded by Alipay itself, or
        a definite failure (the trade takes no refund), never an answer to submit again on."""
        found = await self.refunded_on_its_own(request)
        if found.result is RefundResult.NOT_FOUND:
            return RefundOutcome(
                RefundResult.FAILED,
                f"ACQ.TRADE_STATUS_ERROR: the trade takes no refund; {found.reason}",
            )
        if found.result is RefundResult.UNKNOWN:
            return RefundOutcome(
                RefundResult.UNKNOWN, f"ACQ.TRADE_STATUS_ERROR; asking the trade: {found.reason}"
            )
        return found

    async def refund_status(self, request: RefundRequest) -> RefundOutcome:
        """``alipay.trade.fastpay.refund.query``: succeeded, or not found.

        A ``10000`` without ``refund_status`` is Alipay's "no such refund" (its docs: nothing
        found means not refunded, request the refund again with the same ``out_request_no``),
        so it is :attr:`RefundResult.NOT_FOUND`, never a failure.
        """
        content = await self._refund_query(request.pay_no, request.refund_no)
        if isinstance(content, RefundOutcome):
            return content
        if content.get("out_request_no") not in (None, request.refund_no):
            return RefundOutcome(RefundResult.UNKNOWN, "the answer is about another refund")
        if content.get("refund_status") == "REFUND_SUCCESS":
            return RefundOutcome(RefundResult.SUCCEEDED, "REFUND_SUCCESS")
        return RefundOutcome(RefundResult.NOT_FOUND, "no refund by this out_request_no")

    # --- internals -------------------------------------------------------------------------

    async def _refund_query(
        self, pay_no: str, out_request_no: str
    ) -> dict[str, Any] | RefundOutcome:
        """``alipay.trade.fastpay.refund.query`` of the trade's refund ``out_request_no``: the
        answer's content when it is a ``10000``, else the outcome to give (unknown: the call
        failed, or Alipay answered an error)."""
        biz = {"out_trade_no": pay_no, "out_request_no": out_request_no}
        try:
            content = await self._call("alipay.trade.fastpay.refund.query", biz)
        except _wire.CallFailed as exc:
            return RefundOutcome(RefundResult.UNKNOWN, exc.reason)
        if content.get("code") != SUCCESS_CODE:
            return RefundOutcome(RefundResult.UNKNOWN, _wire.describe(content))
        return content

    async def _close_or_query(self, attempt: Attempt, now: datetime) -> CloseOutcome:
        biz = {"out_trade_no": attempt.pay_no}
        content = await self._call("alipay.trade.close", biz)
        code, sub_code = content.get("code"), content.get("sub_code")
        if code == SUCCESS_CODE:
            return CloseOutcome.closed("alipay closed the trade")
        if sub_code == "ACQ.TRADE_NOT_EXIST":
            voided = CloseOutcome.unknown("ACQ.TRADE_NOT_EXIST before the code expired")
            if attempt.start is not StartAnswer.UNKNOWN:
                try:
                    voided = await self._void(attempt)
                except _wire.CallFailed as exc:
                    voided = CloseOutcome.unknown(f"cancel: {exc.reason}")
            # Whatever the void said, a code never scanned is dead once it has expired (a
            # cancel that keeps failing must not hold the order past that).
            if (
                voided.result is CloseResult.UNKNOWN
                and now >= attempt.expires_at + self._clock_skew
            ):
                return CloseOutcome.closed("never scanned and expired at alipay")
            return voided
        if sub_code != "ACQ.TRADE_STATUS_ERROR":
            return CloseOutcome.unknown(f"close: {_wire.describe(content)}")
        query = await self._call("alipay.trade.query", biz)
        if query.get("code") != SUCCESS_CODE:
            return CloseOutcome.unknown(f"query: {_wire.describe(query)}")
        if query.get("out_trade_no") not in (None, attempt.pay_no):
            return CloseOutcome.unknown(f"query answered for {query.get('out_trade_no')}")
        status = query.get("trade_status")
        if status in PAID_STATUSES:
            trade_no = query.get("trade_no")
            payment = VerifiedPayment(
                attempt.pay_no,
                money_wire.parse_alipay_amount(query.get("total_amount")),
                trade_no if isinstance(trade_no, str) and trade_no else None,
            )
            return CloseOutcome.paid(payment)
        if status == "TRADE_CLOSED":
            return CloseOutcome.closed("alipay reports TRADE_CLOSED")
        return CloseOutcome.unknown(f"query: trade_status {status}")

    async def _void(self, attempt: Attempt) -> CloseOutcome:
        """``alipay.trade.cancel`` of a QR trade nobody has scanned (close cannot reach it).

        Alipay's cancel closes an unpaid trade and refunds a paid one; ``action`` is present
        only for a trade that exists. Its use is "no clear payment result": a code whose
        trade does not exist yet. Called only once the start is over (no precreate of ours can
        still arrive) and only after close answered ``ACQ.TRADE_NOT_EXIST``, so a code being
        paid is closed or queried, never cancelled.
        """
        content = await self._call("alipay.trade.cancel", {"out_trade_no": attempt.pay_no})
        code, sub_code = content.get("code"), content.get("sub_code")
        if code == SUCCESS_CODE and content.get("retry_flag") != "Y":
            action = content.get("action") or "no trade yet"
            if action == "refund":
                # Paid in the instant between close and cancel: Alipay gave the whole trade
                # back (cancel refunds in full). The outcome carries the amount, which the
                # caller records on the attempt: its payment notification, applied after the
                # cancel, is then a discrepancy that needs no refund of ours.
                log.warning("alipay cancel of %s refunded a payment made meanwhile", attempt.pay_no)
                return CloseOutcome.closed(
                    "alipay cancel refunded a payment made meanwhile", refunded=attempt.amount
                )
            return CloseOutcome.closed(f"alipay cancelled the unscanned trade ({action})")
        if sub_code == "ACQ.TRADE_NOT_EXIST" and attempt.start is StartAnswer.REFUSED:
            return CloseOutcome.closed("never created: the precreate was refused")
        return CloseOutcome.unknown(f"cancel: {_wire.describe(content)}")

    async def _call(
        self, method: str, biz: Mapping[str, Any], *, notify: bool = False
    ) -> dict[str, Any]:
        """POST one signed call; the verified ``<method>_response`` (or ``error_response``).

        Raises:
            _wire.CallFailed: Transport trouble, a non-200 status, or an answer that fails
                verification.
        """
        params = {
            "app_id": self._app_id,
            "method": method,
            "format": "JSON",
            "charset": "utf-8",
            "sign_type": signing.SIGN_TYPE,
            "timestamp": _wire.beijing(datetime.now(BEIJING)),
            "version": "1.0",
            "biz_content": json.dumps(biz, ensure_ascii=False, separators=(",", ":")),
        }
        if notify:
            params["notify_url"] = self._notify_url
        params["sign"] = signing.sign(params, self._private_key, request=True)
        headers: dict[str, str] = {}
        try:
            with tracing.span(f"alipay {method}", kind=tracing.CLIENT):
                tracing.inject(headers)
                response = await self._client.post(
                    self._gateway_url, data=params, headers=headers, timeout=self._timeout
                )
                tracing.annotate({"http.response.status_code": response.status_code})
        except httpx.HTTPError as exc:
            raise _wire.CallFailed(f"{method}: {type(exc).__name__}: {exc}") from None
        if response.status_code != 200:
            raise _wire.CallFailed(
                f"{method}: HTTP {response.status_code}",
                answered=response.status_code not in GATEWAY_TIMEOUTS,
            )
        try:
            text = response.content.decode("utf-8")
            return signing.verify_response(text, method, self._public_key)
        except UnicodeDecodeError:
            raise _wire.CallFailed(f"{method}: the answer is not UTF-8", answered=True) from None
        except NotificationRejected as exc:
            raise _wire.CallFailed(
                f"{method}: {type(exc).__name__}: {exc.message}", answered=True
            ) from None

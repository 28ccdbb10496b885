"""WeChat Pay's wire, both ways: the fields a request carries (the description cut to its bytes,
RFC 3339 times in Beijing time, path segments, platform keys) and what a verified answer says
(its status and code, a refund's status, a notification's event type).

Private to :mod:`dueflow.payments.wechatpay.provider`, which sends the calls.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import quote

from cryptography.hazmat.primitives.asymmetric import rsa as rsa_keys

from dueflow.exceptions import MalformedNotification
from dueflow.payments.base import RefundOutcome, RefundRequest, RefundResult
from dueflow.payments.wechatpay import signing

CST = timezone(timedelta(hours=8), "CST")
#: The most a native order's ``description`` holds, in UTF-8 bytes.
DESCRIPTION_BYTES = 127

PublicKeyLike = rsa_keys.RSAPublicKey | str | bytes

REFUND_STATUS = {
    "SUCCESS": RefundResult.SUCCEEDED,
    "PROCESSING": RefundResult.PROCESSING,
    "CLOSED": RefundResult.FAILED,
    "ABNORMAL": RefundResult.FAILED,
}
REFUND_EVENTS = {
    "REFUND.SUCCESS": RefundResult.SUCCEEDED,
    "REFUND.ABNORMAL": RefundResult.FAILED,
    "REFUND.CLOSED": RefundResult.FAILED,
}
# 4xx codes that say nothing about the refund itself: the request was not processed.
_NOT_DEFINITE = {"SIGN_ERROR", "SYSTEM_ERROR", "FREQUENCY_LIMITED", "FREQUENCY_LIMIT_EXCEED"}


@dataclass(frozen=True)
class Answer:
    """A verified answer: its status and JSON object body (empty for a 204)."""

    status: int
    body: Mapping[str, Any] = field(default_factory=dict)

    @property
    def code(self) -> str:
        code = self.body.get("code")
        return code if isinstance(code, str) else ""

    def describe(self) -> str:
        message = self.body.get("message")
        text = f"HTTP {self.status}"
        if self.code:
            text += f" {self.code}"
        if isinstance(message, str) and message:
            text += f": {message}"
        return text


def public_key(key: PublicKeyLike) -> rsa_keys.RSAPublicKey:
    if isinstance(key, rsa_keys.RSAPublicKey):
        return key
    text = key.decode("ascii", errors="replace") if isinstance(key, bytes) else key
    if "BEGIN CERTIFICATE" in text:
        return signing.certificate_key(key)[1]
    return signing.load_public_key(key)


def description(subject: str) -> str:
    """The subject cut to what ``description`` holds, never inside a character."""
    cut = subject.encode("utf-8")[:DESCRIPTION_BYTES]
    return cut.decode("utf-8", errors="ignore")  # drops a character cut in half at the end


def rfc3339(when: datetime) -> str:
    if when.tzinfo is None:
        raise ValueError("expires_at must be timezone-aware")
    return when.astimezone(CST).isoformat(timespec="seconds")


def segment(value: str) -> str:
    return quote(value, safe="")


def text(fields: Mapping[str, Any], name: str, *, required: bool = True) -> str:
    value = fields.get(name)
    if isinstance(value, str) and value:
        return value
    if required:
        raise MalformedNotification(f"{name} is missing")
    return ""


def event_type(body: bytes) -> str:
    """The envelope's ``event_type`` (the body already verified and decrypted)."""
    try:
        envelope = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        raise MalformedNotification("the notification body is not JSON") from None
    event = envelope.get("event_type") if isinstance(envelope, dict) else None
    if not isinstance(event, str) or not event:
        raise MalformedNotification("event_type is missing")
    return event


def refund_found(answer: Answer, request: RefundRequest) -> RefundOutcome:
    """A 200 Refund object: its ``status``, if it is about this refund."""
    result = REFUND_STATUS.get(str(answer.body.get("status")))
    if answer.body.get("out_refund_no") != request.refund_no:
        return RefundOutcome(RefundResult.UNKNOWN, "the answer is about another refund")
    if result is None:
        return RefundOutcome(
            RefundResult.UNKNOWN, f"unexpected refund status {answer.body.get('status')!r}"
        )
    return RefundOutcome(result, str(answer.body.get("status")))


def refund_outcome(answer: Answer, request: RefundRequest) -> RefundOutcome:
    """The answer to a refund request: a definite business error (a 4xx with a code that is
    not about the request's own trouble) failed it; anything unclear is unknown."""
    if answer.status == 200:
        return refund_found(answer, request)
    if (
        400 <= answer.status < 500
        and answer.status not in (401, 429)
        and answer.code
        and answer.code not in _NOT_DEFINITE
    ):
        return RefundOutcome(RefundResult.FAILED, answer.describe())
    return RefundOutcome(RefundResult.UNKNOWN, answer.describe())

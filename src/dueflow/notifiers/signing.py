"""How every outgoing webhook is signed: the Standard Webhooks scheme
(https://www.standardwebhooks.com), so a host verifies it with that project's libraries.

Three headers: ``webhook-id`` (the message's id: the same on every retry of it),
``webhook-timestamp`` (unix seconds when this try was sent) and ``webhook-signature``: one or more
``v1,<base64 of HMAC-SHA256 over "id.timestamp.body">``, separated by spaces (one per secret that
signs: two while a rotated endpoint's old secret is still honoured).

A secret is ``whsec_`` and the base64 of its key bytes. A secret set before this scheme (any other
string in ``DUEFLOW_EVENTS_WEBHOOK_SECRET`` or ``DUEFLOW_NOTIFIER_SECRET``) keeps working: its
UTF-8 bytes are the key (a host passes them to the library as bytes), and such a deployment also
gets today's ``X-Dueflow-*`` headers (:func:`legacy_headers`), so a receiver written for them goes
on verifying until it moves to the standard ones.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Sequence

PREFIX = "whsec_"
#: Key bytes of a new secret (the scheme asks for 24 to 64).
KEY_BYTES = 32


def new_secret() -> str:
    """A fresh random ``whsec_`` secret."""
    return PREFIX + base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode()


def is_standard(secret: str) -> bool:
    """The secret is a ``whsec_`` one (else a secret of the older scheme)."""
    return secret.startswith(PREFIX)


def key_of(secret: str) -> bytes:
    """The HMAC key of a secret: a ``whsec_`` one's decoded bytes, any other's UTF-8 bytes.

    Raises:
        ValueError: a ``whsec_`` secret whose rest is not base64.
    """
    if not is_standard(secret):
        return secret.encode()
    try:
        return base64.b64decode(secret.removeprefix(PREFIX), validate=True)
    except binascii.Error:
        raise ValueError("a whsec_ secret is whsec_ and base64") from None


def signature(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """One ``v1,<base64>`` signature of ``body`` sent as ``msg_id`` at ``timestamp``."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def headers(secrets_: Sequence[str], msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers, signed by every secret in ``secrets_`` (newest
    first)."""
    signatures = " ".join(signature(key_of(s), msg_id, timestamp, body) for s in secrets_)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signatures,
    }


def legacy_signature(secret: str, timestamp: str, body: bytes) -> str:
    """The older scheme's ``sha256=<hex>`` over ``timestamp + "." + body``."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def legacy_headers(secret: str, delivery: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The older scheme's headers (``X-Dueflow-Timestamp``, ``X-Dueflow-Delivery``,
    ``X-Dueflow-Signature``), sent beside the standard ones while the secret is not a
    ``whsec_`` one."""
    return {
        "X-Dueflow-Timestamp": str(timestamp),
        "X-Dueflow-Delivery": delivery,
        "X-Dueflow-Signature": legacy_signature(secret, str(timestamp), body),
    }


def signed_headers(
    secrets_: Sequence[str], msg_id: str, legacy_id: str, timestamp: int, body: bytes
) -> dict[str, str]:
    """What a webhook POST carries: its content type, the standard headers and, for a secret of
    the older scheme, the older headers too (``legacy_id`` is their delivery id)."""
    found = {"Content-Type": "application/json", **headers(secrets_, msg_id, timestamp, body)}
    if secrets_ and not is_standard(secrets_[0]):
        found.update(legacy_headers(secrets_[0], legacy_id, timestamp, body))
    return found

"""WeChat Pay v3: SHA256withRSA signatures, the 5-minute window and AES-256-GCM resources.

* **Requests** carry ``Authorization: WECHATPAY2-SHA256-RSA2048 mchid=..,nonce_str=..,
  signature=..,timestamp=..,serial_no=..``, signed with the merchant API key over
  ``METHOD\\nPATH?QUERY\\ntimestamp\\nnonce\\nbody\\n``.
* **Notifications and responses** carry ``Wechatpay-Timestamp``, ``-Nonce``, ``-Signature``,
  ``-Serial`` and ``-Signature-Type``; the signature covers ``timestamp\\nnonce\\nbody\\n`` over
  the raw body, with the platform certificate or the ``PUB_KEY_ID_...`` public key that the serial
  names. A timestamp 300 s or more away from now is refused (as the official Go SDK does), and so
  is a ``WECHATPAY/SIGNTEST/`` probe signature.
* **Resources** in notifications are AES-256-GCM encrypted with the 32-byte APIv3 key; the
  base64 ciphertext ends with the 16-byte tag.
"""

from __future__ import annotations

import re
import secrets
import string
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa as rsa_keys

from dueflow.exceptions import (
    BadSignature,
    ConfigError,
    MalformedNotification,
    StaleTimestamp,
)
from dueflow.payments import rsa
from dueflow.payments.rsa import KeyPair, generate_keypair, load_private_key, load_public_key
from dueflow.payments.wechatpay._resources import (
    API_V3_KEY_BYTES,
    RESOURCE_ALGORITHM,
    Body,
    decrypt_notification,
    decrypt_resource,
    encrypt_resource,
    raw_bytes,
)

__all__ = [
    "API_V3_KEY_BYTES",
    "PROBE_PREFIX",
    "PUBLIC_KEY_ID_PREFIX",
    "RESOURCE_ALGORITHM",
    "SIGNATURE_TYPE",
    "TIMESTAMP_WINDOW_SECONDS",
    "Authorization",
    "Body",
    "KeyPair",
    "authorization",
    "certificate_key",
    "check_timestamp",
    "decrypt_notification",
    "decrypt_resource",
    "encrypt_resource",
    "generate_keypair",
    "load_private_key",
    "load_public_key",
    "message",
    "new_nonce",
    "parse_authorization",
    "request_message",
    "select_key",
    "sign_message",
    "signed_headers",
    "verify_authorization",
    "verify_headers",
    "verify_signature",
]

SIGNATURE_TYPE = "WECHATPAY2-SHA256-RSA2048"
PROBE_PREFIX = "WECHATPAY/SIGNTEST/"
PUBLIC_KEY_ID_PREFIX = "PUB_KEY_ID_"
TIMESTAMP_WINDOW_SECONDS = 300
_AUTH_FIELD = re.compile(r'(\w+)="([^"]*)"')
_AUTH_FIELDS = ("mchid", "nonce_str", "signature", "timestamp", "serial_no")
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
_NONCE_ALPHABET = string.ascii_uppercase + string.digits


@dataclass(frozen=True)
class Authorization:
    """The fields of a request's ``Authorization`` header."""

    mchid: str
    nonce_str: str
    signature: str
    timestamp: str
    serial_no: str


def new_nonce(length: int = 32) -> str:
    """A random nonce of upper-case letters and digits (use 12 for a resource's GCM nonce)."""
    return "".join(secrets.choice(_NONCE_ALPHABET) for _ in range(length))


def message(timestamp: str, nonce: str, body: Body) -> bytes:
    """What a notification or response signature covers: ``timestamp\\nnonce\\nbody\\n``."""
    return f"{timestamp}\n{nonce}\n".encode() + raw_bytes(body) + b"\n"


def request_message(method: str, url: str, timestamp: str, nonce: str, body: Body) -> bytes:
    """What a request signature covers: ``METHOD\\nPATH?QUERY\\ntimestamp\\nnonce\\nbody\\n``."""
    return f"{method.upper()}\n{url}\n".encode() + message(timestamp, nonce, body)


def authorization(
    *,
    method: str,
    url: str,
    body: Body,
    mchid: str,
    serial_no: str,
    private_key: rsa_keys.RSAPrivateKey,
    timestamp: int,
    nonce: str,
) -> str:
    """The ``Authorization`` header value of a merchant request.

    Args:
        method: The HTTP method.
        url: The path with its query string, e.g. ``/v3/pay/transactions/out-trade-no/P1?mchid=1``.
        body: The exact body sent (empty for GET).
        mchid: The merchant id.
        serial_no: The serial of the merchant API certificate.
        private_key: The merchant API private key.
        timestamp: Unix seconds.
        nonce: A fresh random string (:func:`new_nonce`).

    Returns:
        ``WECHATPAY2-SHA256-RSA2048 mchid="..",nonce_str="..",signature="..",timestamp="..",serial_no=".."``.
    """
    signed = request_message(method, url, str(timestamp), nonce, body)
    signature = rsa.sign_sha256(private_key, signed)
    return (
        f'{SIGNATURE_TYPE} mchid="{mchid}",nonce_str="{nonce}",signature="{signature}",'
        f'timestamp="{timestamp}",serial_no="{serial_no}"'
    )


def parse_authorization(header: str) -> Authorization:
    """The fields of an ``Authorization`` header.

    Raises:
        MalformedNotification: Another scheme, or a field is missing.
    """
    scheme, _, rest = header.strip().partition(" ")
    if scheme != SIGNATURE_TYPE:
        raise MalformedNotification(f"unsupported authorization scheme {scheme!r}")
    fields = dict(_AUTH_FIELD.findall(rest))
    missing = [name for name in _AUTH_FIELDS if not fields.get(name)]
    if missing:
        raise MalformedNotification(f"authorization lacks {', '.join(missing)}")
    return Authorization(**{name: fields[name] for name in _AUTH_FIELDS})


def verify_authorization(
    header: str,
    *,
    method: str,
    url: str,
    body: Body,
    public_key: rsa_keys.RSAPublicKey,
    now: datetime,
) -> Authorization:
    """Check a merchant request's ``Authorization`` (the gateway's side, for the simulator).

    Raises:
        MalformedNotification: The header is unreadable.
        StaleTimestamp: Its timestamp is 5 minutes or more away from ``now``.
        BadSignature: The signature does not match.
    """
    auth = parse_authorization(header)
    check_timestamp(auth.timestamp, now)
    signed = request_message(method, url, auth.timestamp, auth.nonce_str, body)
    if not rsa.verify_sha256(public_key, signed, auth.signature):
        raise BadSignature("the request signature does not match")
    return auth


def sign_message(
    timestamp: str, nonce: str, body: Body, private_key: rsa_keys.RSAPrivateKey
) -> str:
    """The ``Wechatpay-Signature`` of a notification or response (the platform's side)."""
    return rsa.sign_sha256(private_key, message(timestamp, nonce, body))


def signed_headers(
    body: Body,
    *,
    serial: str,
    private_key: rsa_keys.RSAPrivateKey,
    timestamp: int,
    nonce: str,
) -> dict[str, str]:
    """The five ``Wechatpay-*`` headers the platform sends with ``body`` (for the simulator)."""
    return {
        "Wechatpay-Timestamp": str(timestamp),
        "Wechatpay-Nonce": nonce,
        "Wechatpay-Signature": sign_message(str(timestamp), nonce, body, private_key),
        "Wechatpay-Serial": serial,
        "Wechatpay-Signature-Type": SIGNATURE_TYPE,
    }


def verify_signature(
    timestamp: str, nonce: str, body: Body, signature: str, public_key: rsa_keys.RSAPublicKey
) -> None:
    """Verify a notification or response signature over ``timestamp\\nnonce\\nbody\\n``.

    Args:
        timestamp: ``Wechatpay-Timestamp``.
        nonce: ``Wechatpay-Nonce``.
        body: The raw body, never re-serialised.
        signature: ``Wechatpay-Signature`` (base64).
        public_key: The key that ``Wechatpay-Serial`` names.

    Raises:
        BadSignature: A ``WECHATPAY/SIGNTEST/`` probe, or the signature does not match.
    """
    if signature.startswith(PROBE_PREFIX):
        raise BadSignature("a WECHATPAY/SIGNTEST/ probe signature")
    if not rsa.verify_sha256(public_key, message(timestamp, nonce, body), signature):
        raise BadSignature()


def check_timestamp(timestamp: str, now: datetime) -> None:
    """Refuse a timestamp 300 s or more before or after ``now``.

    Args:
        timestamp: Unix seconds as sent.
        now: The current time, timezone-aware.

    Raises:
        MalformedNotification: The timestamp is not a number of seconds.
        StaleTimestamp: It is outside the window.
    """
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    if not _TIMESTAMP.fullmatch(timestamp):
        raise MalformedNotification(f"bad timestamp {timestamp!r}")
    skew = abs(int(now.timestamp()) - int(timestamp))
    if skew >= TIMESTAMP_WINDOW_SECONDS:
        raise StaleTimestamp(f"timestamp {timestamp} is {skew} s away from now")


def certificate_key(pem: str | bytes) -> tuple[str, rsa_keys.RSAPublicKey]:
    """The serial (upper-case hex) and RSA public key of a platform certificate.

    Raises:
        ConfigError: Not a PEM certificate with an RSA key.
    """
    try:
        cert = x509.load_pem_x509_certificate(pem.encode("ascii") if isinstance(pem, str) else pem)
    except ValueError as exc:
        raise ConfigError(f"not a PEM certificate: {exc}") from None
    key = cert.public_key()
    if not isinstance(key, rsa_keys.RSAPublicKey):
        raise ConfigError("the platform certificate's key is not RSA")
    return f"{cert.serial_number:X}", key


def select_key(keys: Mapping[str, rsa_keys.RSAPublicKey], serial: str) -> rsa_keys.RSAPublicKey:
    """The verification key that ``Wechatpay-Serial`` names.

    Args:
        keys: Platform certificate serials (hex, any case, leading zeros optional) and
            ``PUB_KEY_ID_...`` ids, each mapped to its public key.
        serial: The ``Wechatpay-Serial`` header.

    Raises:
        BadSignature: No key has that serial (never fetched: no network here).
    """
    wanted = _serial_id(serial)
    for known, key in keys.items():
        if _serial_id(known) == wanted:
            return key
    raise BadSignature(f"no verification key for serial {serial!r}")


def verify_headers(
    headers: Mapping[str, str],
    body: Body,
    *,
    keys: Mapping[str, rsa_keys.RSAPublicKey],
    now: datetime,
) -> None:
    """Verify a notification or response body against its ``Wechatpay-*`` headers.

    Args:
        headers: The HTTP headers (names in any case).
        body: The raw body.
        keys: The verification keys by serial (see :func:`select_key`).
        now: The current time, timezone-aware.

    Raises:
        MalformedNotification: A header is missing or the signature type is not RSA2048.
        StaleTimestamp: The timestamp is outside the 5-minute window.
        BadSignature: A probe, an unknown serial or a signature that does not match.
    """
    fields = _wechatpay_headers(headers)
    if fields["signature-type"] != SIGNATURE_TYPE:
        raise MalformedNotification(f"unsupported signature type {fields['signature-type']!r}")
    check_timestamp(fields["timestamp"], now)
    key = select_key(keys, fields["serial"])
    verify_signature(fields["timestamp"], fields["nonce"], body, fields["signature"], key)


def _serial_id(serial: str) -> str:
    """Compare platform certificate serials as numbers, public key ids exactly."""
    serial = serial.strip()
    if serial.startswith(PUBLIC_KEY_ID_PREFIX):
        return serial
    try:
        return f"{int(serial, 16):X}"
    except ValueError:
        return serial


def _wechatpay_headers(headers: Mapping[str, str]) -> dict[str, str]:
    lowered = {name.lower(): value for name, value in headers.items()}
    fields: dict[str, str] = {}
    for name in ("timestamp", "nonce", "signature", "serial", "signature-type"):
        value = lowered.get(f"wechatpay-{name}", "").strip()
        if not value:
            raise MalformedNotification(f"missing header Wechatpay-{name.title()}")
        fields[name] = value
    return fields

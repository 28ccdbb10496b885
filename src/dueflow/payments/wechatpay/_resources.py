"""WeChat Pay v3 resources: the AES-256-GCM encrypted ``resource`` of a notification, sealed
with the merchant's 32-byte APIv3 key (the base64 ciphertext ends with the 16-byte tag).

Private to :mod:`dueflow.payments.wechatpay.signing`, which re-exports what is public here.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from dueflow.exceptions import BadSignature, ConfigError, MalformedNotification

RESOURCE_ALGORITHM = "AEAD_AES_256_GCM"
API_V3_KEY_BYTES = 32
Body = bytes | str


def encrypt_resource(
    api_v3_key: str | bytes, nonce: str, associated_data: str, plaintext: bytes
) -> str:
    """AES-256-GCM encrypt a resource as WeChat Pay does (for the simulator).

    Returns:
        Base64 of the ciphertext followed by the 16-byte tag.
    """
    sealed = _aesgcm(api_v3_key).encrypt(
        nonce.encode("utf-8"), plaintext, associated_data.encode("utf-8")
    )
    return base64.b64encode(sealed).decode("ascii")


def decrypt_resource(
    api_v3_key: str | bytes, nonce: str, associated_data: str, ciphertext_b64: str
) -> bytes:
    """AES-256-GCM decrypt a notification's resource.

    Args:
        api_v3_key: The merchant's 32-byte APIv3 key.
        nonce: ``resource.nonce`` (12 characters).
        associated_data: ``resource.associated_data`` (may be empty).
        ciphertext_b64: ``resource.ciphertext``: base64 of ciphertext and tag.

    Raises:
        ConfigError: The APIv3 key is not 32 bytes.
        MalformedNotification: The ciphertext is not base64 or the nonce is unusable.
        BadSignature: Authentication failed: wrong tag, key, nonce or associated data.
    """
    try:
        sealed = base64.b64decode(ciphertext_b64, validate=True)
        return _aesgcm(api_v3_key).decrypt(
            nonce.encode("utf-8"), sealed, associated_data.encode("utf-8")
        )
    except InvalidTag:
        raise BadSignature("the resource failed authenticated decryption") from None
    except (binascii.Error, ValueError) as exc:
        raise MalformedNotification(f"unreadable resource: {exc}") from None


def decrypt_notification(body: Body, api_v3_key: str | bytes) -> dict[str, Any]:
    """The decrypted ``resource`` of a verified notification body, as a JSON object.

    Raises:
        MalformedNotification: Not an encrypted-resource notification, or the plaintext is not
            a JSON object.
        BadSignature: The resource failed authenticated decryption.
    """
    resource = _resource(body)
    plaintext = decrypt_resource(
        api_v3_key,
        _text_field(resource, "nonce"),
        _text_field(resource, "associated_data", required=False),
        _text_field(resource, "ciphertext"),
    )
    return _json_object(plaintext, "the decrypted resource")


def raw_bytes(body: Body) -> bytes:
    """The body as bytes (a text body in UTF-8)."""
    return body.encode("utf-8") if isinstance(body, str) else body


def _aesgcm(api_v3_key: str | bytes) -> AESGCM:
    key = api_v3_key.encode("utf-8") if isinstance(api_v3_key, str) else api_v3_key
    if len(key) != API_V3_KEY_BYTES:
        raise ConfigError(f"the APIv3 key must be {API_V3_KEY_BYTES} bytes, not {len(key)}")
    return AESGCM(key)


def _resource(body: Body) -> dict[str, Any]:
    notification = _json_object(raw_bytes(body), "the notification body")
    if notification.get("resource_type") != "encrypt-resource":
        raise MalformedNotification("the notification has no encrypted resource")
    resource = notification.get("resource")
    if not isinstance(resource, dict):
        raise MalformedNotification("the notification's resource is not an object")
    if resource.get("algorithm") != RESOURCE_ALGORITHM:
        raise MalformedNotification(f"unsupported algorithm {resource.get('algorithm')!r}")
    return resource


def _text_field(resource: Mapping[str, Any], name: str, *, required: bool = True) -> str:
    value = resource.get(name)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise MalformedNotification(f"resource.{name} is missing")
    return value


def _json_object(raw: bytes, what: str) -> dict[str, Any]:
    try:
        parsed = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError):  # RecursionError: nested too deep
        raise MalformedNotification(f"{what} is not JSON") from None
    if not isinstance(parsed, dict):
        raise MalformedNotification(f"{what} is not a JSON object")
    return parsed

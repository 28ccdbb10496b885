"""Alipay RSA2: SHA256withRSA (PKCS#1 v1.5) over sorted ``key=value`` pairs.

Three messages are signed, each its own way:

* **Async notifications** (Alipay signs, we verify with the *Alipay* public key): every
  parameter except ``sign`` and ``sign_type``, empty values skipped, keys in ASCII order,
  joined as ``k=v`` with ``&`` over the URL-decoded values, UTF-8.
* **OpenAPI requests** (we sign with the app private key, the gateway verifies): the same, but
  only ``sign`` is excluded, so ``sign_type`` is part of the string.
* **OpenAPI responses** (Alipay signs): the exact raw text of the ``<method>_response`` object,
  from its ``{`` to the matching ``}``, never re-serialised JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from cryptography.hazmat.primitives.asymmetric import rsa as rsa_keys

from dueflow.exceptions import BadSignature, MalformedNotification
from dueflow.payments import rsa
from dueflow.payments.rsa import KeyPair, generate_keypair, load_private_key, load_public_key

__all__ = [
    "SIGN_TYPE",
    "KeyPair",
    "build_response",
    "generate_keypair",
    "load_private_key",
    "load_public_key",
    "response_content",
    "response_key",
    "sign",
    "signing_string",
    "verify",
    "verify_request",
    "verify_response",
]

SIGN_TYPE = "RSA2"
ERROR_RESPONSE_KEY = "error_response"
_NOTIFICATION_EXCLUDED = frozenset({"sign", "sign_type"})
_REQUEST_EXCLUDED = frozenset({"sign"})
_DECODER = json.JSONDecoder()


def signing_string(params: Mapping[str, str], *, request: bool = False) -> str:
    """The string Alipay signs for a notification (default) or an OpenAPI request.

    Args:
        params: The URL-decoded parameters.
        request: True for an OpenAPI request, where ``sign_type`` is signed too; False for an
            async notification, where ``sign`` and ``sign_type`` are both left out.

    Returns:
        ``k1=v1&k2=v2...`` in ASCII key order, empty values skipped.
    """
    excluded = _REQUEST_EXCLUDED if request else _NOTIFICATION_EXCLUDED
    pairs = sorted((k, v) for k, v in params.items() if k not in excluded and v)
    return "&".join(f"{key}={value}" for key, value in pairs)


def sign(
    params: Mapping[str, str], private_key: rsa_keys.RSAPrivateKey, *, request: bool = False
) -> str:
    """The base64 RSA2 ``sign`` of ``params``.

    Args:
        params: The URL-decoded parameters (any ``sign`` in them is ignored).
        private_key: The app private key for requests; Alipay's key (the simulator) for
            notifications.
        request: Sign as an OpenAPI request (``sign_type`` included) instead of a notification.

    Returns:
        The signature, base64 without line breaks.
    """
    message = signing_string(params, request=request).encode("utf-8")
    return rsa.sign_sha256(private_key, message)


def verify(params: Mapping[str, str], key: rsa_keys.RSAPublicKey | rsa_keys.RSAPrivateKey) -> None:
    """Verify an async notification's ``sign`` (``sign`` and ``sign_type`` not signed).

    Args:
        params: The URL-decoded form parameters exactly as received.
        key: The Alipay public key (a private key is reduced to its public half).

    Raises:
        MalformedNotification: ``sign`` is missing or ``sign_type`` is not RSA2.
        BadSignature: The signature does not match.
    """
    _verify_params(params, key, request=False)


def verify_request(
    params: Mapping[str, str], key: rsa_keys.RSAPublicKey | rsa_keys.RSAPrivateKey
) -> None:
    """Verify an OpenAPI request's ``sign`` (``sign_type`` signed): the gateway's check.

    Args:
        params: The request's query and form parameters merged, URL-decoded.
        key: The app public key.

    Raises:
        MalformedNotification: ``sign`` is missing or ``sign_type`` is not RSA2.
        BadSignature: The signature does not match.
    """
    _verify_params(params, key, request=True)


def response_key(method: str) -> str:
    """The JSON key of a method's response: ``alipay.trade.query`` -> ``alipay_trade_query_response``."""
    return method.replace(".", "_") + "_response"


def response_content(raw_text: str, key: str) -> str | None:
    """The exact raw text of the top-level member ``key`` of a JSON object, or None.

    The text is located with a JSON scanner, not by counting braces, so braces inside strings
    cannot cut it short.

    Raises:
        MalformedNotification: ``raw_text`` is not a JSON object.
    """
    span = _members(raw_text).get(key)
    return None if span is None else raw_text[span[0] : span[1]]


def verify_response(
    raw_text: str, method: str, public_key: rsa_keys.RSAPublicKey
) -> dict[str, Any]:
    """Verify an OpenAPI response and return its ``<method>_response`` (or ``error_response``).

    The signature is checked over the raw text as sent. Like the official Java SDK, a text that
    fails is checked once more with ``\\/`` unescaped to ``/``.

    Args:
        raw_text: The HTTP body, decoded as UTF-8.
        method: The OpenAPI method, e.g. ``alipay.trade.query``.
        public_key: The Alipay public key.

    Returns:
        The response object parsed from the verified text. The caller checks its ``code``.

    Raises:
        MalformedNotification: Not a JSON object, no response object, or no ``sign``.
        BadSignature: The signature does not match.
    """
    members = _members(raw_text)
    span = members.get(response_key(method)) or members.get(ERROR_RESPONSE_KEY)
    sign_span = members.get("sign")
    if span is None:
        raise MalformedNotification(f"no {response_key(method)} in the response")
    signature = json.loads(raw_text[sign_span[0] : sign_span[1]]) if sign_span else None
    if not isinstance(signature, str) or not signature:
        raise MalformedNotification("the response has no sign")
    content = raw_text[span[0] : span[1]]
    if not _verify_content(content, signature, public_key):
        raise BadSignature("the response signature does not match")
    parsed = json.loads(content)
    if not isinstance(parsed, dict):
        raise MalformedNotification("the response member is not an object")
    return parsed


def build_response(
    method: str, content: Mapping[str, Any], private_key: rsa_keys.RSAPrivateKey
) -> str:
    """A signed OpenAPI response body as Alipay sends it (for the simulator).

    Args:
        method: The OpenAPI method; the member is named by :func:`response_key`.
        content: The response object (``code``, ``msg``, ...).
        private_key: Alipay's private key.

    Returns:
        ``{"<method>_response":{...},"sign":"..."}``, compact JSON, non-ASCII kept as is.
    """
    text = json.dumps(dict(content), ensure_ascii=False, separators=(",", ":"))
    signature = rsa.sign_sha256(private_key, text.encode("utf-8"))
    return f'{{"{response_key(method)}":{text},"sign":{json.dumps(signature)}}}'


def _verify_params(
    params: Mapping[str, str],
    key: rsa_keys.RSAPublicKey | rsa_keys.RSAPrivateKey,
    *,
    request: bool,
) -> None:
    signature = params.get("sign")
    if not signature:
        raise MalformedNotification("the notification has no sign")
    sign_type = params.get("sign_type")
    if sign_type and sign_type != SIGN_TYPE:
        raise MalformedNotification(f"unsupported sign_type {sign_type!r}")
    message = signing_string(params, request=request).encode("utf-8")
    if not rsa.verify_sha256(rsa.as_public_key(key), message, signature):
        raise BadSignature()


def _verify_content(content: str, signature: str, public_key: rsa_keys.RSAPublicKey) -> bool:
    if rsa.verify_sha256(public_key, content.encode("utf-8"), signature):
        return True
    unescaped = content.replace("\\/", "/")
    return unescaped != content and rsa.verify_sha256(
        public_key, unescaped.encode("utf-8"), signature
    )


def _members(text: str) -> dict[str, tuple[int, int]]:
    try:
        return _top_level_members(text)
    except ValueError as exc:
        raise MalformedNotification(f"the response is not a JSON object: {exc}") from None
    except RecursionError:  # nested deeper than the JSON scanner goes
        raise MalformedNotification("the response is not a JSON object: nested too deep") from None


def _top_level_members(text: str) -> dict[str, tuple[int, int]]:
    """Map each top-level key of the JSON object ``text`` to the span of its raw value."""
    pos = _skip_space(text, 0)
    if text[pos : pos + 1] != "{":
        raise ValueError("expected '{'")
    spans: dict[str, tuple[int, int]] = {}
    pos = _skip_space(text, pos + 1)
    if text[pos : pos + 1] == "}":
        return spans
    while True:
        key, pos = _DECODER.raw_decode(text, pos)
        pos = _skip_space(text, pos)
        if not isinstance(key, str) or text[pos : pos + 1] != ":":
            raise ValueError(f"expected a key and ':' at {pos}")
        start = _skip_space(text, pos + 1)
        _, end = _DECODER.raw_decode(text, start)
        spans[key] = (start, end)
        pos = _skip_space(text, end)
        if text[pos : pos + 1] == "}":
            return spans
        if text[pos : pos + 1] != ",":
            raise ValueError(f"expected ',' or '}}' at {pos}")
        pos = _skip_space(text, pos + 1)


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos

"""Alipay RSA2: fixed vectors, every rejection, and cross-checks with python-alipay-sdk (fzlee).

The expected signatures were computed once with the OpenSSL command line
(``printf '%s' "$STRING" | openssl dgst -sha256 -sign key.pem | base64 -w0``), not with the code
under test. RSA PKCS#1 v1.5 is deterministic, so they never change.
"""

from __future__ import annotations

import json
from decimal import Decimal
from urllib.parse import parse_qsl

import pytest
from alipay import AliPay  # type: ignore[import-untyped]
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey

from dueflow.exceptions import (
    AmountMismatch,
    BadSignature,
    ConfigError,
    InvalidInput,
    MalformedNotification,
    NotificationRejected,
)
from dueflow.payments import money_wire, rsa
from dueflow.payments.alipay import signing

from .keys import MERCHANT_PRIVATE_PEM, OTHER_PRIVATE_PEM, PROVIDER_PRIVATE_PEM

ALIPAY_KEY = signing.load_private_key(PROVIDER_PRIVATE_PEM)
APP_KEY = signing.load_private_key(MERCHANT_PRIVATE_PEM)
OTHER_KEY = signing.load_private_key(OTHER_PRIVATE_PEM)
ALIPAY_PUBLIC = ALIPAY_KEY.public_key()
APP_PUBLIC = APP_KEY.public_key()

NOTIFICATION = {
    "notify_time": "2026-03-01 20:00:06",
    "notify_type": "trade_status_sync",
    "notify_id": "2026030100222200005046880500000001",
    "app_id": "2021000000000001",
    "charset": "utf-8",
    "version": "1.0",
    "sign_type": "RSA2",
    "trade_no": "2026030122001446880500000001",
    "out_trade_no": "P20260301000001",
    "buyer_id": "2088102177846880",
    "seller_id": "2088102177296610",
    "trade_status": "TRADE_SUCCESS",
    "total_amount": "10.00",
    "subject": "大乐透2.1",
    "body": "",
    "passback_params": "",
    "gmt_create": "2026-03-01 20:00:00",
    "gmt_payment": "2026-03-01 20:00:05",
}
NOTIFICATION_STRING = (
    "app_id=2021000000000001&buyer_id=2088102177846880&charset=utf-8"
    "&gmt_create=2026-03-01 20:00:00&gmt_payment=2026-03-01 20:00:05"
    "&notify_id=2026030100222200005046880500000001&notify_time=2026-03-01 20:00:06"
    "&notify_type=trade_status_sync&out_trade_no=P20260301000001&seller_id=2088102177296610"
    "&subject=大乐透2.1&total_amount=10.00&trade_no=2026030122001446880500000001"
    "&trade_status=TRADE_SUCCESS&version=1.0"
)
NOTIFICATION_SIGN = (
    "nKszyCn29EIzt+ZdNqNNwNRtYB0qTX7zYu1O8nhb6w5sd5npeGHSzfV5xZkoxmJH9NSlC+SRG2P8PmDTsxQXtOon"
    "H/ChSrX2QB5AfGJsce1ux/oIrNPf68QVtfrkvFdjkknj9bGcbxU0MXKf/Z/tOIlaHkFNtUgOtX6GO0XTSzHIB0L0"
    "lmOWTtSWoxjy+SBze93VH5sIBAIJWOgTuMvvKAQLO/Ea3HLxP8+RV8R/ESy97bpr13YUSrWlRYoLqyrpkFJZG9vS"
    "Ealr3wc/DqlrYU4hMMpbTOhABQyEw33emIT/54x59fAIz+DuZ6+DWjMFtirjV+Rw7KdbMZj6kYjROA=="
)

REQUEST = {
    "app_id": "2021000000000001",
    "method": "alipay.trade.query",
    "format": "JSON",
    "charset": "utf-8",
    "sign_type": "RSA2",
    "timestamp": "2026-03-01 20:00:00",
    "version": "1.0",
    "notify_url": "",
    "biz_content": '{"out_trade_no":"P20260301000001"}',
}
REQUEST_STRING = (
    'app_id=2021000000000001&biz_content={"out_trade_no":"P20260301000001"}&charset=utf-8'
    "&format=JSON&method=alipay.trade.query&sign_type=RSA2&timestamp=2026-03-01 20:00:00"
    "&version=1.0"
)
REQUEST_SIGN = (
    "1sKu+hvUCy+Dwb3d9MCQD39hfxxfXQhGLWCNmqg/l/AbPvT3sjMTjeBfZTi0XcnXAr8+PwZW9TjByGB7tRdXEwAd"
    "MW14Iz20KAU6G59CLcAwdhv43nyKy4Xl3lISHJ5pBbjUkCSFeOM2t1CxbouPnYdbcSdu9vl+XXZDXE1cfn6ijJUy"
    "U79+EnHG2z2VkyQRUxCOYSXZMB6AffDg9hdImlyETrZ8N5L3qQsc1rpP5p89OgaloCMiOSVq0pVygAAJMM0z1pV/"
    "6PaplwWh/WRcKhRiKKLo077MHciuMhYuPm44uUOr0mK/8UE7ZFYZZsHonzP9QKpQoFHcju/qlgtEyg=="
)

RESPONSE_CONTENT = '{"code":"10000","msg":"Success","out_trade_no":"P1","note":"a } in {a string}"}'
RESPONSE_SIGN = (
    "mQAeo1D+g8GOpl/ZkmjqmM3e0AEr2ct9L3Q+9t7GVy+AHs2RQneZ8turyKDhCbmlQ+oVVxYf1vtlKuO46FAyUB1k"
    "4YWoHjZgYnL6VSlVperzDEGihFdJ2yuqEkSvd9CdCgAx9r0OgcennCFSmBe2JIuD31GDrc4k3PHiXVZSnOU5X2lD"
    "nYUrT3XItaKAMPwvzio75PT9AcmeDRn/OsBBI0UdmOiAix36jC9nRVAdetK2onMnq0apUr++QyGqjgxTNqNlXre8"
    "YgKJGyxV7bSN4Pahq6SRk1lpCeIQBqMtzFoZ/z3v3Dud9kzXWbFxAVCTkRYPS00dRyGHIYpkt7IajQ=="
)

TEXT_SIGN = rsa.sign_sha256(ALIPAY_KEY, b'"text"')


def signed_notification(**changes: str) -> dict[str, str]:
    params = {**NOTIFICATION, **changes}
    return {**params, "sign": signing.sign(params, ALIPAY_KEY)}


# --- fixed vectors -----------------------------------------------------------------------------


def test_notification_signing_string_leaves_out_sign_sign_type_and_empty_values() -> None:
    params = {**NOTIFICATION, "sign": NOTIFICATION_SIGN}
    assert signing.signing_string(params) == NOTIFICATION_STRING


def test_notification_signature_vector() -> None:
    assert signing.sign(NOTIFICATION, ALIPAY_KEY) == NOTIFICATION_SIGN
    signing.verify({**NOTIFICATION, "sign": NOTIFICATION_SIGN}, ALIPAY_PUBLIC)


def test_verify_takes_a_private_key_as_its_public_half() -> None:
    signing.verify({**NOTIFICATION, "sign": NOTIFICATION_SIGN}, ALIPAY_KEY)


def test_request_signing_string_includes_sign_type() -> None:
    params = {**REQUEST, "sign": REQUEST_SIGN}
    assert signing.signing_string(params, request=True) == REQUEST_STRING


def test_request_signature_vector() -> None:
    assert signing.sign(REQUEST, APP_KEY, request=True) == REQUEST_SIGN
    signing.verify_request({**REQUEST, "sign": REQUEST_SIGN}, APP_PUBLIC)


def test_a_request_signature_is_not_a_notification_signature() -> None:
    with pytest.raises(BadSignature):
        signing.verify({**REQUEST, "sign": REQUEST_SIGN}, APP_PUBLIC)


def test_empty_values_and_sign_type_do_not_change_a_notification_signature() -> None:
    params = signed_notification()
    signing.verify({**params, "out_biz_no": "", "sign_type": "RSA2"}, ALIPAY_PUBLIC)
    signing.verify({k: v for k, v in params.items() if k != "sign_type"}, ALIPAY_PUBLIC)


# --- rejections --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("total_amount", "100.00"),
        ("total_amount", "10.0"),
        ("out_trade_no", "P20260301000002"),
        ("trade_status", "TRADE_FINISHED"),
        ("app_id", "2021000000000002"),
        ("body", "now signed"),
        ("refund_fee", "10.00"),
    ],
)
def test_a_tampered_or_added_field_is_rejected(field: str, value: str) -> None:
    params = {**signed_notification(), field: value}
    with pytest.raises(BadSignature):
        signing.verify(params, ALIPAY_PUBLIC)


@pytest.mark.parametrize("key", [OTHER_KEY.public_key(), APP_PUBLIC])
def test_a_signature_by_another_key_is_rejected(key: RSAPublicKey) -> None:
    params = {**NOTIFICATION, "sign": signing.sign(NOTIFICATION, OTHER_KEY)}
    with pytest.raises(BadSignature):
        signing.verify(params, ALIPAY_PUBLIC)
    with pytest.raises(BadSignature):
        signing.verify({**NOTIFICATION, "sign": NOTIFICATION_SIGN}, key)


@pytest.mark.parametrize("sign", [None, ""])
def test_a_missing_sign_is_malformed(sign: str | None) -> None:
    params = dict(NOTIFICATION) if sign is None else {**NOTIFICATION, "sign": sign}
    with pytest.raises(MalformedNotification, match="no sign"):
        signing.verify(params, ALIPAY_PUBLIC)


def test_another_sign_type_is_malformed() -> None:
    with pytest.raises(MalformedNotification, match="sign_type"):
        signing.verify({**signed_notification(), "sign_type": "RSA"}, ALIPAY_PUBLIC)


@pytest.mark.parametrize("sign", ["not base64!", "AAAA", NOTIFICATION_SIGN[:-4]])
def test_a_garbled_sign_is_a_bad_signature(sign: str) -> None:
    with pytest.raises(BadSignature):
        signing.verify({**NOTIFICATION, "sign": sign}, ALIPAY_PUBLIC)


def test_rejections_are_notification_rejections_with_codes() -> None:
    assert issubclass(BadSignature, NotificationRejected)
    assert issubclass(MalformedNotification, NotificationRejected)
    assert issubclass(AmountMismatch, NotificationRejected)
    assert BadSignature().message == "The signature does not verify."
    assert (BadSignature.code, MalformedNotification.code) == (
        "bad_signature",
        "malformed_notification",
    )


# --- OpenAPI responses -------------------------------------------------------------------------


def test_response_vector_is_verified_over_the_raw_text() -> None:
    raw = f'{{"alipay_trade_query_response":{RESPONSE_CONTENT},"sign":"{RESPONSE_SIGN}"}}'
    content = signing.verify_response(raw, "alipay.trade.query", ALIPAY_PUBLIC)
    assert content["note"] == "a } in {a string}"


def test_response_text_is_not_reserialised() -> None:
    inner = '{ "code" : "10000",\n  "msg": "Success", "nested": {"a": [1, 2]} }'
    sign = rsa.sign_sha256(ALIPAY_KEY, inner.encode())
    raw = f'\n {{ "sign" : "{sign}" ,  "alipay_trade_close_response" :  {inner} , "x": null }}\n'
    assert signing.response_content(raw, "alipay_trade_close_response") == inner
    assert signing.verify_response(raw, "alipay.trade.close", ALIPAY_PUBLIC)["code"] == "10000"


def test_response_with_escaped_slashes_is_checked_unescaped_too() -> None:
    signed = '{"code":"10000","url":"https://example.com/a"}'
    sent = signed.replace("/", "\\/")
    raw = f'{{"alipay_trade_query_response":{sent},"sign":"{rsa.sign_sha256(ALIPAY_KEY, signed.encode())}"}}'
    assert (
        signing.verify_response(raw, "alipay.trade.query", ALIPAY_PUBLIC)["url"]
        == "https://example.com/a"
    )


def test_signed_business_failure_and_error_response_are_returned() -> None:
    failure = signing.build_response(
        "alipay.trade.close",
        {"code": "40004", "msg": "Business Failed", "sub_code": "ACQ.TRADE_NOT_EXIST"},
        ALIPAY_KEY,
    )
    content = signing.verify_response(failure, "alipay.trade.close", ALIPAY_PUBLIC)
    assert content["sub_code"] == "ACQ.TRADE_NOT_EXIST"
    inner = '{"code":"40002","msg":"Invalid Arguments"}'
    error = f'{{"error_response":{inner},"sign":"{rsa.sign_sha256(ALIPAY_KEY, inner.encode())}"}}'
    assert signing.verify_response(error, "alipay.trade.close", ALIPAY_PUBLIC)["code"] == "40002"


def test_build_response_round_trips_non_ascii() -> None:
    raw = signing.build_response(
        "alipay.trade.query", {"code": "10000", "subject": "大乐透"}, ALIPAY_KEY
    )
    assert raw.startswith(
        '{"alipay_trade_query_response":{"code":"10000","subject":"大乐透"},"sign":"'
    )
    assert signing.verify_response(raw, "alipay.trade.query", ALIPAY_PUBLIC)["subject"] == "大乐透"


def test_tampered_response_is_rejected() -> None:
    raw = signing.build_response(
        "alipay.trade.query", {"code": "10000", "trade_status": "WAIT_BUYER_PAY"}, ALIPAY_KEY
    )
    with pytest.raises(BadSignature):
        signing.verify_response(
            raw.replace("WAIT_BUYER_PAY", "TRADE_SUCCESS"), "alipay.trade.query", ALIPAY_PUBLIC
        )
    with pytest.raises(BadSignature):
        signing.verify_response(raw, "alipay.trade.query", OTHER_KEY.public_key())


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ('{"alipay_trade_query_response":{"code":"10000"}}', "no sign"),
        ('{"alipay_trade_query_response":{"code":"10000"},"sign":""}', "no sign"),
        ('{"alipay_trade_query_response":{"code":"10000"},"sign":7}', "no sign"),
        (
            '{"alipay_trade_close_response":{"code":"10000"},"sign":"AAAA"}',
            "no alipay_trade_query_response",
        ),
        (
            f'{{"alipay_trade_query_response":"text","sign":"{TEXT_SIGN}"}}',
            "not an object",
        ),
        ("<html>502 Bad Gateway</html>", "not a JSON object"),
        ('{"alipay_trade_query_response":{"code":"10000"},}', "not a JSON object"),
        ('{"alipay_trade_query_response":{"code":"10000"', "not a JSON object"),
        ("[]", "not a JSON object"),
    ],
)
def test_malformed_responses(raw: str, match: str) -> None:
    with pytest.raises(MalformedNotification, match=match):
        signing.verify_response(raw, "alipay.trade.query", ALIPAY_PUBLIC)


def test_response_key_names_the_method() -> None:
    assert (
        signing.response_key("alipay.trade.fastpay.refund.query")
        == "alipay_trade_fastpay_refund_query_response"
    )


# --- keys --------------------------------------------------------------------------------------


def _bare(pem: str) -> str:
    return "".join(line for line in pem.splitlines() if not line.startswith("-----"))


def test_keys_load_from_pem_and_from_alipays_bare_base64() -> None:
    pair = rsa.KeyPair(ALIPAY_KEY)
    pkcs1_pem = ALIPAY_KEY.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    ).decode()
    for text in (
        PROVIDER_PRIVATE_PEM,
        _bare(PROVIDER_PRIVATE_PEM),
        pkcs1_pem,
        _bare(pkcs1_pem),
        pair.private_base64(),
    ):
        assert signing.sign(NOTIFICATION, signing.load_private_key(text)) == NOTIFICATION_SIGN
    spaced = "\n".join(pair.public_base64()[i : i + 64] for i in range(0, 392, 64))
    for public in (
        pair.public_pem(),
        pair.public_base64(),
        spaced,
        _bare(pair.public_pem()).encode(),
    ):
        signing.verify({**NOTIFICATION, "sign": NOTIFICATION_SIGN}, signing.load_public_key(public))


@pytest.mark.parametrize(
    "text",
    ["", "not a key", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----", "QUJD"],
)
def test_bad_keys_are_config_errors(text: str) -> None:
    with pytest.raises(ConfigError):
        signing.load_private_key(text)
    with pytest.raises(ConfigError):
        signing.load_public_key(text)


def test_non_rsa_keys_are_config_errors() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    with pytest.raises(ConfigError, match="not an RSA key"):
        signing.load_private_key(private)
    with pytest.raises(ConfigError, match="not an RSA key"):
        signing.load_public_key(public)


def test_generate_keypair_signs_and_verifies() -> None:
    pair = signing.generate_keypair()
    assert pair.private_key.key_size == 2048
    params = {
        **NOTIFICATION,
        "sign": signing.sign(NOTIFICATION, signing.load_private_key(pair.private_pem())),
    }
    signing.verify(params, signing.load_public_key(pair.public_base64()))


# --- amounts -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "amount"), [("10.0", "10.00"), ("10.00", "10.00"), ("10", "10.00"), ("0.01", "0.01")]
)
def test_alipay_amounts_compare_as_decimals(text: str, amount: str) -> None:
    assert money_wire.parse_alipay_amount(text) == Decimal(amount)
    assert money_wire.check_alipay_amount(text, Decimal(amount)) == Decimal(amount)


@pytest.mark.parametrize(
    "text", ["", "1e3", "10.001", "-1.00", "0.00", " 10.00", "10,00", "NaN", 10.0, 10]
)
def test_bad_alipay_amounts_are_malformed(text: object) -> None:
    with pytest.raises(MalformedNotification):
        money_wire.parse_alipay_amount(text)


def test_a_different_alipay_amount_is_a_mismatch() -> None:
    with pytest.raises(AmountMismatch):
        money_wire.check_alipay_amount("10.01", Decimal("10.00"))


def test_alipay_amount_is_written_with_two_decimals() -> None:
    assert money_wire.alipay_amount(Decimal("12.5")) == "12.50"
    assert money_wire.alipay_amount(Decimal("100000000")) == "100000000.00"
    with pytest.raises(InvalidInput):
        money_wire.alipay_amount(Decimal("0.001"))


# --- cross-checks with python-alipay-sdk (fzlee) -----------------------------------------------


def fzlee(app_key_pem: str, alipay_public_pem: str) -> AliPay:
    """An fzlee client; it makes no network call unless an api_* method is used."""
    return AliPay(
        appid="2021000000000001",
        app_private_key_string=app_key_pem,
        alipay_public_key_string=alipay_public_pem,
        sign_type="RSA2",
    )


ALIPAY_PUBLIC_PEM = rsa.public_key_pem(ALIPAY_PUBLIC)
APP_PUBLIC_PEM = rsa.public_key_pem(APP_PUBLIC)


def test_fzlee_verifies_what_we_sign() -> None:
    client = fzlee(MERCHANT_PRIVATE_PEM, ALIPAY_PUBLIC_PEM)
    params = {k: v for k, v in signed_notification().items() if v}
    sign = params.pop("sign")
    assert client.verify(dict(params), sign) is True
    params["total_amount"] = "100.00"
    assert client.verify(dict(params), sign) is False


def test_fzlee_does_not_skip_empty_values_but_alipay_does() -> None:
    """The reference's finding: an empty ``body=`` makes fzlee fail; the Alipay rule skips it."""
    client = fzlee(MERCHANT_PRIVATE_PEM, ALIPAY_PUBLIC_PEM)
    params = signed_notification()
    signing.verify(params, ALIPAY_PUBLIC)
    sign = params.pop("sign")
    assert client.verify(dict(params), sign) is False


def test_we_verify_a_notification_fzlee_signs() -> None:
    simulated_alipay = fzlee(PROVIDER_PRIVATE_PEM, APP_PUBLIC_PEM)
    params = {k: v for k, v in NOTIFICATION.items() if v and k != "sign_type"}
    received = dict(parse_qsl(simulated_alipay.sign_data(dict(params)), keep_blank_values=True))
    assert received["sign"] == NOTIFICATION_SIGN
    signing.verify({**received, "sign_type": "RSA2"}, ALIPAY_PUBLIC)


def test_we_verify_a_request_fzlee_signs() -> None:
    client = fzlee(MERCHANT_PRIVATE_PEM, ALIPAY_PUBLIC_PEM)
    body = client.build_body(
        "alipay.trade.query", {"out_trade_no": "P20260301000001", "subject": "大乐透 & co"}
    )
    received = dict(parse_qsl(client.sign_data(body), keep_blank_values=True))
    assert received["sign_type"] == "RSA2"
    signing.verify_request(received, APP_PUBLIC)
    assert signing.sign(received, APP_KEY, request=True) == received["sign"]
    with pytest.raises(BadSignature):
        signing.verify_request({**received, "sign_type": ""}, APP_PUBLIC)


def test_fzlee_verifies_a_response_we_build() -> None:
    client = fzlee(MERCHANT_PRIVATE_PEM, ALIPAY_PUBLIC_PEM)
    raw = signing.build_response(
        "alipay.trade.query", {"code": "10000", "trade_status": "TRADE_SUCCESS"}, ALIPAY_KEY
    )
    content = client._verify_and_return_sync_response(raw, "alipay_trade_query_response")
    assert content == {"code": "10000", "trade_status": "TRADE_SUCCESS"}


def test_we_verify_a_response_fzlee_signs() -> None:
    simulated_alipay = fzlee(PROVIDER_PRIVATE_PEM, APP_PUBLIC_PEM)
    inner = json.dumps({"code": "10000", "msg": "Success", "fund_change": "Y"})
    raw = json.dumps(
        {"alipay_trade_refund_response": json.loads(inner), "sign": simulated_alipay._sign(inner)}
    )
    assert signing.verify_response(raw, "alipay.trade.refund", ALIPAY_PUBLIC)["fund_change"] == "Y"

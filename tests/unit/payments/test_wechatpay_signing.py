"""WeChat Pay v3: fixed vectors, every rejection, and cross-checks with wechatpayv3 (minibear2021).

The expected signatures were computed once with the OpenSSL command line and the GCM vector with
pycryptodomex, not with the code under test.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import NameOID
from wechatpayv3 import WeChatPay, WeChatPayType  # type: ignore[import-untyped]
from wechatpayv3 import utils as sdk_utils

from dueflow.exceptions import (
    AmountMismatch,
    BadSignature,
    ConfigError,
    MalformedNotification,
    NotificationRejected,
    StaleTimestamp,
)
from dueflow.payments import money_wire, rsa
from dueflow.payments.wechatpay import signing

from .keys import MERCHANT_PRIVATE_PEM, OTHER_PRIVATE_PEM, PROVIDER_PRIVATE_PEM

PLATFORM_KEY = signing.load_private_key(PROVIDER_PRIVATE_PEM)
MERCHANT_KEY = signing.load_private_key(MERCHANT_PRIVATE_PEM)
OTHER_KEY = signing.load_private_key(OTHER_PRIVATE_PEM)
PUBLIC_KEY_ID = "PUB_KEY_ID_0119000000012026030100000000000001"
MCHID = "1900000001"
MERCHANT_SERIAL = "3775B6A45ACD588826D15E583A95F5DD********"
API_V3_KEY = "0123456789abcdef0123456789ABCDEF"

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TIMESTAMP = "1772366400"  # NOW
NONCE = "5K8264ILTKCH16CQ2502SI8ZNMTM67VS"
BODY = '{"id":"EV-1","resource_type":"encrypt-resource"}'
BODY_SIGNATURE = (
    "KJYG2ASYJRw5Gz2qB5NyCYoZ9f07GvwbtOAGf2sP5Ak4ARKP2z37HId5k5B+xy3o5XpXrYmbsBn7q6ZyFLI3NVB4"
    "TqSdKq2T4Q/psvSlCFwTYDbad6r1a+wCVyaoAmuS/6dSVxy8WxsBoFbZMkhKvzFGvDeucSensoGAWPZp/rmf8Gul"
    "q8eB3Is8qKIjVNjoADIgc2U7LovcLSVYO10eAcW3zokQ3eX/45RdtVddVznF4gWhvegFanfhZ7tPGswwexhZeotv"
    "UiHuTmWzQbdedds1UufP8YHnCB2kb69niQXLa0IqGlWdNnDE25yUJxTfNd2c3XJqfcnUwS+qoY0B5A=="
)
QUERY_URL = "/v3/pay/transactions/out-trade-no/P1?mchid=1900000001"
QUERY_NONCE = "593BEC0C930BF1AFEB40B4A08C8FB242"
QUERY_SIGNATURE = (
    "SKvMj3KRBYanyfCmiRRu2OmlKHA+mZ2eKPORxQSYVSfUJ2hqZ/jwRbp632Z+wLCnojer5gFQvSiGrn/sZL3EFeLW"
    "3sxuT4WvgrTgce36okstQDdZW+7pYRaAOTjpERIkchxRAKOhfNhcMK3rjrj5kIui7bzNRBjlm10NHZjpmXoJy2RU"
    "+uEW18N4eTmWI4qpTFsQCY+Nhezex8tIikQ52ktd3M0YuC48EnHDY553MweX4NsXEr98bNVDxuaVm/jsGl2itsng"
    "ddfhAAiy303fiflyQzhI7huwDIlsvJrwLcMVWVf2uOV4FB5vM/dXOKuKWxvIwa2X0aFtedYz4a3siw=="
)
GCM_NONCE = "A1B2C3D4E5F6"
GCM_AAD = "transaction"
GCM_PLAINTEXT = b'{"out_trade_no":"P1","amount":{"total":1000}}'
GCM_CIPHERTEXT = (
    "T1p+aJbG0m/GFw60df5zuNs7tZHU8n4Bvhc4k1mSjHQ5FeAiLnNifgf8NyjmRlhOSMJ3349UcJymsD1u1g=="
)

KEYS = {PUBLIC_KEY_ID: PLATFORM_KEY.public_key()}

TRANSACTION = {
    "appid": "wxd678efh567hg6787",
    "mchid": MCHID,
    "out_trade_no": "P20260301000001",
    "transaction_id": "4200000000202603010000000001",
    "trade_type": "NATIVE",
    "trade_state": "SUCCESS",
    "trade_state_desc": "支付成功",
    "success_time": "2026-03-01T20:00:05+08:00",
    "payer": {"openid": "oUpF8uMuAJO_M2pxb1Q9zNjWeS6o"},
    "amount": {"total": 1000, "payer_total": 1000, "currency": "CNY", "payer_currency": "CNY"},
}


def notification_body(resource: bytes = b"", *, aad: str = GCM_AAD, nonce: str = GCM_NONCE) -> str:
    plaintext = resource or json.dumps(TRANSACTION, ensure_ascii=False).encode()
    return json.dumps(
        {
            "id": "EV-2026030100000001",
            "create_time": "2026-03-01T20:00:06+08:00",
            "resource_type": "encrypt-resource",
            "event_type": "TRANSACTION.SUCCESS",
            "summary": "支付成功",
            "resource": {
                "original_type": "transaction",
                "algorithm": "AEAD_AES_256_GCM",
                "ciphertext": signing.encrypt_resource(API_V3_KEY, nonce, aad, plaintext),
                "associated_data": aad,
                "nonce": nonce,
            },
        },
        ensure_ascii=False,
    )


def headers_for(
    body: str, *, timestamp: str = TIMESTAMP, serial: str = PUBLIC_KEY_ID
) -> dict[str, str]:
    return signing.signed_headers(
        body, serial=serial, private_key=PLATFORM_KEY, timestamp=int(timestamp), nonce=NONCE
    )


# --- fixed vectors -----------------------------------------------------------------------------


def test_message_vector() -> None:
    assert signing.message(TIMESTAMP, NONCE, BODY) == f"{TIMESTAMP}\n{NONCE}\n{BODY}\n".encode()
    assert signing.message(TIMESTAMP, NONCE, b"") == f"{TIMESTAMP}\n{NONCE}\n\n".encode()


def test_notification_signature_vector() -> None:
    assert signing.sign_message(TIMESTAMP, NONCE, BODY, PLATFORM_KEY) == BODY_SIGNATURE
    signing.verify_signature(TIMESTAMP, NONCE, BODY, BODY_SIGNATURE, PLATFORM_KEY.public_key())
    signing.verify_signature(
        TIMESTAMP, NONCE, BODY.encode(), BODY_SIGNATURE, PLATFORM_KEY.public_key()
    )


def test_authorization_header_vector() -> None:
    header = signing.authorization(
        method="GET",
        url=QUERY_URL,
        body="",
        mchid=MCHID,
        serial_no=MERCHANT_SERIAL,
        private_key=MERCHANT_KEY,
        timestamp=int(TIMESTAMP),
        nonce=QUERY_NONCE,
    )
    assert header == (
        f'WECHATPAY2-SHA256-RSA2048 mchid="{MCHID}",nonce_str="{QUERY_NONCE}",'
        f'signature="{QUERY_SIGNATURE}",timestamp="{TIMESTAMP}",serial_no="{MERCHANT_SERIAL}"'
    )
    assert signing.request_message("get", QUERY_URL, TIMESTAMP, QUERY_NONCE, "") == (
        f"GET\n{QUERY_URL}\n{TIMESTAMP}\n{QUERY_NONCE}\n\n".encode()
    )


def test_gcm_vector() -> None:
    assert signing.encrypt_resource(API_V3_KEY, GCM_NONCE, GCM_AAD, GCM_PLAINTEXT) == GCM_CIPHERTEXT
    assert signing.decrypt_resource(API_V3_KEY, GCM_NONCE, GCM_AAD, GCM_CIPHERTEXT) == GCM_PLAINTEXT
    assert (
        signing.decrypt_resource(API_V3_KEY.encode(), GCM_NONCE, GCM_AAD, GCM_CIPHERTEXT)
        == GCM_PLAINTEXT
    )


def test_a_notification_verifies_and_decrypts() -> None:
    body = notification_body()
    signing.verify_headers(headers_for(body), body.encode(), keys=KEYS, now=NOW)
    assert signing.decrypt_notification(body, API_V3_KEY) == TRANSACTION


def test_empty_associated_data_and_empty_body() -> None:
    body = notification_body(aad="")
    assert signing.decrypt_notification(body, API_V3_KEY) == TRANSACTION
    headers = headers_for("")
    signing.verify_headers(headers, b"", keys=KEYS, now=NOW)  # a signed 204 response


def test_header_names_are_case_insensitive() -> None:
    headers = {name.lower(): value for name, value in headers_for(BODY).items()}
    signing.verify_headers(headers, BODY, keys=KEYS, now=NOW)


# --- rejections --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        BODY.replace("EV-1", "EV-2"),
        BODY + " ",
        BODY.replace(":", ": "),
        json.dumps(json.loads(BODY)),
    ],
)
def test_a_tampered_or_reserialised_body_is_rejected(body: str) -> None:
    with pytest.raises(BadSignature):
        signing.verify_headers(headers_for(BODY), body, keys=KEYS, now=NOW)


@pytest.mark.parametrize("field", ["Wechatpay-Timestamp", "Wechatpay-Nonce"])
def test_a_tampered_header_is_rejected(field: str) -> None:
    headers = headers_for(BODY)
    headers[field] = str(int(TIMESTAMP) + 1) if field == "Wechatpay-Timestamp" else "OTHERNONCE"
    with pytest.raises(BadSignature):
        signing.verify_headers(headers, BODY, keys=KEYS, now=NOW)


def test_a_signature_by_another_key_is_rejected() -> None:
    headers = headers_for(BODY)
    headers["Wechatpay-Signature"] = signing.sign_message(TIMESTAMP, NONCE, BODY, OTHER_KEY)
    with pytest.raises(BadSignature):
        signing.verify_headers(headers, BODY, keys=KEYS, now=NOW)
    with pytest.raises(BadSignature):
        signing.verify_signature(TIMESTAMP, NONCE, BODY, BODY_SIGNATURE, OTHER_KEY.public_key())


@pytest.mark.parametrize(
    "probe", ["WECHATPAY/SIGNTEST/" + BODY_SIGNATURE, "WECHATPAY/SIGNTEST/abc"]
)
def test_a_signtest_probe_is_rejected(probe: str) -> None:
    headers = {**headers_for(BODY), "Wechatpay-Signature": probe}
    with pytest.raises(BadSignature, match="probe"):
        signing.verify_headers(headers, BODY, keys=KEYS, now=NOW)


@pytest.mark.parametrize("signature", ["", "not base64!", "AAAA", BODY_SIGNATURE[:-4]])
def test_a_garbled_signature_is_rejected(signature: str) -> None:
    with pytest.raises(BadSignature):
        signing.verify_signature(TIMESTAMP, NONCE, BODY, signature, PLATFORM_KEY.public_key())


@pytest.mark.parametrize("skew", [0, 1, 299, -1, -299])
def test_timestamps_within_five_minutes_pass(skew: int) -> None:
    signing.check_timestamp(TIMESTAMP, NOW + timedelta(seconds=skew))
    signing.check_timestamp(TIMESTAMP, NOW + timedelta(seconds=skew, milliseconds=999))


@pytest.mark.parametrize("skew", [300, 301, 3600, -300, -301, -86400])
def test_stale_and_future_timestamps_are_rejected(skew: int) -> None:
    body = notification_body()
    headers = headers_for(body, timestamp=str(int(TIMESTAMP) - skew))
    with pytest.raises(StaleTimestamp):
        signing.verify_headers(headers, body, keys=KEYS, now=NOW)


@pytest.mark.parametrize(
    "timestamp", ["", "17723664OO", "-1772366400", "1772366400.5", "١٧٧٢٣٦٦٤٠٠"]
)
def test_a_non_numeric_timestamp_is_malformed(timestamp: str) -> None:
    with pytest.raises(MalformedNotification):
        signing.check_timestamp(timestamp, NOW)


def test_now_must_be_aware() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        signing.check_timestamp(TIMESTAMP, datetime(2026, 3, 1, 12, 0))


@pytest.mark.parametrize(
    "header",
    [
        "Wechatpay-Timestamp",
        "Wechatpay-Nonce",
        "Wechatpay-Signature",
        "Wechatpay-Serial",
        "Wechatpay-Signature-Type",
    ],
)
def test_a_missing_header_is_malformed(header: str) -> None:
    headers = headers_for(BODY)
    del headers[header]
    with pytest.raises(MalformedNotification, match=header):
        signing.verify_headers(headers, BODY, keys=KEYS, now=NOW)


def test_another_signature_type_is_malformed() -> None:
    headers = {**headers_for(BODY), "Wechatpay-Signature-Type": "WECHATPAY2-SM2-WITH-SM3"}
    with pytest.raises(MalformedNotification, match="signature type"):
        signing.verify_headers(headers, BODY, keys=KEYS, now=NOW)


@pytest.mark.parametrize(
    "serial",
    [
        "PUB_KEY_ID_0119000000012026030100000000000002",
        "5157F09EFDC096DE15EBE81A47057A7232F1B8E1",
        "pub_key_id_0119000000012026030100000000000001",
    ],
)
def test_an_unknown_serial_is_rejected(serial: str) -> None:
    with pytest.raises(BadSignature, match="no verification key"):
        signing.verify_headers(headers_for(BODY, serial=serial), BODY, keys=KEYS, now=NOW)


def test_rejections_are_notification_rejections_with_codes() -> None:
    for cls in (BadSignature, StaleTimestamp, MalformedNotification):
        assert issubclass(cls, NotificationRejected)
    assert StaleTimestamp.code == "stale_timestamp"
    assert StaleTimestamp().message == "The signed timestamp is more than 5 minutes away from now."


# --- keys by serial: platform certificates and PUB_KEY_ID_ public keys -------------------------

CERT_SERIAL = int("05157F09EFDC096DE15EBE81A47057A7232F1B8E", 16)


def platform_certificate() -> str:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Tenpay.com Root CA")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(OTHER_KEY.public_key())
        .serial_number(CERT_SERIAL)
        .not_valid_before(datetime(2026, 1, 1, tzinfo=UTC))
        .not_valid_after(datetime(2031, 1, 1, tzinfo=UTC))
        .sign(OTHER_KEY, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def test_certificate_key_reads_serial_and_key() -> None:
    serial, key = signing.certificate_key(platform_certificate())
    assert serial == "5157F09EFDC096DE15EBE81A47057A7232F1B8E"
    assert key.public_numbers() == OTHER_KEY.public_key().public_numbers()


@pytest.mark.parametrize(
    "sent",
    [
        "5157F09EFDC096DE15EBE81A47057A7232F1B8E",
        "05157F09EFDC096DE15EBE81A47057A7232F1B8E",
        "05157f09efdc096de15ebe81a47057a7232f1b8e",
    ],
)
def test_the_serial_chooses_the_certificate_or_the_public_key(sent: str) -> None:
    serial, cert_key = signing.certificate_key(platform_certificate())
    keys = {serial: cert_key, PUBLIC_KEY_ID: PLATFORM_KEY.public_key()}
    assert signing.select_key(keys, sent) is cert_key
    assert signing.select_key(keys, PUBLIC_KEY_ID) is keys[PUBLIC_KEY_ID]
    body = notification_body()
    signed_by_cert = signing.signed_headers(
        body, serial=sent, private_key=OTHER_KEY, timestamp=int(TIMESTAMP), nonce=NONCE
    )
    signing.verify_headers(signed_by_cert, body, keys=keys, now=NOW)
    with pytest.raises(BadSignature):  # the certificate's serial with the public key's signature
        signing.verify_headers(headers_for(body, serial=sent), body, keys=keys, now=NOW)


def test_a_bad_certificate_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        signing.certificate_key("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")


# --- resources ---------------------------------------------------------------------------------


def _flip_last_byte(ciphertext_b64: str) -> str:
    raw = bytearray(base64.b64decode(ciphertext_b64))
    raw[-1] ^= 1
    return base64.b64encode(bytes(raw)).decode()


@pytest.mark.parametrize(
    ("key", "nonce", "aad", "ciphertext"),
    [
        (API_V3_KEY, GCM_NONCE, GCM_AAD, _flip_last_byte(GCM_CIPHERTEXT)),  # bad tag
        (API_V3_KEY, GCM_NONCE, "refund", GCM_CIPHERTEXT),  # other associated data
        (API_V3_KEY, GCM_NONCE, "", GCM_CIPHERTEXT),  # associated data dropped
        (API_V3_KEY, "A1B2C3D4E5F7", GCM_AAD, GCM_CIPHERTEXT),  # other nonce
        (API_V3_KEY.lower(), GCM_NONCE, GCM_AAD, GCM_CIPHERTEXT),  # other APIv3 key
        (API_V3_KEY, GCM_NONCE, GCM_AAD, GCM_CIPHERTEXT[:20]),  # truncated
    ],
)
def test_a_resource_that_fails_authentication_is_rejected(
    key: str, nonce: str, aad: str, ciphertext: str
) -> None:
    with pytest.raises(BadSignature, match="authenticated decryption"):
        signing.decrypt_resource(key, nonce, aad, ciphertext)


def test_an_unreadable_resource_is_malformed() -> None:
    with pytest.raises(MalformedNotification):
        signing.decrypt_resource(API_V3_KEY, GCM_NONCE, GCM_AAD, "not base64!")
    with pytest.raises(MalformedNotification):
        signing.decrypt_resource(API_V3_KEY, "", GCM_AAD, GCM_CIPHERTEXT)


@pytest.mark.parametrize("key", ["short", API_V3_KEY + "X", b"\x00" * 16])
def test_an_apiv3_key_of_the_wrong_size_is_a_config_error(key: str | bytes) -> None:
    with pytest.raises(ConfigError, match="32 bytes"):
        signing.decrypt_resource(key, GCM_NONCE, GCM_AAD, GCM_CIPHERTEXT)


def _with(body: str, **changes: Any) -> str:
    data = json.loads(body)
    resource = data["resource"]
    for name, value in changes.items():
        if name == "resource_type":
            data[name] = value
        elif value is None:
            resource.pop(name)
        else:
            resource[name] = value
    return json.dumps(data)


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ("not json", "not JSON"),
        ("[1]", "not a JSON object"),
        (_with(notification_body(), resource_type="plain"), "no encrypted resource"),
        (_with(notification_body(), algorithm="AEAD_SM4_GCM"), "algorithm"),
        (_with(notification_body(), nonce=None), "nonce"),
        (_with(notification_body(), ciphertext=""), "ciphertext"),
        (_with(notification_body(), associated_data=7), "associated_data"),
        (notification_body(b"not json"), "decrypted resource is not JSON"),
        (notification_body(b'"a string"'), "decrypted resource is not a JSON object"),
        (notification_body("\xff".encode("latin-1")), "decrypted resource is not JSON"),
    ],
)
def test_a_malformed_notification_body(body: str, match: str) -> None:
    with pytest.raises(MalformedNotification, match=match):
        signing.decrypt_notification(body, API_V3_KEY)


def test_missing_associated_data_means_empty() -> None:
    body = _with(notification_body(aad=""), associated_data=None)
    assert signing.decrypt_notification(body, API_V3_KEY)["out_trade_no"] == "P20260301000001"


# --- request authorization (the gateway's side) ------------------------------------------------


def _query_header(url: str = QUERY_URL, timestamp: int = int(TIMESTAMP)) -> str:
    return signing.authorization(
        method="GET",
        url=url,
        body="",
        mchid=MCHID,
        serial_no=MERCHANT_SERIAL,
        private_key=MERCHANT_KEY,
        timestamp=timestamp,
        nonce=QUERY_NONCE,
    )


def test_authorization_round_trips() -> None:
    auth = signing.verify_authorization(
        _query_header(),
        method="GET",
        url=QUERY_URL,
        body="",
        public_key=MERCHANT_KEY.public_key(),
        now=NOW,
    )
    assert auth == signing.Authorization(
        MCHID, QUERY_NONCE, QUERY_SIGNATURE, TIMESTAMP, MERCHANT_SERIAL
    )


def test_authorization_rejections() -> None:
    public = MERCHANT_KEY.public_key()
    with pytest.raises(BadSignature):
        signing.verify_authorization(
            _query_header(), method="GET", url=QUERY_URL + "0", body="", public_key=public, now=NOW
        )
    with pytest.raises(BadSignature):
        signing.verify_authorization(
            _query_header(), method="POST", url=QUERY_URL, body="", public_key=public, now=NOW
        )
    with pytest.raises(BadSignature):
        signing.verify_authorization(
            _query_header(),
            method="GET",
            url=QUERY_URL,
            body="",
            public_key=OTHER_KEY.public_key(),
            now=NOW,
        )
    with pytest.raises(StaleTimestamp):
        signing.verify_authorization(
            _query_header(timestamp=int(TIMESTAMP) - 300),
            method="GET",
            url=QUERY_URL,
            body="",
            public_key=public,
            now=NOW,
        )


@pytest.mark.parametrize(
    "header",
    [
        "",
        "Bearer abc",
        'WECHATPAY2-SHA256-RSA2048 mchid="1",nonce_str="n",timestamp="1",serial_no="s"',
        'WECHATPAY2-SHA256-RSA2048 mchid="1"',
    ],
)
def test_a_malformed_authorization(header: str) -> None:
    with pytest.raises(MalformedNotification):
        signing.parse_authorization(header)


def test_new_nonce() -> None:
    nonce = signing.new_nonce()
    assert len(nonce) == 32 and nonce.isalnum() and nonce != signing.new_nonce()
    assert len(signing.new_nonce(12)) == 12


def test_generate_keypair() -> None:
    pair = signing.generate_keypair()
    signature = signing.sign_message(TIMESTAMP, NONCE, BODY, pair.private_key)
    signing.verify_signature(
        TIMESTAMP, NONCE, BODY, signature, signing.load_public_key(pair.public_pem())
    )


# --- amounts -----------------------------------------------------------------------------------


def test_wechat_totals_are_exact_fen() -> None:
    assert money_wire.wechat_total(Decimal("10.00")) == 1000
    assert money_wire.wechat_total(Decimal("0.1")) == 10
    assert money_wire.parse_wechat_total(1) == Decimal("0.01")
    assert money_wire.check_wechat_total(1000, Decimal("10.0")) == Decimal("10.00")


@pytest.mark.parametrize("total", [1000.0, "1000", True, 0, -5, None, 10**13])
def test_bad_wechat_totals_are_malformed(total: object) -> None:
    with pytest.raises(MalformedNotification):
        money_wire.parse_wechat_total(total)


@pytest.mark.parametrize("total", [999, 1001, 100000])
def test_a_different_wechat_total_is_a_mismatch(total: int) -> None:
    with pytest.raises(AmountMismatch):
        money_wire.check_wechat_total(total, Decimal("10.00"))


# --- cross-checks with wechatpayv3 (minibear2021) ----------------------------------------------


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """wechatpayv3 talks HTTP through ``requests``; any attempt fails the test."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"network call attempted: {args!r}")

    for verb in ("get", "post", "put", "patch", "delete", "request"):
        monkeypatch.setattr(requests, verb, refuse)


@pytest.fixture
def wxpay(no_network: None) -> WeChatPay:
    """The SDK in public-key mode: no certificate download, so no network during init."""
    return WeChatPay(
        wechatpay_type=WeChatPayType.NATIVE,
        mchid=MCHID,
        private_key=MERCHANT_PRIVATE_PEM,
        cert_serial_no=MERCHANT_SERIAL,
        appid=TRANSACTION["appid"],
        apiv3_key=API_V3_KEY,
        public_key=rsa.public_key_pem(PLATFORM_KEY.public_key()),
        public_key_id=PUBLIC_KEY_ID,
    )


def test_sdk_callback_accepts_a_notification_we_sign_and_encrypt(wxpay: WeChatPay) -> None:
    body = notification_body()
    result = wxpay.callback(headers_for(body), body)
    assert result is not None
    assert result["resource"] == TRANSACTION
    assert result["event_type"] == "TRANSACTION.SUCCESS"


def test_sdk_callback_and_we_agree_on_rejections(wxpay: WeChatPay) -> None:
    body = notification_body()
    tampered = body.replace("TRANSACTION.SUCCESS", "TRANSACTION.FAILURE")
    assert wxpay.callback(headers_for(body), tampered) is None
    with pytest.raises(BadSignature):
        signing.verify_headers(headers_for(body), tampered, keys=KEYS, now=NOW)
    other = {
        **headers_for(body),
        "Wechatpay-Signature": signing.sign_message(TIMESTAMP, NONCE, body, OTHER_KEY),
    }
    assert wxpay.callback(other, body) is None


def test_what_the_sdk_misses_and_we_refuse(wxpay: WeChatPay) -> None:
    """The SDK has no timestamp window: a day-old notification passes it and fails ours."""
    body = notification_body()
    old = headers_for(body, timestamp=str(int(TIMESTAMP) - 86400))
    assert wxpay.callback(old, body) is not None
    with pytest.raises(StaleTimestamp):
        signing.verify_headers(old, body, keys=KEYS, now=NOW)


def test_we_verify_what_the_sdk_signs(wxpay: WeChatPay) -> None:
    signature = wxpay.sign([TIMESTAMP, NONCE, BODY])
    signing.verify_signature(TIMESTAMP, NONCE, BODY, signature, MERCHANT_KEY.public_key())
    assert signature == signing.sign_message(TIMESTAMP, NONCE, BODY, MERCHANT_KEY)


def test_we_verify_the_sdks_authorization_header() -> None:
    body = {"mchid": MCHID}
    header = sdk_utils.build_authorization(
        "/v3/pay/transactions/out-trade-no/P1/close",
        "POST",
        MCHID,
        MERCHANT_SERIAL,
        MERCHANT_KEY,
        data=body,
        nonce_str=QUERY_NONCE,
    )
    auth = signing.verify_authorization(
        header,
        method="POST",
        url="/v3/pay/transactions/out-trade-no/P1/close",
        body=json.dumps(body),
        public_key=MERCHANT_KEY.public_key(),
        now=datetime.now(UTC),
    )
    assert (auth.mchid, auth.serial_no, auth.nonce_str) == (MCHID, MERCHANT_SERIAL, QUERY_NONCE)


def test_sdk_decrypts_what_we_encrypt_and_we_decrypt_its_vector() -> None:
    ciphertext = signing.encrypt_resource(API_V3_KEY, GCM_NONCE, GCM_AAD, GCM_PLAINTEXT)
    assert (
        sdk_utils.aes_decrypt(GCM_NONCE, ciphertext, GCM_AAD, API_V3_KEY) == GCM_PLAINTEXT.decode()
    )
    assert sdk_utils.aes_decrypt(GCM_NONCE, ciphertext, "refund", API_V3_KEY) is None

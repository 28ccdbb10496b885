"""WeChat Pay at the trust boundary: the ``Wechatpay-*`` headers, the JSON envelope and its
AES-256-GCM resource, and the ``Authorization`` header. Only the documented refusals come out;
what is accepted is what the platform signed."""

from __future__ import annotations

import json
from datetime import timedelta

import httpx
from hypothesis import given
from hypothesis import strategies as st

from dueflow.exceptions import (
    BadSignature,
    ConfigError,
    MalformedNotification,
    NotificationRejected,
    StaleTimestamp,
)
from dueflow.payments.wechatpay import signing
from dueflow.payments.wechatpay.provider import WechatPayProvider
from tests.unit.fuzz import (
    API_V3_KEY,
    MERCHANT_KEY,
    NOW,
    OTHER_KEY,
    PROVIDER_KEY,
    WECHAT_APPID,
    WECHAT_MCHID,
    WECHAT_SERIAL,
    any_text,
    fuzz_settings,
    mutated_text,
    number_text,
    raises_only,
)

PROVIDER = WechatPayProvider(
    base_url="http://wechatpay.invalid",
    appid=WECHAT_APPID,
    mchid=WECHAT_MCHID,
    merchant_serial="5157F09EFDC096DE15EBE81A47057A7232F1B8E1",
    merchant_private_key=MERCHANT_KEY.private_key,
    platform_keys={WECHAT_SERIAL: PROVIDER_KEY.public_key},
    api_v3_key=API_V3_KEY,
    notify_url="http://dueflow.invalid/notify/wechatpay",
    client=httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(599))),
)
KEYS = {WECHAT_SERIAL: PROVIDER_KEY.public_key}
STAMP = str(int(NOW.timestamp()))
#: What ``verify_headers`` documents (all NotificationRejected).
HEADER_REFUSALS = (MalformedNotification, StaleTimestamp, BadSignature)

#: Integers that JSON text carries (json.dumps refuses to write one of over 4300 digits).
json_ints = st.one_of(
    st.integers(min_value=-(2**64), max_value=2**64),
    st.sampled_from([0, -1, 2**31 - 1, 2**31, 10**30, 10**400]),
)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), json_ints, any_text),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(any_text, inner, max_size=3)
    ),
    max_leaves=8,
)
TRANSACTION = {
    "appid": WECHAT_APPID,
    "mchid": WECHAT_MCHID,
    "out_trade_no": "20260301aaaaaaaaaaaaaaaa",
    "transaction_id": "4200001",
    "trade_state": "SUCCESS",
    "amount": {"total": 8800, "payer_total": 8800, "currency": "CNY"},
}


@st.composite
def resources(draw: st.DrawFn) -> dict[str, object]:
    """A decrypted resource: a valid transaction with fields changed, dropped or added."""
    resource: dict[str, object] = json.loads(json.dumps(TRANSACTION))
    for name in draw(st.lists(st.sampled_from(sorted(TRANSACTION)), max_size=3, unique=True)):
        resource[name] = draw(st.one_of(json_values, number_text))
    for name in draw(st.lists(st.sampled_from(sorted(TRANSACTION)), max_size=1)):
        resource.pop(name, None)
    if draw(st.booleans()):
        resource["amount"] = {
            "total": draw(json_ints),
            "refund": draw(json_ints),
            "currency": "CNY",
        }
    resource.update(
        draw(st.dictionaries(st.sampled_from(["out_refund_no", "refund_status"]), any_text))
    )
    return resource


@st.composite
def envelopes(draw: st.DrawFn) -> bytes:
    """A notification envelope with its resource encrypted by our APIv3 key, then maybe broken."""
    nonce = draw(st.one_of(st.just("0123456789AB"), st.text(max_size=20)))
    associated = draw(st.sampled_from(["transaction", "refund", ""]))
    plaintext = draw(
        st.one_of(resources().map(lambda r: json.dumps(r).encode()), st.binary(max_size=40))
    )
    key = draw(st.sampled_from([API_V3_KEY, API_V3_KEY, "f" * 32]))
    ciphertext = raises_only(
        (ValueError,), lambda: signing.encrypt_resource(key, nonce, associated, plaintext)
    )
    resource = {
        "algorithm": draw(st.sampled_from(["AEAD_AES_256_GCM", "AEAD_AES_256_GCM", "AES", ""])),
        "nonce": nonce,
        "associated_data": associated,
        "ciphertext": draw(st.one_of(st.just(ciphertext or ""), mutated_text(ciphertext or "x"))),
    }
    envelope = {
        "id": "EV-1",
        "event_type": draw(
            st.sampled_from(["TRANSACTION.SUCCESS", "REFUND.SUCCESS", "REFUND.CLOSED", "X", ""])
        ),
        "resource_type": draw(st.sampled_from(["encrypt-resource", "encrypt-resource", "plain"])),
        "resource": resource,
    }
    for name in draw(st.lists(st.sampled_from(["resource", "event_type", "id"]), max_size=1)):
        envelope[name] = draw(json_values)
    body = json.dumps(envelope).encode()
    how = draw(st.sampled_from(["as is", "as is", "cut", "junk", "nested"]))
    if how == "cut":
        return body[: draw(st.integers(min_value=0, max_value=len(body)))]
    if how == "junk":
        return draw(st.binary(max_size=100))
    if how == "nested":
        return b'{"resource_type":"encrypt-resource","resource":' + b"[" * 2000 + b"]" * 2000 + b"}"
    return body


@st.composite
def headers_for(draw: st.DrawFn, body: bytes) -> dict[str, str]:
    """The platform's headers for ``body``, names in any case, maybe with a field changed."""
    at = draw(st.sampled_from([0, 0, 1, -299, 299, 300, -300, 10**6]))
    key = draw(st.sampled_from([PROVIDER_KEY, PROVIDER_KEY, OTHER_KEY]))
    headers = signing.signed_headers(
        body,
        serial=WECHAT_SERIAL,
        private_key=key.private_key,
        timestamp=int(NOW.timestamp()) + at,
        nonce="NONCE0123456789",
    )
    for name in draw(st.lists(st.sampled_from(sorted(headers)), max_size=2, unique=True)):
        changed = draw(st.one_of(mutated_text(headers[name]), any_text, number_text, st.none()))
        if changed is None:
            del headers[name]
        else:
            headers[name] = changed
    casing = draw(st.sampled_from([str.lower, str.upper, str.title, lambda s: s]))
    return {casing(name): value for name, value in headers.items()}


@fuzz_settings(150)
@given(data=st.data())
def test_a_notification_is_what_the_platform_signed_or_refused(data):
    body = data.draw(st.one_of(envelopes(), st.binary(max_size=100)), label="body")
    headers = data.draw(
        st.one_of(headers_for(body), st.dictionaries(any_text, any_text, max_size=5)),
        label="headers",
    )
    verified = raises_only(
        HEADER_REFUSALS, lambda: signing.verify_headers(headers, body, keys=KEYS, now=NOW)
    )
    note = raises_only(
        (NotificationRejected,), lambda: PROVIDER.verify_notification(body, headers, NOW)
    )
    if note is not None:
        assert verified is None  # verify_headers returns None when the headers check out
        resource = signing.decrypt_notification(body, API_V3_KEY)
        assert resource["mchid"] == WECHAT_MCHID


@fuzz_settings(80)
@given(body=st.one_of(envelopes(), st.binary(max_size=100)))
def test_decrypting_a_resource_raises_only_the_documented_refusals(body):
    raises_only(
        (MalformedNotification, BadSignature),
        lambda: signing.decrypt_notification(body, API_V3_KEY),
    )


@fuzz_settings(150)
@given(
    key=st.one_of(st.just(API_V3_KEY), st.text(max_size=40), st.binary(max_size=40)),
    nonce=st.one_of(st.just("0123456789AB"), any_text),
    associated=any_text,
    plaintext=st.binary(max_size=60),
    ciphertext=st.one_of(any_text, st.just("AAAA"), st.just("====")),
)
def test_aes_gcm_resources_round_trip_and_refuse_tampering(
    key, nonce, associated, plaintext, ciphertext
):
    refusals = (ConfigError, MalformedNotification, BadSignature)
    raises_only(refusals, lambda: signing.decrypt_resource(key, nonce, associated, ciphertext))
    sealed = raises_only(
        (ConfigError, ValueError),
        lambda: signing.encrypt_resource(key, nonce, associated, plaintext),
    )
    if sealed is not None:
        assert signing.decrypt_resource(key, nonce, associated, sealed) == plaintext
        assert (
            raises_only(
                refusals, lambda: signing.decrypt_resource(key, nonce, associated + "x", sealed)
            )
            is None
        )


@fuzz_settings(200)
@given(
    timestamp=st.one_of(
        number_text, any_text, st.integers(-400, 400).map(lambda d: str(int(NOW.timestamp()) + d))
    ),
    header=st.one_of(
        any_text,
        st.sampled_from(["WECHATPAY2-SHA256-RSA2048", 'WECHATPAY2-SHA256-RSA2048 mchid="1"']),
    ),
)
def test_timestamps_and_authorization_headers_refuse_as_documented(timestamp, header):
    ok = raises_only(
        (MalformedNotification, StaleTimestamp), lambda: signing.check_timestamp(timestamp, NOW)
    )
    if ok is None and timestamp.isascii() and timestamp.isdigit() and len(timestamp) <= 12:
        assert abs(int(timestamp) - int(NOW.timestamp())) >= 300 or ok is None
    raises_only((MalformedNotification,), lambda: signing.parse_authorization(header))
    raises_only(
        (MalformedNotification, StaleTimestamp, BadSignature),
        lambda: signing.verify_authorization(
            header, method="GET", url="/v3/x", body=b"", public_key=PROVIDER_KEY.public_key, now=NOW
        ),
    )
    signed = signing.authorization(
        method="POST",
        url="/v3/x",
        body=timestamp,
        mchid=WECHAT_MCHID,
        serial_no="S1",
        private_key=MERCHANT_KEY.private_key,
        timestamp=int((NOW - timedelta(seconds=10)).timestamp()),
        nonce="N1",
    )
    auth = signing.verify_authorization(
        signed,
        method="POST",
        url="/v3/x",
        body=timestamp,
        public_key=MERCHANT_KEY.public_key,
        now=NOW,
    )
    assert (auth.mchid, auth.serial_no, auth.nonce_str) == (WECHAT_MCHID, "S1", "N1")

"""Alipay at the trust boundary: async notification form bodies (with their RSA2 signature) and
OpenAPI response texts. Only the documented refusals come out; what is accepted is what was
signed."""

from __future__ import annotations

import base64
import json
from urllib.parse import parse_qsl, urlencode

import httpx
from hypothesis import given
from hypothesis import strategies as st

from dueflow.exceptions import BadSignature, MalformedNotification, NotificationRejected
from dueflow.payments.alipay import signing
from dueflow.payments.alipay.provider import AlipayProvider
from tests.unit.fuzz import (
    ALIPAY_APP_ID,
    ALIPAY_SELLER_ID,
    MERCHANT_KEY,
    NOW,
    OTHER_KEY,
    PROVIDER_KEY,
    any_text,
    fuzz_settings,
    mutated_text,
    number_text,
    raises_only,
)

PROVIDER = AlipayProvider(
    gateway_url="http://alipay.invalid/gateway.do",
    app_id=ALIPAY_APP_ID,
    seller_id=ALIPAY_SELLER_ID,
    app_private_key=MERCHANT_KEY.private_pem(),
    alipay_public_key=PROVIDER_KEY.public_pem(),
    notify_url="http://dueflow.invalid/notify/alipay",
    client=httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(599))),
)
#: The notification refusals ``verify_notification`` documents (all NotificationRejected).
REFUSED = (NotificationRejected,)

VALID = {
    "notify_time": "2026-03-01 20:05:00",
    "notify_type": "trade_status_sync",
    "notify_id": "n1",
    "app_id": ALIPAY_APP_ID,
    "seller_id": ALIPAY_SELLER_ID,
    "charset": "utf-8",
    "version": "1.0",
    "sign_type": "RSA2",
    "trade_no": "2026030122001",
    "out_trade_no": "20260301aaaaaaaaaaaaaaaa",
    "trade_status": "TRADE_SUCCESS",
    "total_amount": "88.00",
}

field_values = st.one_of(any_text, number_text, st.sampled_from(["", "TRADE_CLOSED", "RSA", "r"]))


@st.composite
def signed_params(draw: st.DrawFn) -> dict[str, str]:
    """A notification signed by Alipay's key after fields were changed, added or dropped."""
    params = dict(VALID)
    for name in draw(st.lists(st.sampled_from(sorted(VALID)), max_size=3, unique=True)):
        params[name] = draw(st.one_of(field_values, mutated_text(params[name])))
    for name in draw(st.lists(st.sampled_from(sorted(VALID)), max_size=2, unique=True)):
        params.pop(name, None)
    extra = draw(
        st.dictionaries(st.sampled_from(["refund_fee", "out_biz_no", "body"]), field_values)
    )
    params.update(extra)
    key = draw(st.sampled_from([PROVIDER_KEY, PROVIDER_KEY, OTHER_KEY]))
    params["sign"] = signing.sign(params, key.private_key)
    return params


def encoded(params: dict[str, str]) -> bytes:
    return urlencode(params).encode()


@st.composite
def broken_bodies(draw: st.DrawFn) -> bytes:
    """A signed body broken after signing: cut short, a key repeated, a bad or foreign sign."""
    params = draw(signed_params())
    body = encoded(params)
    how = draw(st.sampled_from(["cut", "repeat", "sign", "bytes"]))
    if how == "cut":
        return body[: draw(st.integers(min_value=0, max_value=len(body)))]
    if how == "repeat":
        name = draw(st.sampled_from(sorted(params)))
        return body + b"&" + urlencode({name: draw(field_values)}).encode()
    if how == "sign":
        sign = draw(st.one_of(mutated_text(params["sign"]), any_text, st.just("!!!")))
        return encoded({**params, "sign": sign})
    cut = draw(st.integers(min_value=0, max_value=len(body)))
    return body[:cut] + draw(st.binary(min_size=1, max_size=8)) + body[cut:]


form_bodies = st.one_of(
    st.binary(max_size=200),
    st.dictionaries(any_text, any_text, max_size=5).map(encoded),
    signed_params().map(encoded),
    broken_bodies(),
)


@fuzz_settings(250)
@given(body=form_bodies)
def test_a_notification_is_what_alipay_signed_or_refused(body):
    note = raises_only(REFUSED, lambda: PROVIDER.verify_notification(body, {}, NOW))
    if note is None:
        return
    # Accepted: a form Alipay's key signed, for our app and seller, with a readable amount.
    params = dict(parse_qsl(body.decode()))
    assert params["app_id"] == ALIPAY_APP_ID and params["seller_id"] == ALIPAY_SELLER_ID
    assert note.pay_no and note.amount is not None and note.amount > 0


@fuzz_settings(200)
@given(params=st.one_of(st.dictionaries(any_text, any_text, max_size=5), signed_params()))
def test_verifying_a_signature_raises_only_the_documented_refusals(params):
    for verify in (signing.verify, signing.verify_request):
        raises_only(
            (MalformedNotification, BadSignature),
            lambda v=verify: v(params, PROVIDER_KEY.public_key),
        )
    # Signed as a request, verified as one: always good (the round trip).
    request = {k: v for k, v in params.items() if k != "sign_type"}
    request["sign"] = signing.sign(request, PROVIDER_KEY.private_key, request=True)
    signing.verify_request(request, PROVIDER_KEY.public_key)


METHOD = "alipay.trade.query"
contents = st.dictionaries(
    st.sampled_from(["code", "msg", "sub_code", "trade_status", "total_amount", "x{", "}"]),
    st.one_of(any_text, st.integers(), st.none(), st.lists(st.integers(), max_size=2)),
)


@st.composite
def response_texts(draw: st.DrawFn) -> str:
    """A response text: signed by Alipay, then maybe cut, nested deeply, re-keyed or junk."""
    content = draw(contents)
    text = signing.build_response(METHOD, content, PROVIDER_KEY.private_key)
    how = draw(st.sampled_from(["as is", "cut", "mutate", "nest", "repeat", "slashes", "junk"]))
    if how == "cut":
        return text[: draw(st.integers(min_value=0, max_value=len(text)))]
    if how == "mutate":
        return draw(mutated_text(text))
    if how == "nest":
        depth = draw(st.sampled_from([10, 2_000, 100_000]))
        nested = "[" * depth + "]" * depth
        return f'{{"{signing.response_key(METHOD)}":{nested},"sign":"x"}}'
    if how == "repeat":
        return text[:-1] + ',"sign":' + json.dumps(draw(any_text)) + "}"
    if how == "slashes":
        return text.replace("/", "\\/")
    if how == "junk":
        return draw(st.one_of(any_text, st.just("{"), st.just("[]"), st.just('{"sign":1}')))
    return text


@fuzz_settings(250)
@given(text=response_texts())
def test_a_response_is_what_alipay_signed_or_refused(text):
    raises_only((MalformedNotification,), lambda: signing.response_content(text, "sign"))
    parsed = raises_only(
        (MalformedNotification, BadSignature),
        lambda: signing.verify_response(text, METHOD, PROVIDER_KEY.public_key),
    )
    if parsed is None:
        return
    signed = signing.response_content(text, signing.response_key(METHOD))
    assert signed is not None and json.loads(signed.replace("\\/", "/")) == parsed


@fuzz_settings(100)
@given(content=contents)
def test_a_signed_response_reads_back_as_built(content):
    text = signing.build_response(METHOD, content, PROVIDER_KEY.private_key)
    assert signing.verify_response(text, METHOD, PROVIDER_KEY.public_key) == content
    forged = signing.build_response(METHOD, content, OTHER_KEY.private_key)
    assert (
        raises_only(
            (BadSignature,),
            lambda: signing.verify_response(forged, METHOD, PROVIDER_KEY.public_key),
        )
        is None
    )
    assert base64.b64decode(json.loads(text)["sign"], validate=True)

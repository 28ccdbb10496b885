"""Amounts in every provider format: Alipay's yuan strings, WeChat Pay's integer fen, and the
yuan text everything else is parsed from. Only the documented exceptions come out, and what is
accepted reads back as the same amount."""

from __future__ import annotations

import re
from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from dueflow.domain import money
from dueflow.exceptions import AmountMismatch, InvalidInput, MalformedNotification
from dueflow.payments import money_wire
from tests.unit.fuzz import any_int, any_text, fuzz_settings, mutated_text, number_text, raises_only

#: Valid amounts in fen, from one fen to the most a WeChat Pay trade carries.
fen = st.integers(min_value=1, max_value=money_wire.WECHAT_MAX_FEN)
#: Anything a JSON field can hold, as ``json.loads`` hands it over.
json_value = st.one_of(
    st.none(),
    st.booleans(),
    any_int,
    st.floats(allow_nan=True, allow_infinity=True),
    number_text,
    any_text,
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
#: An Alipay amount as written on the wire, and variants of one.
alipay_text = st.one_of(
    number_text,
    any_text,
    fen.map(lambda f: str(money.from_fen(f))).flatmap(
        lambda t: st.one_of(st.just(t), mutated_text(t))
    ),
)


@fuzz_settings(250)
@given(text=st.one_of(alipay_text, json_value))
def test_an_alipay_amount_is_digits_with_two_decimals_or_refused(text):
    amount = raises_only((MalformedNotification,), lambda: money_wire.parse_alipay_amount(text))
    if amount is None:
        return
    assert isinstance(text, str) and re.fullmatch(r"[0-9]{1,9}(\.[0-9]{1,2})?", text)
    assert Decimal(text) == amount and amount.as_tuple().exponent == -2
    assert Decimal("0.01") <= amount <= money_wire.ALIPAY_MAX_AMOUNT
    assert money_wire.parse_alipay_amount(money_wire.alipay_amount(amount)) == amount


@fuzz_settings(150)
@given(total=json_value)
def test_a_wechat_total_is_an_int32_of_fen_or_refused(total):
    amount = raises_only((MalformedNotification,), lambda: money_wire.parse_wechat_total(total))
    if amount is None:
        return
    assert type(total) is int and 1 <= total <= money_wire.WECHAT_MAX_FEN
    assert money_wire.wechat_total(amount) == total


@fuzz_settings(150)
@given(cents=fen, notified=st.one_of(alipay_text, json_value))
def test_checking_a_notified_amount_refuses_any_other(cents, notified):
    owed = money.from_fen(cents)
    for check in (money_wire.check_alipay_amount, money_wire.check_wechat_total):
        got = raises_only(
            (MalformedNotification, AmountMismatch), lambda c=check: c(notified, owed)
        )
        assert got is None or got == owed
    # The owed amount itself, in each provider's format, always passes (cut to Alipay's range).
    if owed <= money_wire.ALIPAY_MAX_AMOUNT:
        assert money_wire.check_alipay_amount(money_wire.alipay_amount(owed), owed) == owed
    assert money_wire.check_wechat_total(money_wire.wechat_total(owed), owed) == owed


@fuzz_settings(250)
@given(value=st.one_of(json_value, alipay_text, st.decimals(allow_nan=True, allow_infinity=True)))
def test_a_yuan_amount_is_exact_and_positive_or_refused(value):
    amount = raises_only((InvalidInput,), lambda: money.parse_yuan(value))
    if amount is None:
        return
    assert Decimal("0.01") <= amount <= money.MAX_AMOUNT
    assert amount == amount.quantize(money.CENT) and amount.is_finite()
    assert money.from_fen(money.to_fen(amount)) == amount
    # Into each provider's format and back: the same amount, or refused as out of its range.
    alipay = raises_only((InvalidInput,), lambda: money_wire.alipay_amount(amount))
    assert alipay is None or money_wire.parse_alipay_amount(alipay) == amount
    wechat = raises_only((InvalidInput,), lambda: money_wire.wechat_total(amount))
    assert wechat is None or money_wire.parse_wechat_total(wechat) == amount

"""Hypothesis fuzzing of the parsers at the trust boundary: what a provider, an operator's
environment or a settings file hands dueflow.

Every property has the same shape: the parser either returns a value that is sane (and
round-trips where there is a way back), or raises one of the exceptions its docstring names.
Anything else escaping is a bug. The strategies here mix plain junk with near-valid input: a
valid value with one field changed, cut short, padded with unicode, huge or negative numbers,
exponents, ``NaN`` and stray spaces.

The runs are derandomized (the same examples every run) and have no deadline, so that CI sees
the same verdict as a laptop.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from dueflow.payments.rsa import KeyPair, load_private_key
from dueflow.payments.simulator import SimulatorConfig
from tests.unit.payments import keys

#: When "now" is, for every parser that checks a timestamp: a fixed instant, never the wall clock.
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)

#: The fixed keys of the payment tests: the provider's (Alipay's key, WeChat Pay's platform key),
#: ours (the Alipay app key, the WeChat Pay merchant key) and a stranger's.
PROVIDER_KEY = KeyPair(load_private_key(keys.PROVIDER_PRIVATE_PEM))
MERCHANT_KEY = KeyPair(load_private_key(keys.MERCHANT_PRIVATE_PEM))
OTHER_KEY = KeyPair(load_private_key(keys.OTHER_PRIVATE_PEM))

ALIPAY_APP_ID = "2021000000000001"
ALIPAY_SELLER_ID = "2088000000000001"
WECHAT_APPID = "wx0000000000000001"
WECHAT_MCHID = "1900000001"
WECHAT_SERIAL = "PUB_KEY_ID_0119000000010000000000000000000001"
API_V3_KEY = "0123456789abcdef0123456789abcdef"


def fuzz_settings(examples: int) -> settings:
    """Hypothesis settings for one property: ``examples`` fixed examples, no deadline, no example
    database (a stored failure from another run must not change what this run tries)."""
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


def simulator_config(**options: Any) -> SimulatorConfig:
    """The simulator's configuration with the fixed ids and keys above (not fresh random ones), so
    every run signs the same bytes."""
    return SimulatorConfig(
        alipay_app_id=ALIPAY_APP_ID,
        alipay_seller_id=ALIPAY_SELLER_ID,
        alipay_app_key=MERCHANT_KEY,
        alipay_key=PROVIDER_KEY,
        wechat_appid=WECHAT_APPID,
        wechat_mchid=WECHAT_MCHID,
        wechat_merchant_serial="5157F09EFDC096DE15EBE81A47057A7232F1B8E1",
        wechat_merchant_key=MERCHANT_KEY,
        wechat_public_key_id=WECHAT_SERIAL,
        wechat_platform_key=PROVIDER_KEY,
        wechat_api_v3_key=API_V3_KEY,
        **options,
    )


def raises_only(documented: tuple[type[BaseException], ...], call: Callable[[], Any]) -> Any:
    """``call()``'s value, or None when it raised one of the ``documented`` exceptions; any other
    exception propagates and fails the property (hypothesis then shrinks it)."""
    try:
        return call()
    except documented:
        return None


#: Text of every kind: any unicode (surrogates excluded: they cannot come off the wire as str).
any_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=60)

#: Numbers written as text the way people and other systems write them, right and wrong.
number_text = st.one_of(
    st.from_regex(r"\A-?[0-9]{1,12}(\.[0-9]{0,4})?\Z"),
    st.sampled_from(
        [
            *["", " ", "0", "00", "-0", "1e3", "1E3", "NaN", "nan", "inf", "-inf", "Infinity"],
            *[" 12.5", "12.5 ", "12.555", "12.", ".5", "+1", "1_000", "0x10", "1,5", "١٢"],
            *["9" * 40, "1" + "0" * 400, "0." + "0" * 40 + "1", "12.50\n", "\u00a012"],
        ]
    ),
    st.integers().map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
)

#: Integers of every size, JSON's and beyond.
any_int = st.one_of(
    st.integers(min_value=-(2**64), max_value=2**64),
    st.sampled_from([0, 1, -1, 2**31 - 1, 2**31, 2**63, 10**30, 10**400, 10**5000, -(10**30)]),
)


def mutated_text(valid: str) -> st.SearchStrategy[str]:
    """``valid`` changed a little: cut short, a character replaced or inserted, padded, doubled,
    cased differently or emptied."""
    size = len(valid)
    positions = st.integers(min_value=0, max_value=size)
    char = st.characters(exclude_categories=["Cs"])
    return st.one_of(
        positions.map(lambda i: valid[:i]),
        st.tuples(positions, char).map(lambda t: valid[: t[0]] + t[1] + valid[t[0] :]),
        st.tuples(positions, char).map(lambda t: valid[: t[0]] + t[1] + valid[t[0] + 1 :]),
        st.sampled_from([" " + valid, valid + " ", valid * 2, valid.upper(), valid.lower(), ""]),
    )

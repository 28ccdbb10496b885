"""Durations as settings, TOML files and trigger URL options write them: ``30m``, ``1h30m``,
``250ms`` or seconds. Only ConfigError comes out, and what is accepted is a duration in range that
reads back the same."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from dueflow.domain import deadlines
from dueflow.exceptions import ConfigError
from tests.unit.fuzz import any_int, any_text, fuzz_settings, mutated_text, number_text, raises_only

UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

#: A well-formed duration: one to four parts of a number and a unit (``1h30m``, ``2.5s``).
parts = st.lists(
    st.tuples(st.integers(min_value=0, max_value=10_000), st.sampled_from(sorted(UNITS))),
    min_size=1,
    max_size=4,
)
well_formed = parts.map(lambda ps: "".join(f"{n}{unit}" for n, unit in ps))
#: Durations written as text: well-formed, near misses, numbers and junk.
duration_texts = st.one_of(
    well_formed,
    well_formed.flatmap(mutated_text),
    st.sampled_from(["", " ", "3x", "1h 30m", "1H30M", "-5s", "1e3s", "NaN", "inf", "5", "m"]),
    number_text,
    any_text,
)
#: Durations of every shape: text, and the values a TOML file or a caller gives instead.
durations = st.one_of(
    duration_texts,
    any_int,
    st.floats(allow_nan=True, allow_infinity=True),
    st.timedeltas(),
)


@fuzz_settings(400)
@given(value=durations)
def test_a_duration_is_in_range_or_refused(value):
    parsed = raises_only((ConfigError,), lambda: deadlines.parse_duration(value))
    if parsed is None:
        return
    assert timedelta(0) <= parsed <= deadlines.MAX_DURATION
    # Whole seconds read back from their short form.
    whole = timedelta(seconds=int(parsed.total_seconds()))
    assert deadlines.parse_duration(deadlines.format_duration(whole)) == whole


@fuzz_settings(200)
@given(written=parts)
def test_a_well_formed_duration_is_the_sum_of_its_parts(written):
    text = "".join(f"{n}{unit}" for n, unit in written)
    seconds = sum(n * UNITS[unit] for n, unit in written)
    parsed = raises_only((ConfigError,), lambda: deadlines.parse_duration(text))
    if seconds > deadlines.MAX_DURATION.total_seconds():
        assert parsed is None
    else:
        assert parsed is not None
        assert abs(parsed.total_seconds() - seconds) < 1e-3

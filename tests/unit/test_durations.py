from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmqkit.durations import (
    format_duration_ms,
    is_zero_duration,
    parse_delay_ms,
    parse_duration_ms,
)


@pytest.mark.parametrize(
    ("text", "ms"),
    [("500ms", 500), ("1s", 1000), ("1.5s", 1500), ("2m", 120000), ("1h", 3600000), (" 5s ", 5000)],
)
def test_parse(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["5 parsecs", "5", "", "s", "-1s", "0s", "1.0001ms", "5 sec"])
def test_parse_rejects_with_a_hint(text: str) -> None:
    with pytest.raises(ValueError, match="bad duration"):
        parse_duration_ms(text)


@pytest.mark.parametrize(
    ("ms", "text"),
    [(1000, "1s"), (120000, "2m"), (1500, "1500ms"), (3600000, "1h"), (90000, "90s")],
)
def test_format(ms: int, text: str) -> None:
    assert format_duration_ms(ms) == text


@given(st.integers(min_value=1, max_value=10**9))
def test_format_round_trips(ms: int) -> None:
    assert parse_duration_ms(format_duration_ms(ms)) == ms


@pytest.mark.parametrize(
    "text", ["0s", "0m", "0h", "0ms", "0.0s", "00s", " 0s ", "0", "0.000m", "0 ms"]
)
def test_every_zero_is_no_delay(text: str) -> None:
    assert is_zero_duration(text)
    assert parse_delay_ms(text) == 0


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("-0s", "must not be negative"),
        ("-5s", "must not be negative"),
        ("0e3s", "use a number"),
        ("soon", "use a number"),
        ("0.5ms", "below one millisecond"),
        ("", "use a number"),
    ],
)
def test_a_delay_still_refuses_negative_and_garbage(text: str, says: str) -> None:
    assert not is_zero_duration(text)
    with pytest.raises(ValueError, match=says):
        parse_delay_ms(text)


def test_a_nonzero_delay_parses_as_a_duration() -> None:
    assert parse_delay_ms("90s") == 90_000
    with pytest.raises(ValueError, match="greater than zero"):
        parse_duration_ms("0m")  # elsewhere (timeouts, intervals) zero is still refused

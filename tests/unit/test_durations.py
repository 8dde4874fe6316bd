from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmqkit.durations import format_duration_ms, parse_duration_ms


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

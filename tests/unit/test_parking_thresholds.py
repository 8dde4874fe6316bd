"""`rmqkit parking stats --max-count/--max-age` as a check: the verdict of
``rmqkit.parking.thresholds.judge`` (moved out of the CLI, issue 11), case by case.

The reasons are the text `stats` prints after ``PARKING <LABEL>:`` and in ``--json``'s
``why``; they must not change."""

from __future__ import annotations

import pytest

from rmqkit.durations import age_text
from rmqkit.parking.ops import ParkingStats
from rmqkit.parking.thresholds import StatsLimits, judge


def stats(
    matched: int = 0, oldest: float | None = None, consumers: int = 0, held: int = 0
) -> ParkingStats:
    return ParkingStats(
        "orders.parking",
        total=matched,
        matched=matched,
        oldest_age_s=oldest,
        other_consumers=consumers,
        held_by_others=held,
    )


@pytest.mark.parametrize(
    ("result", "limits", "status", "why"),
    [
        # No limit: no check, even with a consumer on the queue.
        (stats(500, 9999.0, consumers=1, held=3), StatsLimits(), 0, ()),
        (stats(5), StatsLimits(max_count=10), 0, ()),
        (stats(8), StatsLimits(max_count=10), 0, ()),  # 80 % exactly is not above it
        (stats(9), StatsLimits(max_count=10), 1, ("9 parked > 80% of 10",)),
        (stats(11), StatsLimits(max_count=10), 2, ("11 parked > 10",)),
        # Held messages count toward the limit, and another consumer is at least a warning.
        (
            stats(7, consumers=1, held=4),
            StatsLimits(max_count=10),
            2,
            (
                "11 parked > 10",
                "1 other consumer(s) hold 4 message(s) unacked (per the management API, "
                "which lags ~5 s): not inspected",
            ),
        ),
        (
            stats(0, consumers=2, held=0),
            StatsLimits(max_count=10),
            1,
            (
                "2 other consumer(s) hold 0 message(s) unacked (per the management API, "
                "which lags ~5 s): not inspected",
            ),
        ),
        # Ages, with the limit as the operator spelled it.
        (
            stats(1, 3000.0),
            StatsLimits(max_age_s=3600, max_age_text="1h"),
            1,
            ("oldest 50.0m > 80% of 1h",),
        ),
        (
            stats(1, 7200.0),
            StatsLimits(max_age_s=3600, max_age_text="60m"),
            2,
            ("oldest 2.0h > 60m",),
        ),
        (stats(1, 60.0), StatsLimits(max_age_s=3600, max_age_text="1h"), 0, ()),
        (stats(0, None), StatsLimits(max_age_s=1), 0, ()),  # an empty lane has no oldest
        # Without the spelling the limit is written from its seconds.
        (stats(1, 7200.0), StatsLimits(max_age_s=3600), 2, ("oldest 2.0h > 1h",)),
        # Both limits: each gives its reason, the worst status wins.
        (
            stats(9, 7200.0),
            StatsLimits(max_count=10, max_age_s=3600, max_age_text="1h"),
            2,
            ("9 parked > 80% of 10", "oldest 2.0h > 1h"),
        ),
    ],
)
def test_verdict(
    result: ParkingStats, limits: StatsLimits, status: int, why: tuple[str, ...]
) -> None:
    verdict = judge(result, limits)
    assert (verdict.status, verdict.why) == (status, why)
    assert verdict.label == ("OK", "WARNING", "CRITICAL")[status]


def test_age_text() -> None:
    assert [age_text(s) for s in (None, 0.4, 59, 60, 5400, 86400 * 3)] == [
        "-",
        "0s",
        "59s",
        "1.0m",
        "1.5h",
        "3.0d",
    ]

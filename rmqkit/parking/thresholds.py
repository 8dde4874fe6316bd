"""`rmqkit parking stats` as a monitoring check: limits on a parking queue and their verdict.

The verdict follows the Nagios plugin convention (0 ok, 1 warning, 2 critical): above a limit
is critical, above 80 % of it a warning. Messages another consumer holds unacked (a replay, an
export) cannot be inspected: they count toward ``max_count``, and while any other consumer is
on the queue the verdict is at least a warning, so an unseen lane is never reported as OK.
"""

from __future__ import annotations

from dataclasses import dataclass

from rmqkit.durations import age_text, format_duration_ms
from rmqkit.parking.model import ParkedFilter
from rmqkit.parking.ops import ParkingStats, parking_stats
from rmqkit.settings import Settings

WARNING_FRACTION = 0.8  # a warning above 80 % of a limit, before it is reached
LABELS = ("OK", "WARNING", "CRITICAL")


@dataclass(frozen=True)
class StatsLimits:
    """The check's limits; none given means no check (always ok).

    ``max_age_text`` is the limit as the operator spelled it (``1h``), repeated in the reasons;
    without it the age limit is spelled from ``max_age_s``.
    """

    max_count: int | None = None
    max_age_s: float | None = None
    max_age_text: str | None = None

    @property
    def given(self) -> bool:
        """Whether any limit is set (a plain `stats` call is no check)."""
        return self.max_count is not None or self.max_age_s is not None

    def age_label(self) -> str:
        """The age limit as shown in a reason."""
        if self.max_age_text is not None:
            return self.max_age_text
        return format_duration_ms(round((self.max_age_s or 0) * 1000))


@dataclass(frozen=True)
class StatsVerdict:
    """The check's status (0 ok, 1 warning, 2 critical) and the reasons for it."""

    status: int
    why: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """OK, WARNING or CRITICAL."""
        return LABELS[self.status]


@dataclass(frozen=True)
class ParkingCheck:
    """A parking queue's stats and their verdict against the limits."""

    stats: ParkingStats
    limits: StatsLimits
    verdict: StatsVerdict


def judge(stats: ParkingStats, limits: StatsLimits) -> StatsVerdict:
    """The verdict of ``stats`` against ``limits`` (pure)."""
    if not limits.given:
        return StatsVerdict(0)
    status = 0
    why: list[str] = []
    counted = stats.matched + stats.held_by_others
    max_count = limits.max_count
    if max_count is not None:
        if counted > max_count:
            status = 2
            why.append(f"{counted} parked > {max_count}")
        elif counted > WARNING_FRACTION * max_count:
            status = max(status, 1)
            why.append(f"{counted} parked > 80% of {max_count}")
    oldest, max_age = stats.oldest_age_s, limits.max_age_s
    if max_age is not None and oldest is not None:
        if oldest > max_age:
            status = 2
            why.append(f"oldest {age_text(oldest)} > {limits.age_label()}")
        elif oldest > WARNING_FRACTION * max_age:
            status = max(status, 1)
            why.append(f"oldest {age_text(oldest)} > 80% of {limits.age_label()}")
    if stats.other_consumers:
        status = max(status, 1)
        why.append(
            f"{stats.other_consumers} other consumer(s) hold {stats.held_by_others} "
            "message(s) unacked (per the management API, which lags ~5 s): not inspected"
        )
    return StatsVerdict(status, tuple(why))


async def check_parking(
    settings: Settings, queue: str, flt: ParkedFilter, limits: StatsLimits
) -> ParkingCheck:
    """Read the stats of ``queue`` (its messages matching ``flt``) and judge them."""
    stats = await parking_stats(settings, queue, flt)
    return ParkingCheck(stats, limits, judge(stats, limits))


__all__ = [
    "LABELS",
    "ParkingCheck",
    "StatsLimits",
    "StatsVerdict",
    "check_parking",
    "judge",
]

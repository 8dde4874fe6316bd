"""The ``dedupe-window-short`` check and the retry path it compares, without a broker."""

from __future__ import annotations

import pytest

from rmqkit.broker.snapshot import Snapshot
from rmqkit.consumer.policy import QueuePolicy
from rmqkit.health.checks import DEDUPE_CHECK, dedupe_window_short
from rmqkit.health.dedupe import retry_path_s
from rmqkit.health.doctor import run_checks
from rmqkit.health.findings import CheckSkipped, DedupeWindow, DoctorInput


def policy(delays_ms: tuple[int, ...], attempts: int) -> QueuePolicy:
    return QueuePolicy(
        queue="w",
        parking_queue="w.parking",
        retry_delays_ms=delays_ms,
        max_attempts=attempts,
        wait_queues=tuple((f"w.wait.{d}",) for d in delays_ms),
    )


@pytest.mark.parametrize(
    ("delays", "attempts", "seconds"),
    [
        ((1000, 5000, 30000, 120000), 5, 4 * 120.0),  # every retry may ask for the longest tier
        ((60000,), 3, 120.0),
        ((), 5, 0.0),  # no tier: parked at the first failure, no retry
        ((1000,), 1, 0.0),
    ],
)
def test_retry_path(delays: tuple[int, ...], attempts: int, seconds: float) -> None:
    assert retry_path_s(policy(delays, attempts)) == seconds


def inp(window_s: float | None, horizon_s: float | None, path_s: float = 480.0) -> DoctorInput:
    snapshot = Snapshot("/", (3, 10, 8), {}, {}, [], [], [], None)
    paths = {"w": (path_s, "4 retries (…), each up to the longest tier 2m")}
    return DoctorInput(
        snapshot=snapshot,
        roles={},
        dedupe=DedupeWindow("sqlite:///d.db", window_s, horizon_s, paths),
    )


def test_window_against_path_plus_horizon() -> None:
    assert dedupe_window_short(inp(3600 + 480, 3600)) == []  # exactly enough is enough
    (finding,) = dedupe_window_short(inp(3600 + 479, 3600))
    assert (finding.severity, finding.kind, finding.object) == (
        "warning",
        "store",
        "sqlite:///d.db",
    )
    (finding,) = dedupe_window_short(inp(None, None))
    assert "records no retention window" in finding.evidence
    assert "counted as 0" in finding.evidence


def test_skipped_without_a_store_and_not_in_the_default_checklist() -> None:
    with pytest.raises(CheckSkipped):
        dedupe_window_short(DoctorInput(snapshot=inp(1, 1).snapshot, roles={}))
    (result,) = run_checks(inp(60, None), (DEDUPE_CHECK,))
    assert (result.id, result.status) == ("dedupe-window-short", "warning")

"""The doctor check of the idempotent-consumer store (``doctor --dedupe DSN``, issue 13): its
retention window must outlast the latest a copy of a message can come back, or that copy is
applied a second time after its id was pruned (docs/doctor.md: dedupe-window-short).

Not in ``CHECKS``: doctor adds it only when given a store, so a plain run reports as before.
"""

from __future__ import annotations

from rmqkit.health.findings import Check, CheckSkipped, DoctorInput, Finding
from rmqkit.idempotency import format_window


def dedupe_window_short(inp: DoctorInput) -> list[Finding]:
    """The window is shorter than the longest retry path plus the declared parking replay
    horizon: a redelivered, retried or replayed copy can arrive after its id was pruned."""
    dedupe = inp.dedupe
    if dedupe is None:
        raise CheckSkipped("no --dedupe DSN given")
    horizon_s = dedupe.replay_horizon_s or 0.0
    horizon = (
        f"the parking replay horizon {format_window(horizon_s)} (--replay-horizon)"
        if dedupe.replay_horizon_s is not None
        else "no parking replay horizon (--replay-horizon not given: counted as 0)"
    )
    queue, (path_s, how) = max(
        dedupe.retry_paths.items(), key=lambda item: (item[1][0], item[0]), default=("", (0, ""))
    )
    path = (
        f"the longest retry path {format_window(path_s)} (work queue {queue}: {how})"
        if queue
        else "no retry path (no work queue with wait queues found)"
    )
    needed_s = path_s + horizon_s
    fix = (
        f"record a longer window, with a margin: `rmqkit dedupe init --dsn DSN --window "
        f"{_days_above(needed_s)}` (then prune with it), or replay parked messages sooner"
    )
    if dedupe.window_s is None:
        evidence = (
            "the store records no retention window, so nothing says how long ids are kept; "
            f"it must outlast {path} plus {horizon} = {format_window(needed_s)}"
        )
    elif dedupe.window_s < needed_s:
        evidence = (
            f"retention window {format_window(dedupe.window_s)} is shorter than {path} plus "
            f"{horizon} = {format_window(needed_s)}: a copy that comes back after its id was "
            "pruned is applied a second time"
        )
    else:
        return []
    return [Finding("dedupe-window-short", "warning", "store", dedupe.store, evidence, fix)]


def _days_above(seconds: float) -> str:
    """A round window above ``seconds``: whole days, twice the need, at least one day."""
    return f"{max(1, int(2 * seconds // 86400) + 1)}d"


DEDUPE_CHECK = Check(
    "dedupe-window-short",
    "dedupe store window shorter than retries plus replay horizon",
    dedupe_window_short,
)

__all__ = ["DEDUPE_CHECK", "dedupe_window_short"]

"""What ``rmqkit outbox relay`` is asked to do (``RelayOptions``) and what a run did
(``RelayReport``); ``parse_retention`` reads ``--retention``."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RelayOptions:
    """What ``rmqkit outbox relay`` was asked to do."""

    dsn: str
    batch: int = 200
    poll_s: float = 0.5
    once: bool = False
    retention_s: float | None = 7 * 86400.0
    metrics_port: int | None = None
    lease_s: float = 30.0  # SQLite: how long a relay's lease outlives its last renewal
    listen: bool = True  # PostgreSQL: LISTEN for commits (off: poll only, e.g. behind PgBouncer)
    pipelined: bool = False  # --order pipelined: a batch's rows of one aggregate in one round trip
    topology: str | None = None  # --topology: lanes and default delays (docs/outbox.md)
    grace_s: float = 10.0  # --grace: how long SIGTERM waits for the batch in flight
    # --failing-summary: how often a summary of the failing rows is logged while any are (None:
    # never; each row's failure is logged once either way: rmqkit.outbox.failures)
    failing_summary_s: float | None = 60.0


@dataclass
class RelayReport:
    """What a relay run did; ``left_pending`` is set by ``--once``."""

    published: int = 0
    returned: int = 0
    nacked: int = 0
    failed: int = 0
    batches: int = 0
    left_pending: int = 0
    errors: dict[str, str] = field(default_factory=dict)  # message_id -> last error (a sample)

    @property
    def exit_code(self) -> int:
        """0 when nothing is left pending, 3 (partial) otherwise."""
        return 3 if self.left_pending else 0


def parse_retention(text: str) -> float | None:
    """``--retention``: ``7d``, ``12h``, ``30m`` ... in seconds; ``off`` keeps every row."""
    from rmqkit.durations import parse_duration_ms

    spelled = text.strip().lower()
    if spelled in ("off", "none", "0"):
        return None
    if spelled.endswith("d") and spelled[:-1].replace(".", "", 1).isdigit():
        return float(spelled[:-1]) * 86400.0
    return parse_duration_ms(spelled) / 1000

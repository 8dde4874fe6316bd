"""``rmqkit parking groups``: a parking queue's messages grouped by how they failed.

One browse pass (the queue keeps every message); each message joins the group of its failure
fingerprint (``ParkedMessage.failure_id``, rmqkit.fingerprint). A group's row: how many, when
the first and the last of them were parked, the work queues they came from, how many failed
again after a replay (a fix that did not work), and one sample error, redacted like every other
view. ``--group ID`` (a prefix) then selects one group in list, stats, replay, purge and export.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rmqkit.fingerprint import normalise_message
from rmqkit.parking.browse import BrowseStats
from rmqkit.parking.model import ParkedFilter, ParkedMessage
from rmqkit.parking.ops import Progress, list_parked
from rmqkit.settings import Settings


@dataclass
class FailureGroup:
    """The parked messages that failed one way."""

    id: str
    reason: str
    error_type: str
    frame: str  # the innermost application frame, "file.py:function" ("" if unknown)
    pattern: str  # the error message with values normalised away
    sample: str | None  # one member's error message, redacted
    count: int = 0
    bytes: int = 0
    first_parked: datetime | None = None
    last_parked: datetime | None = None
    origins: Counter[str] = field(default_factory=Counter)
    failed_after_replay: int = 0  # members replayed at least once that were parked again

    def add(self, message: ParkedMessage) -> None:
        self.count += 1
        self.bytes += message.size
        self.origins[message.origin_queue or "-"] += 1
        if message.replays:
            self.failed_after_replay += 1
        parked = message.last_failed_at
        if parked is not None:
            if self.first_parked is None or parked < self.first_parked:
                self.first_parked = parked
            if self.last_parked is None or parked > self.last_parked:
                self.last_parked = parked

    def as_dict(self) -> dict[str, Any]:
        return {
            "group": self.id,
            "count": self.count,
            "reason": self.reason,
            "error_type": self.error_type or None,
            "frame": self.frame or None,
            "pattern": self.pattern,
            "sample_error": self.sample,
            "first_parked": _iso(self.first_parked),
            "last_parked": _iso(self.last_parked),
            "origins": dict(self.origins.most_common()),
            "failed_after_replay": self.failed_after_replay,
            "bytes": self.bytes,
        }


@dataclass
class ParkingGroups:
    """Every group of a parking queue's (matching) messages, the largest first."""

    queue: str
    matched: int = 0
    groups: list[FailureGroup] = field(default_factory=list)
    browse: BrowseStats | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "matched": self.matched,
            "groups": [g.as_dict() for g in self.groups],
        }


async def parking_groups(
    settings: Settings,
    queue: str,
    flt: ParkedFilter,
    *,
    redact: frozenset[str] = frozenset(),
    progress: Progress | None = None,
) -> ParkingGroups:
    """Group the messages of ``queue`` that match ``flt`` by failure; the queue keeps them all.
    ``redact``: the keys whose values are masked in the sample errors."""
    found: dict[str, FailureGroup] = {}
    result = ParkingGroups(queue)

    def join(message: ParkedMessage) -> None:
        result.matched += 1
        key = message.failure_id
        group = found.get(key)
        if group is None:  # the full fingerprint (frame, pattern) once per group
            failure = message.failure()
            sample = message.redacted_error(redact)
            # shown from the redacted text: a sensitive value the normalising left in (an
            # unquoted name) is masked in the pattern as in the sample
            pattern = normalise_message(sample) if redact else failure.pattern
            group = found[key] = FailureGroup(
                key, failure.reason, failure.error_type, failure.frame, pattern, sample
            )
        group.add(message)

    result.browse = await list_parked(settings, queue, flt, join, progress=progress)
    result.groups = sorted(found.values(), key=lambda g: (-g.count, g.id))
    return result


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat().replace("+00:00", "Z")

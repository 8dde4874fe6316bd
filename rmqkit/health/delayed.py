"""Delay ladders found on a live vhost, for `rmqkit status` and `rmqkit doctor` (issue 15).

A ladder (``rmqkit.delay``, docs/delay.md) is recognised by its rungs alone: a queue named
``{base}.{NN}-{ttl}`` that dead-letters into ``{base}.after-{NN}``, where ``base`` is
``{prefix}.{unit}``. No topology is needed, so status shows delayed messages whichever file
(or none) declared the ladder. Its counts come from ``Ladder.delayed_in`` over the
``/api/queues`` list status already has.

Which work queue a delayed message is for is in its own headers, which the management API does
not show: a ladder is attributed to a work queue only when it is that queue's own (prefix
``{queue}.delay``); a shared ladder's messages are shown in total.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rmqkit.broker.snapshot import Snapshot
from rmqkit.delay import Ladder, RungCount
from rmqkit.durations import parse_duration_ms

_RUNG = re.compile(r"^(?P<base>.+)\.(?P<bit>\d{2})-(?P<ttl>[0-9a-z.]+)$")
OWN_LADDER_SUFFIX = ".delay"  # a work queue's own ladder: prefix "{queue}.delay"


@dataclass(frozen=True)
class DelayedView:
    """One ladder on the vhost and what its rungs hold."""

    ladder: Ladder
    rungs: dict[str, RungCount]
    target: str | None  # the work queue of a per-queue ladder; None for a shared one

    @property
    def name(self) -> str:
        """The ladder's base name (``rmqkit.delay.100ms``)."""
        return self.ladder.base

    @property
    def waiting(self) -> int:
        """Messages waiting out their delay, all rungs together."""
        return sum(c.waiting for c in self.rungs.values())

    @property
    def stuck(self) -> int:
        """Messages due but not accepted by their target yet (docs/delay.md)."""
        return sum(c.stuck for c in self.rungs.values())

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "ladder": self.name,
            "for": self.target,
            "waiting": self.waiting,
            "stuck": self.stuck,
            "rungs": {n: {"waiting": c.waiting, "stuck": c.stuck} for n, c in self.rungs.items()},
        }


def rung_names(snapshot: Snapshot) -> dict[str, str]:
    """Every rung queue of the vhost → its ladder's base name."""
    found: dict[str, str] = {}
    for name, queue in snapshot.queues.items():
        match = _RUNG.match(name)
        if match is None:
            continue
        base, bit = match["base"], match["bit"]
        if queue.dead_letter_exchange == f"{base}.after-{bit}":
            found[name] = base
    return found


def _ladder(base: str, bits: Iterable[int], queue_type: str) -> Ladder | None:
    prefix, _, unit = base.rpartition(".")
    try:
        unit_ms = parse_duration_ms(unit)
        if queue_type == "classic":
            return Ladder(prefix, unit_ms, max(bits) + 1, "classic")
        return Ladder(prefix, unit_ms, max(bits) + 1, "quorum")
    except ValueError:  # not a ladder's name after all (a unit that does not parse)
        return None


def ladder_target(base: str, snapshot: Snapshot, rungs: Iterable[str] = ()) -> str | None:
    """The work queue a ladder is its own (prefix ``{queue}.delay``) when the vhost has that
    queue or queues of it (``{queue}.…``: a partitioned work queue is no queue itself)."""
    prefix = base.rpartition(".")[0]
    if not prefix.endswith(OWN_LADDER_SUFFIX):
        return None
    candidate = prefix.removesuffix(OWN_LADDER_SUFFIX)
    skip = set(rungs)
    if candidate in snapshot.queues or any(
        n.startswith(candidate + ".") and n not in skip and not n.startswith(prefix + ".")
        for n in snapshot.queues
    ):
        return candidate
    return None


def find_ladders(snapshot: Snapshot) -> list[DelayedView]:
    """The delay ladders of the vhost with their counts, by name."""
    rungs = rung_names(snapshot)
    by_base: dict[str, list[int]] = {}
    for name, base in rungs.items():
        by_base.setdefault(base, []).append(int(name[len(base) + 1 : len(base) + 3]))
    raw = [q.raw for q in snapshot.queues.values()]
    views: list[DelayedView] = []
    for base, bits in sorted(by_base.items()):
        first = snapshot.queues[next(n for n, b in rungs.items() if b == base)]
        ladder = _ladder(base, bits, first.type)
        if ladder is None:
            continue
        target = ladder_target(base, snapshot, rungs)
        views.append(DelayedView(ladder, ladder.delayed_in(raw), target))
    return views


__all__ = [
    "OWN_LADDER_SUFFIX",
    "DelayedView",
    "find_ladders",
    "ladder_target",
    "rung_names",
]

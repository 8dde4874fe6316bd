"""What the doctor checks share: which queues they look at, and durations as evidence shows them."""

from __future__ import annotations

from typing import Any

from rmqkit.broker.snapshot import QueueView, count
from rmqkit.health.findings import DoctorInput


def seconds_text(value: float) -> str:
    """A duration in seconds, spelled as short as it is exact: ``30s``, ``2m``, ``1.5h``."""
    for unit, size in (("h", 3600.0), ("m", 60.0)):
        if value >= size and value % size == 0:
            return f"{value / size:g}{unit}"
    return f"{value:g}s"


def ms_text(value: Any) -> str:
    """A milliseconds setting (``message-ttl``, ``expires``) as ``seconds_text``; ``?`` if not
    a number."""
    found = count(value)
    return "?" if found is None else seconds_text(found / 1000)


def plain_queues(inp: DoctorInput) -> list[QueueView]:
    """Queues worth checking: not exclusive (client-owned, gone with their connection)."""
    return [q for _, q in sorted(inp.snapshot.queues.items()) if not q.exclusive]

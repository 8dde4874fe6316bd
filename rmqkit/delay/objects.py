"""The broker objects of a delay ladder, as data: what ``Ladder.objects()`` returns, each able
to say how ``Session.declare`` takes it (``declare_kwargs``) — or to be mapped onto the topology's
own specs by ``rmqkit declare``/``plan``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class Exchange:
    """An exchange of the ladder (all are headers exchanges, durable)."""

    name: str
    internal: bool  # only the entry exchange takes publishes from clients

    def declare_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``exchange.declare`` (``Session.declare``)."""
        return {
            "exchange": self.name,
            "exchange_type": "headers",
            "durable": True,
            "auto_delete": False,
            "internal": self.internal,
        }


@dataclass(frozen=True)
class Queue:
    """A rung of the ladder: every message in it waits ``ttl_ms`` and moves on."""

    name: str
    bit: int
    ttl_ms: int
    arguments: dict[str, Any]

    def declare_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``queue.declare`` (``Session.declare``)."""
        return {"queue": self.name, "durable": True, "arguments": dict(self.arguments)}


@dataclass(frozen=True)
class Binding:
    """A headers binding (``x-match: all``) from a ladder exchange to a queue or exchange."""

    source: str
    destination: str
    destination_type: Literal["queue", "exchange"]
    match: dict[str, str] = field(default_factory=dict)

    @property
    def arguments(self) -> dict[str, Any]:
        return {"x-match": "all", **self.match}

    @property
    def label(self) -> str:
        tests = ", ".join(f"{k}={v}" for k, v in sorted(self.match.items())) or "everything"
        return f"{self.source} → {self.destination} ({tests})"

    def declare_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``queue.bind`` / ``exchange.bind`` plus ``label``, as
        ``Session.declare`` takes them."""
        common = {"routing_key": "", "arguments": self.arguments, "label": self.label}
        if self.destination_type == "exchange":
            return {"destination": self.destination, "source": self.source, **common}
        return {"queue": self.destination, "exchange": self.source, **common}


@dataclass(frozen=True)
class LadderObjects:
    """Everything one ladder needs on the broker, in declaration order."""

    exchanges: list[Exchange]
    queues: list[Queue]
    bindings: list[Binding]

    def declare_kwargs(
        self,
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
        """``(exchanges, queues, bindings)`` for ``Session.declare(*objects.declare_kwargs())``."""
        return (
            [e.declare_kwargs() for e in self.exchanges],
            [q.declare_kwargs() for q in self.queues],
            [b.declare_kwargs() for b in self.bindings],
        )

"""What the dedupe workers pass around: verdicts, ordering keys, options, and queued work."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any, Generic, TypeVar

R = TypeVar("R")


class HandlerEnd(Enum):
    """How a handler call ended, as far as its transaction is concerned."""

    OK = "ok"  # commit its writes
    FAILED = "failed"  # roll back its writes and its id
    ABANDONED = "abandoned"  # still running (timed out): the connection may be in use


class DedupeVerdict(StrEnum):
    """What happened to one message."""

    APPLIED = "applied"
    DUPLICATE = "duplicate"  # id already recorded: handler not called
    STALE = "stale"  # not newer than its key's applied version: handler not called
    ROLLED_BACK = "rolled_back"  # the handler failed: its writes and id rolled back


@dataclass(frozen=True)
class OrderKey:
    """The ordering guard's key (its exact bytes: rmqkit.guard.order_key) and version of one
    message."""

    key: bytes
    version: int


@dataclass(frozen=True)
class WorkerOptions:
    """``connections`` workers, at most ``batch`` messages per transaction; ids and versions are
    recorded in ``scope`` (None: the queue's own, ``queue``), ``queue`` kept with each id."""

    dsn: str
    queue: str
    scope: str | None = None
    connections: int = 4
    batch: int = 100
    pass_transaction: bool = False  # the handler takes an rmqkit.Transaction
    sync_connection: bool = False  # it runs in a thread: give it a sync connection
    ordered: bool = False  # messages carry an OrderKey (the guard runs)

    @property
    def effective_scope(self) -> str:
        """The scope ids and versions are recorded in."""
        return self.queue if self.scope is None else self.scope


@dataclass(eq=False)
class Job(Generic[R]):
    message_id: str
    order: OrderKey | None
    call: Callable[[Any], Awaitable[R]]
    future: asyncio.Future[tuple[DedupeVerdict, R | None]] = field(repr=False)

    def resolve(self, verdict: DedupeVerdict, outcome: R | None) -> None:
        if not self.future.done():
            self.future.set_result((verdict, outcome))

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


class Batch:
    """One transaction of claimed ids whose handlers run in their own delivery tasks.

    ``committed`` is set once the transaction ended; ``error`` then says whether it failed.
    (An Event rather than a shared future: a delivery cancelled while waiting must not cancel
    the others' wait, and shielding a future per waiter costs more than the wait itself.)
    """

    __slots__ = ("_reported", "committed", "error", "failed", "pending")

    def __init__(self) -> None:
        self.committed = asyncio.Event()
        self.error: BaseException | None = None
        self.pending = 0
        self.failed: list[str] = []
        self._reported = asyncio.Event()

    def report(self, message_id: str, ok: bool) -> None:
        if not ok:
            self.failed.append(message_id)
        self.pending -= 1
        if self.pending <= 0:
            self._reported.set()

    async def all_reported(self) -> None:
        if self.pending > 0:
            await self._reported.wait()

    def end(self, error: BaseException | None = None) -> None:
        self.error = error
        self.committed.set()


@dataclass(eq=False)
class Claim:
    message_id: str
    future: asyncio.Future[tuple[Batch, bool]] = field(repr=False)


class Abandoned(Exception):
    def __init__(self, job: Job[Any], outcome: Any) -> None:
        super().__init__("handler abandoned its transaction")
        self.job, self.outcome = job, outcome


__all__ = [
    "Abandoned",
    "Batch",
    "Claim",
    "DedupeVerdict",
    "HandlerEnd",
    "Job",
    "OrderKey",
    "WorkerOptions",
]

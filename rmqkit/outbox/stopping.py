"""How the outbox relay stops: SIGTERM sets ``Stopping``; work in flight then gets what is left
of the grace (``--grace``) and is cancelled after it.

Without it a relay waiting on confirms that never come (a memory or disk alarm blocks every
publishing connection; a connection that went silent) ignores SIGTERM until its supervisor
kills it, and a kill gives up the marks of the rows confirmed so far. With it, the rows
confirmed by then are marked and the rest stay pending, untouched.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


class GraceOver(Exception):
    """The work in flight outlasted the grace after a stop."""


class Stopping:
    """A stop request and its grace (module docstring)."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.event = asyncio.Event()
        self._deadline: float | None = None  # monotonic; set when the stop is first seen

    def request(self) -> None:
        """Stop (what SIGTERM does)."""
        self.event.set()

    def set(self) -> None:
        """The same as ``request`` (what an ``asyncio.Event`` in its place offered)."""
        self.request()

    def is_set(self) -> bool:
        """Whether a stop was requested."""
        return self.event.is_set()

    async def wait(self) -> None:
        """Until a stop is requested."""
        await self.event.wait()

    def grace_left(self) -> float:
        """Seconds left of the grace (counted from the first call after the stop)."""
        if self._deadline is None:
            self._deadline = time.monotonic() + self.grace_s
        return max(0.0, self._deadline - time.monotonic())

    async def guarded(self, work: Awaitable[T]) -> T:
        """Await ``work``; after a stop, for at most what is left of the grace: then it is
        cancelled and GraceOver raised."""
        task = asyncio.ensure_future(work)
        stopping = asyncio.ensure_future(self.event.wait())
        try:
            await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                await asyncio.wait({task}, timeout=self.grace_left())
            if task.done():
                return task.result()
            task.cancel()
            await asyncio.wait({task}, timeout=0.5)  # let it unwind; it is abandoned anyway
            raise GraceOver
        finally:
            stopping.cancel()
            if not task.done():
                task.cancel()

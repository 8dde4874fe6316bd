"""The threads plain ``def`` handlers run in, and the calls that outlived their timeout.

A thread cannot be stopped: a sync handler that hangs keeps its thread after its message timed
out (and went to retry). With a plain pool of ``concurrency`` threads, a few such calls fill it,
and every later message queues for a thread while its timeout runs: it times out without its
handler ever starting and is retried, then parked, for nothing (issue 9, finding 4).

So the pool has ``size`` threads for the handlers allowed to run at once plus ``spare`` threads
that only calls stuck past their timeout can occupy. The consumer never holds more messages than
``size`` (its prefetch is capped to the concurrency, see ConsumerConfig), so a handler always
finds a free thread at once and its timeout counts from its start. ``run_handler`` still waits
for a thread *before* it starts the timeout (``wait_for_thread``), should the pool ever be full.
When stuck calls hold as many threads as ``size`` (the spare is used up) the pool is
``exhausted``: the runner says so and recycles the worker process, the only way to get the
threads back.

All counters are read and written on the event loop's thread only; a stuck call's thread
reports its end through ``call_soon_threadsafe``. A call that ends normally costs no more than
``run_in_executor`` did: one submit and one wrapped future.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

THREAD_NAME_PREFIX = "rmqkit-handler"


class HandlerThreads:
    """``size`` handler threads, plus ``spare`` (default ``size``) for calls stuck past a timeout.

    ``on_change`` (if set) is called on the loop thread whenever ``stuck`` changes.
    """

    def __init__(self, size: int, *, spare: int | None = None) -> None:
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        self.size = size
        self.spare = size if spare is None else spare
        self._executor = ThreadPoolExecutor(
            max_workers=self.size + self.spare, thread_name_prefix=THREAD_NAME_PREFIX
        )
        self.busy = 0  # calls submitted and not yet seen to end
        self.stuck = 0  # of those, calls whose caller gave up (timeout, shutdown)
        self.on_change: Callable[[], None] | None = None
        self._free: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def full(self) -> bool:
        """Every thread is busy: a call submitted now would queue (and its clock would run)."""
        return self.busy >= self.size + self.spare

    @property
    def exhausted(self) -> bool:
        """Stuck calls hold as many threads as handlers may run at once: recycle the process."""
        return self.stuck >= self.size

    async def wait_for_thread(self) -> None:
        """Return once a thread is free (at once, unless the pool is full)."""
        while self.full:
            if self._free is None:
                self._free = asyncio.Event()
            self._free.clear()
            await self._free.wait()

    async def run(self, target: Callable[[Any], Any], argument: Any) -> Any:
        """``target(argument)`` in a thread, with the caller's context variables.

        Cancelling the caller (the handler timeout, a shutdown) does not stop the thread: the
        call is then counted in ``stuck`` until it really ends.
        """
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        call = functools.partial(contextvars.copy_context().run, target, argument)
        self.busy += 1
        future = self._executor.submit(call)
        try:
            result = await asyncio.wrap_future(future, loop=loop)
        except asyncio.CancelledError:
            if future.cancel():  # it had not started: nothing runs on
                self._ended()
            else:
                self.stuck += 1
                self._changed()
                future.add_done_callback(self._stuck_call_ended)
            raise
        except BaseException:
            self._ended()
            raise
        self._ended()
        return result

    def _stuck_call_ended(self, _: Future[Any]) -> None:
        # In the worker thread (or right here if it had just ended): hand over to the loop.
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the process is ending
                loop.call_soon_threadsafe(self._unstick)

    def _unstick(self) -> None:
        self.stuck -= 1
        self._ended()
        self._changed()

    def _ended(self) -> None:
        self.busy -= 1
        if self._free is not None:
            self._free.set()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def close(self) -> None:
        """Drop queued calls and let the threads go, without waiting for running ones."""
        self._executor.shutdown(wait=False, cancel_futures=True)


__all__ = ["THREAD_NAME_PREFIX", "HandlerThreads"]

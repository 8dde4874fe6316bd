"""The benchmark's handlers, loaded as ``bench.handlers:noop`` (run from the repository root).

Each records when it was first called (the first delivery) and how often, so every contender
is timed the same way; the bookkeeping is a few attribute writes per call.
"""

from __future__ import annotations

from time import perf_counter, process_time


class Clock:
    """Per-process: time and CPU time of the first handler call, and the number of calls."""

    first_wall = 0.0
    first_cpu = 0.0
    calls = 0


def _tick() -> None:
    if not Clock.calls:
        Clock.first_wall = perf_counter()
        Clock.first_cpu = process_time()
    Clock.calls += 1


# The parameters are deliberately unannotated: rmqkit then passes its Message (an annotation such
# as ``Any`` would make it validate the body as JSON), FastStream the body, aio-pika its message.


async def noop(message) -> None:  # type: ignore[no-untyped-def]
    """The success path: does nothing."""
    _tick()


async def fail_once(message) -> None:  # type: ignore[no-untyped-def]
    """The retry path (rmqkit only): a transient failure on attempt 1, success on attempt 2."""
    _tick()
    if message.attempt == 1:
        raise RuntimeError("bench: first attempt fails")

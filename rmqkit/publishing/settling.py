"""How ``rmqkit.Publisher`` waits for the broker: every confirm of a round or a stall
(``all_settled``), the backoff between rounds, the broker's max_message_size read from its
refusal, and the names of the ways a publish settles."""

from __future__ import annotations

import asyncio
import random

from rmqkit.broker.confirms import Outcome
from rmqkit.publishing.engine import size_limit

# PublishResult.outcome for each way the broker settles a publish
SETTLED = {
    Outcome.CONFIRMED: "confirmed",
    Outcome.RETURNED: "returned",
    Outcome.NACKED: "nacked",
}


async def all_settled(futures: list[asyncio.Future[Outcome]], timeout_s: float | None) -> bool:
    """Wait until all ``futures`` are done; False if ``timeout_s`` passed with none settling.
    One callback per future and an event: no wait() over thousands of futures per turn."""
    waiting = sum(1 for f in futures if not f.done())
    if not waiting:
        return True
    if timeout_s is None:  # no stall clock: one wait, no timer task per call
        await asyncio.wait([f for f in futures if not f.done()])
        return True
    progress = asyncio.Event()

    def one(_: asyncio.Future[Outcome]) -> None:
        nonlocal waiting
        waiting -= 1
        progress.set()

    for future in futures:
        if not future.done():
            future.add_done_callback(one)
    while waiting:
        progress.clear()
        try:
            await asyncio.wait_for(progress.wait(), timeout_s)
        except TimeoutError:
            return False
    return True


def size_limit_of(lost: BaseException | None) -> int | None:
    """The broker's max_message_size if ``lost`` is its refusal of a message over it (the
    same reading as `rmqkit publish`'s engine)."""
    return size_limit(str(lost)) if lost is not None else None


def backoff(attempt: int) -> float:
    """A random wait before retry ``attempt`` (half to all of a ceiling doubling up to 5 s)."""
    ceiling = min(5.0, 0.1 * 2**attempt)
    return random.uniform(ceiling / 2, ceiling)

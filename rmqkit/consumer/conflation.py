"""Conflation (``consume --conflate-key-header K``, seed 001 §5): of the messages one worker holds
with the same key, only the newest is handled; the ones it replaced are acked as ``superseded``.

For updates where only the latest state matters (a price, a position, a status): a burst of
100 updates to 10 keys should cost about 10 handler runs, not 100.

Per key, at most one handler runs at a time (so two updates of one key are never applied out of
order by concurrent handlers) and at most one message waits behind it: a message that arrives
while one of its key is running waits; a newer one arriving replaces the waiting one, which is
superseded at once. When the running handler finishes, the waiting message (the newest seen)
runs. A burst therefore runs a key's handler at most twice: the message that was already
running when the rest arrived, and the newest.

"Newest" is delivery order: the order of the queue, so the order of publishing for messages
published once. A retried message comes back at the tail of the queue, after newer updates of
its key, and then counts as the newest; use the ordering guard (``--dedupe`` with
``--order-key-header``/``--order-version-header``) where that matters. Conflation is per worker
process: with ``--processes N`` each worker conflates what it holds.

Messages without the header are handled as usual. Superseded messages are acked like successes
(after the newest of their key was received, not after it was handled: a failure of the newest
retries or parks the newest, which carries the latest state).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

# A key header's value: its text, or its bytes when they are not UTF-8 (see key_of).
ConflationKey = str | bytes


@dataclass
class _Key:
    waiting: asyncio.Future[bool] | None = None  # the newest message held behind the running one


class Conflation:
    """The per-key admission of one worker: ``await admit(key)``, then ``release(key)``."""

    def __init__(self) -> None:
        self._running: dict[ConflationKey, _Key] = {}  # keys running (or handed over)

    @property
    def keys_running(self) -> int:
        return len(self._running)

    async def admit(self, key: ConflationKey) -> bool:
        """True: handle the message now (call ``release(key)`` when done, whatever happened).
        False: a newer message with the same key replaced it; ack it unhandled."""
        state = self._running.get(key)
        if state is None:
            self._running[key] = _Key()
            return True
        if state.waiting is not None and not state.waiting.done():
            state.waiting.set_result(False)  # replaced by this newer one
        waiting: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        state.waiting = waiting
        try:
            return await waiting
        except asyncio.CancelledError:
            if state.waiting is waiting:
                state.waiting = None
            elif waiting.done() and not waiting.cancelled() and waiting.result():
                self.release(key)  # the turn was handed to us: pass it on
            raise

    def release(self, key: ConflationKey) -> None:
        """The handler admitted for ``key`` has finished: hand the turn to the waiting message."""
        state = self._running.get(key)
        if state is None:
            return
        waiting, state.waiting = state.waiting, None
        if waiting is not None and not waiting.done():
            waiting.set_result(True)  # still the key's turn: the waiting one runs next
        else:
            del self._running[key]


def key_of(value: object) -> ConflationKey | None:
    """A header value as a conflation key (None: no header, the message is handled as usual)."""
    if value is None:
        return None
    if isinstance(value, bytes | bytearray):
        # A Java client's byte[] key need not be UTF-8: such bytes stay bytes (decoded with
        # replacement characters, keys one byte apart would merge); UTF-8 bytes are the same
        # key as their text.
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return bytes(value)
    return str(value)

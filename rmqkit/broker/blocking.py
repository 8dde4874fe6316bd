"""A connection the broker blocks (a memory or disk alarm): noticed at once, and reported.

While any node of a cluster has a resource alarm, RabbitMQ stops reading from every connection
that publishes, and tells a client that asked for it (aiormq does) with ``connection.blocked``
and a reason: ``"low on memory"`` or ``"low on disk"``; ``connection.unblocked`` follows when the
alarms clear. Publishes are not refused, they wait: without a notice a publisher just hangs.

aiormq handles both frames itself and gives no callback: it closes its ``ready()`` gate and logs
a warning on the ``aiormq.connection`` logger, with the connection and the reason as the record's
arguments. ``BlockWatch`` listens there (a logging filter, public API), so it knows at once and
knows the reason. The rmqkit CLI quiets aiormq's logger (CRITICAL): the filter gives that logger
the WARNING level it needs and lets through only what the quieted level would have, so nothing
else of aiormq's shows up. Should a client version word the notice differently, ``check()``
still sees the closed gate (``Connection.ready()``, public): blocked, reason unknown.

    async with session.reporting_blocks(say=log.warning, every_s=10) as watch:
        ...  # publish; say() gets one line at once when blocked, again every 10 s, and on unblock

(``Session.reporting_blocks``; ``rmqkit publish`` and the outbox relay use it.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any

from rmqkit.broker.internals import AIORMQ_LOGGER, BLOCKED_NOTICE, UNBLOCKED_NOTICE

Say = Callable[[str], None]

_RESOURCE = {"memory": "memory", "disk": "disk"}


def alarm_kind(reason: str | None) -> str | None:
    """``"memory"`` or ``"disk"`` from the broker's reason (``"low on memory"``), else None."""
    text = (reason or "").lower()
    return next((kind for word, kind in _RESOURCE.items() if word in text), None)


def describe(reason: str | None) -> str:
    """The reason as an operator reads it: ``low on memory (a memory alarm in the cluster)``."""
    kind = alarm_kind(reason)
    if reason is None:
        return "reason not given (a memory or disk alarm in the cluster?)"
    if kind is None:
        return reason
    return f"{reason} (a {kind} alarm on a node of the cluster)"


class BlockWatch:
    """Whether the broker blocks one connection, since when and why.

    ``on_change(watch)`` runs on every change (from the event loop's thread, inside the
    client's frame reader: keep it short)."""

    def __init__(
        self, connection: Any, on_change: Callable[[BlockWatch], None] | None = None
    ) -> None:
        self._connection = connection  # the aiormq connection
        self._on_change = on_change
        self.blocked = False
        self.reason: str | None = None
        self.since: float | None = None  # time.monotonic() when it was blocked
        self.blocked_total_s = 0.0  # over the watch's life, the blocks that ended
        _register(connection, self)

    @property
    def blocked_for_s(self) -> float:
        """How long the current block lasts (0 when not blocked)."""
        return 0.0 if self.since is None else time.monotonic() - self.since

    def set_blocked(self, reason: str | None) -> None:
        """The broker blocked the connection (called by the notice listener)."""
        if self.blocked and (reason is None or reason == self.reason):
            return
        self.blocked, self.reason = True, reason if reason is not None else self.reason
        if self.since is None:
            self.since = time.monotonic()
        self._changed()

    def set_unblocked(self) -> None:
        """The broker unblocked the connection."""
        if not self.blocked:
            return
        self.blocked_total_s += self.blocked_for_s
        self.blocked, self.since = False, None
        self._changed()

    async def check(self) -> bool:
        """Whether the connection's ready() gate is closed although it is open: a block whose
        notice was not seen (a client that words it differently). Marks the watch blocked."""
        connection = self._connection
        if self.blocked or getattr(connection, "is_closed", True):
            return self.blocked
        try:
            await asyncio.wait_for(connection.ready(), timeout=0.05)
        except TimeoutError:
            if not connection.is_closed:
                self.set_blocked(None)
        return self.blocked

    def close(self) -> None:
        """Stop watching."""
        _unregister(self._connection, self)

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(self)


# --- the notice listener --------------------------------------------------------------------
_watches: weakref.WeakKeyDictionary[Any, list[BlockWatch]] = weakref.WeakKeyDictionary()


class _NoticeFilter(logging.Filter):
    """On aiormq's connection logger: turns its blocked/unblocked notices into BlockWatch
    changes (and drops them for watched connections: rmqkit reports those itself)."""

    quieted = False  # we lowered the logger to WARNING: pass only what its parent would

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg in (BLOCKED_NOTICE, UNBLOCKED_NOTICE) and isinstance(record.args, tuple):
            watches = _watches_of(record.args[0]) if record.args else []
            for watch in list(watches):
                if record.msg == BLOCKED_NOTICE:
                    reason = record.args[1] if len(record.args) > 1 else None
                    watch.set_blocked(None if reason is None else str(reason))
                else:
                    watch.set_unblocked()
            if watches:
                return False
        if self.quieted:
            parent = logging.getLogger(AIORMQ_LOGGER).parent
            return parent is None or record.levelno >= parent.getEffectiveLevel()
        return True


_FILTER = _NoticeFilter()


def _watches_of(connection: Any) -> list[BlockWatch]:
    try:
        return _watches.get(connection, [])
    except TypeError:  # not weak-referenceable: not a connection we watch
        return []


def _listen() -> None:
    """Make sure aiormq's notices reach the filter (idempotent; cheap)."""
    logger = logging.getLogger(AIORMQ_LOGGER)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
    if logger.level == logging.NOTSET or _FILTER.quieted:
        parent = logger.parent
        inherited = parent.getEffectiveLevel() if parent is not None else logging.WARNING
        # Only WARNING, never lower: aiormq logs every frame at DEBUG, a record per frame.
        _FILTER.quieted = inherited > logging.WARNING
        logger.setLevel(logging.WARNING if _FILTER.quieted else logging.NOTSET)


def _register(connection: Any, watch: BlockWatch) -> None:
    _listen()
    _watches.setdefault(connection, []).append(watch)


def _unregister(connection: Any, watch: BlockWatch) -> None:
    watches = _watches_of(connection)
    if watch in watches:
        watches.remove(watch)


# --- reporting ------------------------------------------------------------------------------
@contextlib.asynccontextmanager
async def reporting_blocks(
    connection: Any,
    say: Say,
    *,
    every_s: float = 10.0,
    progress: Callable[[], str] | None = None,
    what: str = "publishing",
) -> AsyncIterator[BlockWatch]:
    """Watch ``connection`` (aiormq) for the block: ``say`` one line at once when the broker
    blocks it, with the broker's reason, again every ``every_s`` while it lasts, and once when
    it ends. ``progress()`` adds the caller's state to each line (``"3 of 5 confirmed"``)."""
    changed = asyncio.Event()
    watch = BlockWatch(connection, lambda _: changed.set())

    def state() -> str:
        extra = progress() if progress is not None else ""
        return f"; {extra}" if extra else ""

    async def report() -> None:
        was_blocked = False
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout=every_s)
            changed.clear()
            if not watch.blocked:
                await watch.check()
            if watch.blocked:
                lasted = watch.blocked_for_s
                lead = (
                    f"broker still blocks {what} after {lasted:.0f}s"
                    if was_blocked and lasted >= 1
                    else f"broker blocks {what}"
                )
                say(f"{lead}: {describe(watch.reason)} — waiting, nothing is lost{state()}")
                was_blocked = True
            elif was_blocked:
                say(f"broker unblocked {what}{state()}")
                was_blocked = False

    task = asyncio.ensure_future(report())
    try:
        yield watch
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        watch.close()


__all__ = [
    "AIORMQ_LOGGER",
    "BLOCKED_NOTICE",
    "UNBLOCKED_NOTICE",
    "BlockWatch",
    "alarm_kind",
    "describe",
    "reporting_blocks",
]

"""Whether a consumer's queues are there to consume: its work queue, parking queue and wait
queues exist, and its work queue is still declared as when it was first consumed (a queue
deleted and declared again with other settings is not consumed). rmqkit.consumer.runner's
``QueueConsumer`` asks before every consume."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from rmqkit.broker.session import Session
from rmqkit.consumer.wiring import QueueIdentity, identity_changes, read_identity
from rmqkit.errors import RmqkitError
from rmqkit.settings import Settings

log = logging.getLogger("rmqkit.consumer")
IDENTITY_TIMEOUT_S = 5.0  # reading a queue's declaration through the management API


class QueueWatch:
    """The state of one work queue's checks across reconnects (see the module docstring)."""

    def __init__(self, settings: Settings, queue: str, *, missing_is_fatal: bool) -> None:
        self.settings = settings
        self.queue = queue
        # Until the first consume: a missing queue means the topology was never declared (78).
        # After it (or in a worker restarted by the supervisor): the queue was deleted under a
        # running consumer, which waits for it instead of stopping every queue it serves.
        self.missing_is_fatal = missing_is_fatal
        # What the consumed queue was declared as when first consumed (management API; None
        # until read, or if it could not be): a queue declared again otherwise is not consumed.
        self.identity: QueueIdentity | None = None
        self._identity_task: asyncio.Task[None] | None = None
        # Set when the queue may have been deleted and declared again (the broker cancelled our
        # consumer, or the queue was found missing): the next consume first compares its
        # declaration. Not on every reconnect: after a failover the management API of the lost
        # node may take its whole timeout to fail, and that would delay every reconnect.
        self.suspect = False
        self.missing: list[str] = []  # the queues found missing by the latest check

    def consumed(self) -> None:
        """The queue is consumed: from now on a missing queue is waited for, and its
        declaration is read once (in the background) to compare later ones with."""
        self.missing_is_fatal = False
        if self.identity is None and (self._identity_task is None or self._identity_task.done()):
            self._identity_task = asyncio.create_task(self._remember_identity())

    async def _read_identity(self) -> QueueIdentity | None:
        return await read_identity(self.settings, self.queue, IDENTITY_TIMEOUT_S)

    async def _remember_identity(self) -> None:
        self.identity = await self._read_identity()

    async def problem(self, conn: Session, others: Sequence[str]) -> str | None:
        """Why this consumer cannot consume now (a queue it needs is missing, or its own was
        declared again with other arguments), or None. ``others``: the parking and wait queues
        it needs besides its own."""
        queue = self.queue
        missing = self.missing = []
        for name in (queue, *others):
            try:
                exists = await conn.queue_exists(name)
            except RmqkitError as exc:
                # A lost connection or a broker error while probing (the session maps them):
                # reconnect, as for any other failure on this connection.
                raise ConnectionError(str(exc)) from exc
            if not exists:
                missing.append(name)
        if missing:
            self.suspect = True
        if missing == [queue]:
            return f"queue {queue!r} does not exist (deleted?): not consuming it until it is back"
        if missing:
            names = ", ".join(repr(n) for n in missing)
            which = "queue" if len(missing) == 1 else "queues"
            verb = "does" if len(missing) == 1 else "do"
            return f"{which} {names} {verb} not exist (deleted?): not consuming {queue!r}"
        if self.identity is None or not self.suspect:
            return None
        now = await self._read_identity()
        if now is None:
            log.warning(
                "could not read how queue %r is declared now (management API); consuming it "
                "without checking that it is declared as when this consumer started",
                queue,
            )
            self.suspect = False
            return None
        changes = identity_changes(self.identity, now)
        if not changes:
            self.suspect = False
            return None
        return (
            f"queue {queue!r} is declared with other settings than when this consumer started "
            f"({'; '.join(changes)}): not consuming it — declare it as the topology says "
            "(delete it, then `rmqkit declare`), or restart the consumer to accept it"
        )

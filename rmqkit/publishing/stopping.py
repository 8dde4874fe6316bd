"""Ctrl-C during `rmqkit publish`: stop reading input, give the messages in flight a moment to be
confirmed, then say exactly what was published and confirmed, and how to resume.

Asyncio turns the first SIGINT into a cancellation of the command's task; ``Stop.guard`` runs the
publishing loop shielded from it, so the loop sees ``requested``, sends nothing more and waits for
the confirms of what it sent (at most ``GRACE_S``). A second Ctrl-C ends the process at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from rmqkit.errors import PublishStopped

if TYPE_CHECKING:
    from rmqkit.publishing.inputs import OutgoingMessage
    from rmqkit.publishing.report import PublishReport

GRACE_S = 5.0  # how long the confirms of the messages in flight are waited for after Ctrl-C


class Stop:
    """Whether the user asked the run to stop, and where in the input each message sent came
    from (its line, or ``--body`` index): the interrupted run's message names them."""

    def __init__(self, report: PublishReport, *, repeatable_ids: bool = True) -> None:
        self.report = report
        self.repeatable_ids = repeatable_ids
        self.requested = False
        self.waiting: dict[int, int | None] = {}  # number in the run → input position
        self.last: int | None = None  # the input position of the last message sent
        self.stdin = True  # positions are lines of stdin (not --body indexes)

    def sent(self, number: int, message: OutgoingMessage) -> None:
        """``message``, the ``number``-th of the run, was handed to the broker."""
        # ``<stdin>:12`` (a line), ``--body 2`` (inputs.py); anything else: no position
        body = message.where.startswith("--body ")
        position = message.where.split(" ")[-1] if body else message.where.rpartition(":")[2]
        self.last = int(position) if position.isdigit() else None
        self.stdin = not body
        self.waiting[number] = self.last

    def settled(self, number: int) -> None:
        """The broker settled the ``number``-th message (confirmed, returned or refused)."""
        self.waiting.pop(number, None)

    async def guard(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work``; on cancellation (Ctrl-C) set ``requested``, wait up to ``GRACE_S`` for
        it to finish what it sent, and raise PublishStopped saying what was done."""
        task = asyncio.ensure_future(work)
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                raise
            self.requested = True
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(task), GRACE_S)
            if not task.done():
                task.cancel()
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await task
            raise PublishStopped(self.message(), self.report) from None

    def message(self) -> str:
        """The one line of an interrupted run: counts, the input read, how to resume."""
        report = self.report
        counts = (
            f"{report.published} message(s) published, {report.confirmed} confirmed (on their "
            "queues)"
        )
        refused = report.returned + report.nacked + report.too_large
        if refused:
            counts += f", {refused} returned or refused"
        unit = "line" if self.stdin else "--body"
        if report.published == 0 or self.last is None:
            return f"interrupted: {counts}" + (
                "; nothing was sent" if report.published == 0 else ""
            )
        same_ids = (
            "the same message_ids, which a consumer deduplicating by message_id drops"
            if self.repeatable_ids
            else "new random message_ids (--random-ids): a consumer cannot recognise copies"
        )
        if self.waiting:
            positions = sorted(p for p in self.waiting.values() if p is not None)
            first = positions[0] if positions else self.last
            state = (
                f"{len(self.waiting)} sent without a confirm ({unit}s {first}-{self.last}), "
                "which may be on the queue"
            )
            skip = first - 1
            again = f"those are sent again under {same_ids}"
        else:
            state = f"the last sent was {unit} {self.last} of the input"
            skip = self.last
            again = (
                f"a rerun of the whole input instead sends those {report.confirmed} again under "
                f"{same_ids}"
            )
        if not self.stdin:
            return (
                f"interrupted: {counts}; {state} — to resume, publish the --body values after "
                f"the first {skip}; {again}"
            )
        return (
            f"interrupted: {counts}; {state} — to resume, run the same command on the same "
            f"input with --skip {skip} (the lines after it keep their numbers, so their "
            f"message_ids); {again}"
        )

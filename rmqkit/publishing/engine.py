"""`rmqkit publish`'s engine: a stream of ``OutgoingMessage`` published persistent, ``mandatory``,
with confirms in a pipelined window, with busy retries, block notices, the stall timeout and
its give-up message naming exactly which messages were confirmed."""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from datetime import UTC, datetime
from typing import Any

from rmqkit.broker.amqp import map_channel_error
from rmqkit.broker.blocking import BlockWatch, describe
from rmqkit.broker.codec import Properties
from rmqkit.broker.session import Channel, Outcome, Session, open_session
from rmqkit.errors import BrokerUnavailable, RmqkitError
from rmqkit.publishing.inputs import OutgoingMessage
from rmqkit.publishing.report import PublishReport
from rmqkit.publishing.stopping import Stop
from rmqkit.publishing.targets import require_target
from rmqkit.settings import Settings
from rmqkit.tracing import Tracing, tracing

DEFAULT_WINDOW = 1000
Progress = Callable[[int], None]
Notice = Callable[[str], None]  # one line for the operator (the CLI prints it on stderr)


async def publish_messages(
    settings: Settings,
    exchange: str,
    routing_key: str,
    messages: Iterable[OutgoingMessage],
    *,
    window: int = DEFAULT_WINDOW,
    retry_busy: bool = False,
    busy_retries: int = 8,
    progress: Progress | None = None,
    repeatable_ids: bool = True,
    notice: Notice | None = None,
    notice_every_s: float = 10.0,
    timeout_s: float | None = None,
    prepare: Callable[[Session], Awaitable[None]] | None = None,
) -> PublishReport:
    """Publish ``messages`` persistent, ``mandatory``, with confirms, ``window`` in flight.

    ``repeatable_ids``: whether publishing the same input again gives the same message_ids (see
    ``IdSource``); it decides what a lost connection's error advises.

    A nack (the broker refused: typically a bounded queue with ``overflow=reject-publish``)
    is *busy*: retried with backoff and jitter when ``retry_busy``, else counted. A returned
    message (unroutable) is counted, never retried.

    When the broker blocks the connection (a memory or disk alarm) the publish waits, and
    ``notice`` gets one line at once with the broker's reason, again every ``notice_every_s``
    and when the block ends. ``timeout_s``: give up when the broker has confirmed nothing for
    that long while messages wait for it (blocked, or a queue without a leader) — a
    BrokerUnavailable (69) saying exactly which messages were confirmed.

    ``prepare``: awaited on the session before the first publish (``rmqkit publish --delay``
    declares the delay ladder and its exits there). A message's own ``exchange`` (a lane, the
    ladder's entry) overrides ``exchange``.
    """
    report = PublishReport()
    tracker = _Tracker()
    stop = Stop(report, repeatable_ids=repeatable_ids)  # Ctrl-C: what was done, how to resume
    amqp = await open_session(settings, name=f"rmqkit publish {exchange or '(default)'}")
    try:
        await require_target(settings, amqp, exchange)  # a queue's name: says how to reach it
        if prepare is not None:
            await prepare(amqp)
        link = _Link(amqp, window, tracing(settings.tracing))
        await link.open()
        slots = asyncio.Semaphore(window)
        done = 0

        failures: list[BaseException] = []

        async def send(number: int, message: OutgoingMessage) -> None:
            nonlocal done
            try:
                confirmed = await _send_one(
                    link, exchange, routing_key, message, report, retry_busy, busy_retries
                )
            except Exception as exc:  # the connection is gone: stop feeding, report once
                failures.append(exc)
            else:
                tracker.settled(number, confirmed)
                stop.settled(number)
            finally:
                slots.release()
                done += 1
                if progress is not None and done % 1000 == 0:
                    progress(done)

        async def feed() -> None:
            tasks: set[asyncio.Task[None]] = set()
            for message in messages:
                await slots.acquire()
                if failures or stop.requested:
                    break
                report.published += 1
                tracker.sent(report.published, message.message_id)
                stop.sent(report.published, message)
                task = asyncio.ensure_future(send(report.published, message))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.gather(*tasks)

        def so_far() -> str:
            return f"{report.confirmed} of {report.published} message(s) confirmed so far"

        async with amqp.reporting_blocks(
            notice or (lambda _: None), every_s=notice_every_s, progress=so_far
        ) as watch:
            if timeout_s is None:
                await stop.guard(feed())
            else:
                await stop.guard(_within(feed(), tracker, timeout_s, report, watch, repeatable_ids))
        await link.channel.publisher.close()
        if progress is not None:
            progress(done)
        if failures:
            error = failures[0]
            if isinstance(error, RmqkitError):
                error.args = (f"{error} — {rerun_advice(report.confirmed, repeatable_ids)}",)
            raise error
        await link.channel.close()
    finally:
        # A blocked connection is not read by the broker: its close is never answered, and
        # aiormq gives up on it after a few seconds; do not wait longer than that.
        with contextlib.suppress(Exception, TimeoutError):
            await asyncio.wait_for(amqp.close(), timeout=5)
    return report


class _Link:
    """The run's confirm channel. The broker closes it for a message over its
    ``max_message_size``: that message is refused for good (``too_large``), a new channel is
    opened once, and the messages that were in flight with it are sent again on it (their
    first copy's fate is unknown: duplicates are possible, loss is not)."""

    def __init__(self, amqp: Session, window: int, tracing: Tracing | None = None) -> None:
        self.amqp = amqp
        self.window = window
        self.tracing = tracing  # a `create` span per message, its context in the headers
        self.limit: int | None = None  # the broker's max_message_size, once it refused one
        self.channel: Channel
        self._lock = asyncio.Lock()

    async def open(self) -> None:
        self.channel = await self.amqp.channel(confirms=True, window=self.window)

    async def reopen(self, failed: Channel) -> None:
        """A new channel, unless another message's failure on ``failed`` opened one already."""
        async with self._lock:
            if self.channel is failed:
                with contextlib.suppress(Exception):
                    await failed.publisher.close()
                await self.open()

    def refusal(self, exc: BaseException, channel: Channel) -> int | None:
        """The broker's max_message_size if ``channel`` failed because it refused a message
        over it (this one's, or another's in flight with it), else None."""
        limit = size_limit(str(exc))
        if limit is None and channel.is_closed:  # "channel closed": closed for which message?
            limit = size_limit(channel.closed_reason())
        if limit is not None:
            self.limit = limit
        return limit


# RabbitMQ's channel close for a message over max_message_size (PRECONDITION_FAILED).
_TOO_LARGE = re.compile(r"message size \d+ is larger than configured max size (\d+)")


def size_limit(text: str) -> int | None:
    """The broker's max_message_size if ``text`` is its refusal of a message over it."""
    found = _TOO_LARGE.search(text)
    return int(found.group(1)) if found else None


class _Tracker:
    """Which messages (by their order in the input, 1-based) wait for the broker, and when it
    last settled one: the stall timeout and the give-up message read it."""

    def __init__(self) -> None:
        self.waiting: dict[int, str] = {}  # number → message_id, sent and not settled
        self.refused: set[int] = set()  # settled as returned or nacked
        self.last_progress = time.monotonic()

    def sent(self, number: int, message_id: str) -> None:
        if not self.waiting:  # the clock runs only while something waits for the broker
            self.last_progress = time.monotonic()
        self.waiting[number] = message_id

    def settled(self, number: int, confirmed: bool) -> None:
        self.waiting.pop(number, None)
        if not confirmed:
            self.refused.add(number)
        self.last_progress = time.monotonic()

    def stalled_s(self) -> float:
        return time.monotonic() - self.last_progress if self.waiting else 0.0


async def _within(
    work: Coroutine[Any, Any, None],
    tracker: _Tracker,
    timeout_s: float,
    report: PublishReport,
    watch: BlockWatch,
    repeatable_ids: bool,
) -> None:
    """Run ``work``; cancel it and raise BrokerUnavailable once the broker has settled nothing
    for ``timeout_s`` while messages wait for it."""
    task = asyncio.ensure_future(work)
    while not task.done():
        left = timeout_s - tracker.stalled_s()
        if left <= 0:
            await watch.check()  # blocked, even if the notice was missed? (for the message)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise BrokerUnavailable(_gave_up(tracker, timeout_s, report, watch, repeatable_ids))
        await asyncio.wait({task}, timeout=max(0.05, min(left, 1.0)))
    task.result()


def _ranges(numbers: list[int]) -> str:
    """``[1, 2, 3, 5]`` → ``"1-3, 5"`` (at most 6 ranges, then "…")."""
    spans: list[tuple[int, int]] = []
    for n in sorted(numbers):
        if spans and n == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], n)
        else:
            spans.append((n, n))
    text = [f"{a}-{b}" if a != b else str(a) for a, b in spans[:6]]
    return ", ".join(text) + (", …" if len(spans) > 6 else "")


def _gave_up(
    tracker: _Tracker,
    timeout_s: float,
    report: PublishReport,
    watch: BlockWatch,
    repeatable_ids: bool,
) -> str:
    """The one-line give-up message: why, and exactly which messages the broker confirmed."""
    waiting = sorted(tracker.waiting)
    confirmed = [
        n
        for n in range(1, report.published + 1)
        if n not in tracker.waiting and n not in tracker.refused
    ]
    ids = ", ".join(tracker.waiting[n] for n in waiting[:3]) + (", …" if len(waiting) > 3 else "")
    which = f" (messages {_ranges(confirmed)} in input order)" if confirmed else ""
    refused = (
        f"; returned (unroutable) or refused (busy): messages {_ranges(sorted(tracker.refused))}"
        if tracker.refused
        else ""
    )
    if watch.blocked:
        why = f"the broker blocks publishing: {describe(watch.reason)}"
        # Seen on 3.10: what the broker had not read yet when we gave up, it reads and
        # enqueues once the alarm clears, even after the connection was closed.
        fate = "the broker may still take them when the alarm clears"
    else:
        why = "the broker confirmed nothing (a quorum queue without a leader? a lost network?)"
        fate = "their fate is unknown"
    again = (
        "run the same command with the same input again once that is resolved: every message "
        "gets the same message_id, so consumers can recognise any that arrive twice"
        if repeatable_ids
        else "publish those again once that is resolved (with --random-ids a rerun of the "
        "whole input would repeat the confirmed ones under new message_ids)"
    )
    return (
        f"gave up after {timeout_s:g}s without a confirm — {why}. Nothing is lost: the broker "
        f"confirmed {report.confirmed} of the {report.published} message(s) sent{which}"
        f"{refused}; not confirmed: messages {_ranges(waiting)} (message_id {ids}), {fate} — "
        f"{again}"
    )


def rerun_advice(confirmed: int, repeatable_ids: bool) -> str:
    """What to do after a run stopped with some messages unconfirmed (their fate unknown)."""
    done = f"{confirmed} message(s) were confirmed before this; the others are unknown"
    if repeatable_ids:
        return (
            f"{done}: run the same command with the same input again — every message gets the "
            "same message_id again, so consumers can recognise the ones that arrive twice"
        )
    return (
        f"{done}: publishing the input again repeats the confirmed ones under new random "
        "message_ids (--random-ids), which consumers cannot recognise as duplicates — check "
        "what arrived and publish only the missing ones"
    )


async def _send_one(
    link: _Link,
    exchange: str,
    routing_key: str,
    message: OutgoingMessage,
    report: PublishReport,
    retry_busy: bool,
    busy_retries: int,
) -> bool:
    """Publish one message until it is settled; whether the broker confirmed it (False:
    returned, too large, or nacked after the busy retries)."""
    key = message.routing_key if message.routing_key is not None else routing_key
    if message.exchange is not None:
        exchange = message.exchange
    headers = message.headers
    if link.tracing is not None:
        headers = dict(headers or {})
        with link.tracing.sending(
            "create",
            exchange=exchange,
            routing_key=key,
            message_id=message.message_id,
            body_size=len(message.body),
        ):
            link.tracing.inject(headers)
    properties = Properties(
        delivery_mode=2,
        message_id=message.message_id,
        timestamp=datetime.now(UTC),  # first publish: copies keep it (the message's age)
        headers=headers,
        content_type=message.content_type,
        correlation_id=message.correlation_id,
        message_type=message.message_type,
        expiration=message.expiration,
        priority=message.priority,
        app_id=message.app_id,
    )
    attempt = 0
    while True:
        if link.limit is not None and len(message.body) > link.limit:
            report.too_large += 1  # refused for good: sent again, it closes the channel again
            report.too_large_ids.append(message.message_id)
            report.max_message_bytes = link.limit
            return False
        channel = link.channel
        try:
            settled = await channel.publisher.publish(
                message.body, exchange=exchange, routing_key=key, properties=properties
            )
            outcome = await settled
        except Exception as exc:
            if link.refusal(exc, channel) is not None:
                if len(message.body) <= (link.limit or 0):
                    await link.reopen(channel)  # closed for another message: send this again
                continue  # (too large: counted at the top)
            mapped = map_channel_error(exc, f"publishing to exchange {exchange!r}")
            if mapped is None:
                raise
            raise mapped from exc
        if outcome is Outcome.CONFIRMED:
            report.confirmed += 1
            return True
        if outcome is Outcome.RETURNED:
            report.returned += 1
            report.returned_ids.append(message.message_id)
            report.returned_to.append((exchange, key))
            return False
        if not retry_busy or attempt >= busy_retries:
            report.nacked += 1
            report.nacked_ids.append(message.message_id)
            return False
        attempt += 1
        report.retried += 1
        ceiling = min(10.0, 0.1 * 2**attempt)
        await asyncio.sleep(random.uniform(ceiling / 2, ceiling))

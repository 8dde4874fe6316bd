"""Confirmed, ``mandatory`` publishing on one aiormq channel, with returns matched exactly.

Why not ``aiormq.Channel.basic_publish``: it matches a returned message to its publish by
``message_id``. A copy rmqkit sends (a replay, a retry, an import) keeps the id of the message
it copies, and that id may be missing or shared by several messages in flight. A return that
aiormq cannot match is logged and dropped, and the broker's ack that follows resolves the
publish as confirmed: the caller acks the original and the message is gone from both places.

``ConfirmedPublisher`` matches a return by what the broker sends back, exchange, routing key,
message_id (missing included) and body, and never has two publishes with the same four in
flight at once (a second one waits for the first to settle), so the match is exact. Only exact
duplicates wait for each other: the same body with the same id (or both without one). A return
it cannot match (it should not happen) settles every in-flight publish to that exchange and key
as returned: a copy may then exist twice, but none is reported confirmed when it was not.

It is also cheaper than ``basic_publish``: no coroutine or lock per message, and the frames of
all the publishes made between two event-loop turns go to the socket in one write.

The publisher owns the channel's publishing: nothing else may publish on it (aiormq numbers
publishes itself, and the numbers must follow the order on the wire).

It works through aiormq internals (the confirm table, the write queue, the reader's return
handler), all in ``rmqkit.broker.internals``. Before the process's first publisher is made,
``check_return_handling`` proves on a fake frame exchange that a returned message without a
message_id reaches this publisher's hook, and refuses (``UnsupportedDependency``, exit 78)
otherwise: an aiormq that bypasses the hook would turn every such return into a loss.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
from collections.abc import Iterable
from typing import Any, Final

import aiormq
import pamqp.frame
from pamqp import commands as spec
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from rmqkit.broker import internals

# The start-up probe (check_return_handling): a returned message without a message_id, played
# through a real aiormq channel without a broker. Its result holds for the process.
_PROBE_KEY: Final = "rmqkit.return-probe"
_PROBE_BODY: Final = b"rmqkit return probe"
_PROBE_TIMEOUT_S: Final = 5.0
_PROBE_THREAD: Final = "rmqkit-return-probe"
_probe_lock = threading.Lock()
_probe_result: list[str | None] = []  # [] not run yet, [None] passed, [problem] failed


class Outcome(enum.Enum):
    """How the broker settled one publish. Truthy only for ``CONFIRMED``."""

    CONFIRMED = "confirmed"  # routed to at least one queue and taken by all (basic.ack)
    RETURNED = "returned"  # no queue took it (basic.return): the copy does not exist
    NACKED = "nacked"  # refused, e.g. a full queue with reject-publish (basic.nack)

    def __bool__(self) -> bool:
        return self is Outcome.CONFIRMED


def outcome_of(settled: asyncio.Future[Outcome]) -> Outcome | str:
    """A settled publish's ``Outcome``, or the name of what failed it (the copy is unknown)."""
    if settled.cancelled():
        return "cancelled"
    error = settled.exception()
    return type(error).__name__ if error is not None else settled.result()


Key = tuple[str, str, str | None, bytes]  # exchange, routing key, message_id, body


class _Pending:
    """One publish in flight: its confirm number and what the caller waits on."""

    __slots__ = ("outcome", "tag")

    def __init__(self, tag: int, outcome: asyncio.Future[Outcome]) -> None:
        self.tag = tag
        self.outcome = outcome


class ConfirmedPublisher:
    """Pipelined confirmed publishes with ``mandatory`` on a channel opened with confirms.

    ``await publish(...)`` waits for room in the window (and for an identical publish still in
    flight), sends, and returns a future of the ``Outcome``; the future raises instead if the
    channel closes first. Call ``close()`` when done: it stops the writer (the channel stays
    open, for the caller to close).
    """

    def __init__(
        self, channel: aiormq.abc.AbstractChannel, *, window: int = 1000, _probe: bool = False
    ) -> None:
        if not _probe:
            # Before the first publish of the process: a client whose returns bypass the hook
            # would count returned copies confirmed (exit 78 instead, nothing touched).
            check_return_handling()
        if not getattr(channel, "publisher_confirms", False):
            raise RuntimeError("ConfirmedPublisher needs a channel opened with publisher_confirms")
        self._channel: Any = channel  # the concrete aiormq.Channel: its internals are untyped
        self._room = asyncio.Semaphore(window)
        self._inflight: dict[Key, _Pending] = {}
        self._wire: list[bytes] = []  # encoded publishes not yet handed to the writer
        self._wake = asyncio.Event()
        self._writer = asyncio.get_running_loop().create_task(self._write_loop())
        internals.install_return_hook(channel, self._on_return)

    async def publish(
        self,
        body: bytes,
        *,
        exchange: str,
        routing_key: str,
        properties: spec.Basic.Properties,
    ) -> asyncio.Future[Outcome]:
        """Send one message; the future resolves when the broker confirms, returns or nacks it."""
        key: Key = (exchange, routing_key, properties.message_id, body)
        while (twin := self._inflight.get(key)) is not None:
            await asyncio.wait([twin.outcome])  # the same message in flight: let it settle
        channel = self._channel
        # Encoded here, not in the writer: a value that cannot be encoded fails this publish
        # alone, before it has a confirm number.
        frames: list[spec.Basic.Publish | ContentHeader | ContentBody] = [
            spec.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=True),
            ContentHeader(properties=properties, body_size=len(body)),
            *self._body_frames(body),
        ]
        wire = b"".join([pamqp.frame.marshal(frame, channel.number) for frame in frames])
        await self._room.acquire()
        if channel.is_closed or self._writer.done():
            self._room.release()
            raise aiormq.exceptions.ChannelInvalidStateError("the publishing channel is closed")
        tag, confirm = internals.register_confirm(channel)
        pending = _Pending(tag, asyncio.get_running_loop().create_future())
        self._inflight[key] = pending
        confirm.add_done_callback(lambda done: self._settle(key, pending, done))
        self._wire.append(wire)
        self._wake.set()
        return pending.outcome

    @property
    def channel(self) -> aiormq.abc.AbstractChannel:
        """The channel this publisher sends on."""
        return self._channel  # type: ignore[no-any-return]

    async def close(self) -> None:
        """Stop the writer task. Publishes still unconfirmed fail when the channel closes."""
        self._writer.cancel()
        await asyncio.gather(self._writer, return_exceptions=True)

    def _body_frames(self, body: bytes) -> Iterable[ContentBody]:
        size = internals.max_body_frame(self._channel)
        if len(body) <= size:
            return (ContentBody(body),) if body else ()
        return [ContentBody(body[i : i + size]) for i in range(0, len(body), size)]

    async def _write_loop(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                wire, self._wire = self._wire, []
                if wire:  # one write for everything published since the last turn
                    await internals.write(self._channel, b"".join(wire))
        except BaseException as exc:
            # Frames not written are not sent: none of the publishes waiting may be confirmed.
            error = aiormq.exceptions.ChannelInvalidStateError(f"publisher stopped: {exc!r}")
            for pending in list(self._inflight.values()):
                if not pending.outcome.done():
                    pending.outcome.set_exception(error)
            raise

    def _settle(self, key: Key, pending: _Pending, confirm: asyncio.Future[Any]) -> None:
        self._room.release()
        if self._inflight.get(key) is pending:
            del self._inflight[key]
        outcome = pending.outcome
        if outcome.done():
            return  # settled by its return, or failed with the writer
        if confirm.cancelled():
            outcome.set_exception(aiormq.exceptions.ChannelInvalidStateError("publish cancelled"))
        elif (error := confirm.exception()) is not None:
            frame = getattr(error, "frame", None)
            if isinstance(error, aiormq.exceptions.DeliveryError) and isinstance(
                frame, spec.Basic.Nack
            ):
                outcome.set_result(Outcome.NACKED)
            else:
                outcome.set_exception(error)
        else:
            outcome.set_result(Outcome.CONFIRMED)

    async def _on_return(
        self, frame: spec.Basic.Return, message: aiormq.abc.DeliveredMessage
    ) -> None:
        """The reader's hook for basic.return: settle the publish it returns."""
        exchange, routing_key = frame.exchange or "", frame.routing_key or ""
        key: Key = (exchange, routing_key, message.header.properties.message_id, message.body)
        match = self._inflight.get(key)
        victims = (
            [match]
            if match is not None
            else [p for k, p in self._inflight.items() if k[:2] == (exchange, routing_key)]
        )
        for pending in victims:
            self._mark_returned(pending)

    def _mark_returned(self, pending: _Pending) -> None:
        if pending.outcome.done():
            return
        pending.outcome.set_result(Outcome.RETURNED)
        confirm = internals.mark_returned(self._channel, pending.tag)
        if confirm is not None:
            confirm.cancel()  # runs _settle: frees the window slot and the key


def check_return_handling() -> None:
    """Refuse to publish unless a return without a message_id reaches ConfirmedPublisher.

    Runs once per process (a few milliseconds, no broker): the probe's result is kept. Raises
    ``UnsupportedDependency`` (exit 78) naming the installed and supported client versions.
    """
    with _probe_lock:
        if not _probe_result:
            _probe_result.append(probe_return_handling())
        problem = _probe_result[0]
    if problem is not None:
        raise internals.unsupported(problem)


def probe_return_handling() -> str | None:
    """Play one publish and its return through a real aiormq channel; None if rmqkit saw it.

    The channel has no broker: the publish is read back from its write queue, and a
    ``basic.return`` of the message without a message_id, its header, its body and the broker's
    ``basic.ack`` are fed to the channel's reader as aiormq's connection reader would. The
    outcome must be RETURNED; CONFIRMED is the loss this guards against. Runs on its own event
    loop in a short-lived thread, so it works from synchronous code and inside a running loop.
    """
    result: list[str | None] = []

    def run() -> None:
        try:
            result.append(asyncio.run(asyncio.wait_for(_probe(), _PROBE_TIMEOUT_S)))
        except Exception as exc:  # any failure of the internals is a "no"
            result.append(f"the return-handling probe failed ({type(exc).__name__}: {exc})")

    # What aiormq logs about the probe's fake frames (an old aiormq's own return handler
    # complains of the missing message_id) would only confuse: the result says it all.
    quiet = _ThreadFilter(_PROBE_THREAD)
    loggers = [logging.getLogger(name) for name in ("aiormq.channel", "aiormq.connection")]
    for logger in loggers:
        logger.addFilter(quiet)
    try:
        thread = threading.Thread(target=run, name=_PROBE_THREAD, daemon=True)
        thread.start()
        thread.join(_PROBE_TIMEOUT_S + 5)
    finally:
        for logger in loggers:
            logger.removeFilter(quiet)
    return result[0] if result else "the return-handling probe did not finish"


class _ThreadFilter(logging.Filter):
    """Drops the log records of one thread."""

    def __init__(self, thread_name: str) -> None:
        super().__init__()
        self.thread_name = thread_name

    def filter(self, record: logging.LogRecord) -> bool:
        return record.threadName != self.thread_name


async def _probe() -> str | None:
    channel = await internals.open_probe_channel()
    publisher = ConfirmedPublisher(channel, window=1, _probe=True)
    try:
        body = _PROBE_BODY
        settled = await publisher.publish(
            body, exchange="", routing_key=_PROBE_KEY, properties=spec.Basic.Properties()
        )
        sent = internals.unmarshal_all(await internals.written(channel))
        if not (
            len(sent) == 3
            and isinstance(sent[0], spec.Basic.Publish)
            and sent[0].mandatory
            and isinstance(sent[2], ContentBody)
            and sent[2].value == body
        ):
            return f"a publish was written as {[type(f).__name__ for f in sent]}"
        await internals.receive(
            channel,
            [
                spec.Basic.Return(
                    reply_code=312, reply_text="NO_ROUTE", exchange="", routing_key=_PROBE_KEY
                ),
                ContentHeader(body_size=len(body), properties=spec.Basic.Properties()),
                ContentBody(body),
                spec.Basic.Ack(delivery_tag=1),
            ],
        )
        outcome = await settled
    finally:
        await publisher.close()
        await internals.close_probe_channel(channel)
    if outcome is not Outcome.RETURNED:
        return (
            "the installed client libraries would lose returned messages (a basic.return "
            f"without a message_id never reached rmqkit's hook and was counted {outcome.value})"
        )
    return None

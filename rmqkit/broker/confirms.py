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
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Iterable
from importlib.metadata import version
from typing import Any, Final

import aiormq
import pamqp.frame
from aiormq.abc import ChannelFrame
from pamqp import commands as spec
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

# aiormq internals used here (checked when a publisher is made, so a change fails loudly
# instead of mismatching confirms): the confirm table and counter, the connection's write
# queue, and the reader's return hook with the two calls that read a message's content.
_RETURN_HOOK: Final = "_on_return_frame"
_READ_HEADER: Final = "_Channel__get_content_header"
_NEEDED: Final = ("confirmations", "delivery_tag", "write_queue", "number", "_read_content")


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

    def __init__(self, channel: aiormq.abc.AbstractChannel, *, window: int = 1000) -> None:
        needed = (*_NEEDED, _RETURN_HOOK, _READ_HEADER)
        missing = [name for name in needed if not hasattr(channel, name)]
        if missing or not getattr(channel, "publisher_confirms", False):
            raise RuntimeError(
                f"rmqkit needs a confirm-mode aiormq channel with {', '.join(needed)}; "
                f"this aiormq ({version('aiormq')}) lacks {missing or 'confirm mode'}"
            )
        self._channel: Any = channel  # the concrete aiormq.Channel: its internals are untyped
        self._room = asyncio.Semaphore(window)
        self._inflight: dict[Key, _Pending] = {}
        self._wire: list[bytes] = []  # encoded publishes not yet handed to the writer
        self._wake = asyncio.Event()
        self._writer = asyncio.get_running_loop().create_task(self._write_loop())
        setattr(channel, _RETURN_HOOK, self._on_return)  # an instance override of the reader hook

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
        channel.delivery_tag += 1
        pending = _Pending(channel.delivery_tag, asyncio.get_running_loop().create_future())
        confirm: asyncio.Future[Any] = channel.create_future()
        channel.confirmations[pending.tag] = confirm
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
        size = int(self._channel.max_content_size)
        if len(body) <= size:
            return (ContentBody(body),) if body else ()
        return [ContentBody(body[i : i + size]) for i in range(0, len(body), size)]

    async def _write_loop(self) -> None:
        channel = self._channel
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                wire, self._wire = self._wire, []
                if wire:  # one write for everything published since the last turn
                    payload = b"".join(wire)
                    await channel.write_queue.put(ChannelFrame(payload=payload, should_close=False))
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

    async def _on_return(self, frame: spec.Basic.Return) -> None:
        """The reader's hook for basic.return: read the message, settle its publish."""
        channel = self._channel
        header = await getattr(channel, _READ_HEADER)()
        message = await channel._read_content(frame, header)
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
        # The broker's ack for it follows: aiormq drops an ack for its Returning marker quietly.
        confirm = self._channel.confirmations.get(pending.tag)
        self._channel.confirmations[pending.tag] = aiormq.channel.Returning()
        if isinstance(confirm, asyncio.Future):
            confirm.cancel()  # runs _settle: frees the window slot and the key

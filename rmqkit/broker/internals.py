"""Every use rmqkit makes of aiormq's and pamqp's internals, and the versions they are known on.

rmqkit reaches under the public API of its AMQP client in two places: ``ConfirmedPublisher``
(``rmqkit.broker.confirms``) numbers its own publishes in aiormq's confirm table, writes frames
to the connection's write queue and replaces the channel reader's ``basic.return`` handler; the
typed header hook (``rmqkit.broker.codec.hook``) replaces pamqp's content-header decoder. None
of that is a promise aiormq or pamqp make, so it all lives here, in one module: a new client
version is reviewed by reading this file, and ``tests/unit/test_dependency_contract.py`` fails
if a private name is used anywhere else.

Whether the internals still *behave* as rmqkit needs is proven at run time, not assumed from
attribute names: ``rmqkit.broker.confirms.check_return_handling`` plays a ``basic.return`` of
a message without a message_id through a real aiormq channel, fed by ``open_probe_channel`` and
``receive`` below the way aiormq's connection reader feeds it, and refuses to publish (exit 78)
unless rmqkit's hook saw it. (aiormq 7.2.0 and older bind the reader's frame handlers when the
channel opens: an instance override of the return handler is never called there, and every
returned copy without a message_id was counted confirmed.)

``SUPPORTED`` is the tested range; pyproject.toml declares the same (a unit test compares them)
and constraints/lowest.txt pins its floor, which ``scripts/test-lowest`` runs the publish tests on.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final

import aiormq
import aiormq.abc
import pamqp.frame
from pamqp import commands as spec
from pamqp.header import ContentHeader

from rmqkit.errors import UnsupportedDependency

# aiormq reports connection.blocked / unblocked only as a warning on its connection logger
# (no callback): rmqkit.broker.blocking reads these records. The record's msg and args
# (connection, reason) as aiormq 7.2.x words them; a different wording falls back to the
# connection's ready() gate, without the reason.
AIORMQ_LOGGER: Final = "aiormq.connection"
BLOCKED_NOTICE: Final = "Connection %r was blocked by: %r"
UNBLOCKED_NOTICE: Final = "Connection %r was unblocked"

SUPPORTED: Final = {
    "aio-pika": ">=10.0.0,<11",
    "aiormq": ">=7.2.1,<7.3",
    "pamqp": ">=4.0.1,<4.1",
}
"""The client-library ranges rmqkit is tested on (pyproject.toml declares exactly these)."""

ReturnHook = Callable[[spec.Basic.Return, aiormq.abc.DeliveredMessage], Awaitable[None]]
Frame = pamqp.frame.FrameTypes

# aiormq's names, spelled once. The reader calls ``self._on_return_frame(frame)`` for each
# basic.return (looked up per frame since 7.2.1), which reads the header and body with these two.
_RETURN_HANDLER: Final = "_on_return_frame"
_READ_HEADER: Final = "_Channel__get_content_header"  # name-mangled private method
_READ_BODY: Final = "_read_content"
# pamqp's module-level content-header decoder, which pamqp.frame.unmarshal calls by name.
_HEADER_DECODER: Final = "_unmarshal_header_frame"


# --- versions -----------------------------------------------------------------------------------
def installed_versions() -> dict[str, str]:
    """The installed version of each client library in ``SUPPORTED`` ("missing" if absent)."""
    out: dict[str, str] = {}
    for name in SUPPORTED:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "missing"
    return out


def versions_text() -> str:
    """``aio-pika 10.2.1, aiormq 7.2.4, pamqp 4.0.1``: what is installed, for messages."""
    return ", ".join(f"{name} {version}" for name, version in installed_versions().items())


def supported_text() -> str:
    """``aio-pika>=10.0.0,<11, aiormq>=7.2.1,<7.3, pamqp>=4.0.1,<4.1``: the tested ranges."""
    return ", ".join(f"{name}{spec_}" for name, spec_ in SUPPORTED.items())


def unsupported(what: str) -> UnsupportedDependency:
    """The exit-78 error for client libraries that do not behave as rmqkit needs (one line)."""
    wanted = " ".join(f"'{name}{spec_}'" for name, spec_ in SUPPORTED.items())
    return UnsupportedDependency(
        f"{what}; installed: {versions_text()} — install the supported versions: "
        f"pip install {wanted}"
    )


# --- aiormq channel internals (ConfirmedPublisher) ----------------------------------------------
def register_confirm(channel: Any) -> tuple[int, asyncio.Future[Any]]:
    """Number one publish as aiormq would and put its future into the channel's confirm table.

    aiormq resolves it on the broker's ack (result) or nack (``DeliveryError`` with the frame).
    """
    channel.delivery_tag += 1
    tag: int = channel.delivery_tag
    confirm: asyncio.Future[Any] = channel.create_future()
    channel.confirmations[tag] = confirm
    return tag, confirm


def mark_returned(channel: Any, tag: int) -> asyncio.Future[Any] | None:
    """Put aiormq's ``Returning`` marker in place of publish ``tag``'s future; return the future.

    The broker acks a returned message too: aiormq drops an ack for a ``Returning`` quietly.
    """
    confirm = channel.confirmations.get(tag)
    channel.confirmations[tag] = aiormq.channel.Returning()
    return confirm if isinstance(confirm, asyncio.Future) else None


async def write(channel: Any, payload: bytes) -> None:
    """Hand already-marshalled frames to the connection's writer (one socket write)."""
    await channel.write_queue.put(aiormq.abc.ChannelFrame(payload=payload, should_close=False))


def max_body_frame(channel: Any) -> int:
    """The largest body frame payload the connection's negotiated frame size allows."""
    return int(channel.max_content_size)


def install_return_hook(channel: Any, hook: ReturnHook) -> None:
    """Make ``hook`` receive every ``basic.return`` on ``channel``, with the returned message.

    An instance attribute shadows aiormq's handler for this channel only. It must read the
    message's header and body frames itself, as aiormq's own handler does, or the reader would
    take them for the next method.
    """
    read_header = getattr(channel, _READ_HEADER)
    read_body = getattr(channel, _READ_BODY)

    async def on_return(frame: spec.Basic.Return) -> None:
        header = await read_header()
        await hook(frame, await read_body(frame, header))

    setattr(channel, _RETURN_HANDLER, on_return)


# --- a channel without a broker (the start-up probe) --------------------------------------------
async def open_probe_channel(frame_max: int = 131072) -> Any:
    """A real aiormq channel, opened in confirm mode, on a connection that never had a socket.

    Nothing is sent anywhere: what the channel writes stays in its write queue (``written``)
    and what it reads comes from ``receive``. It is opened as ``Connection.channel()`` opens
    one, this function answering as the broker would, so its reader has started and bound
    whatever it binds at that moment before anything else touches the channel.
    """
    connection = aiormq.Connection("amqp://rmqkit-probe.invalid/")
    connection.connection_tune = spec.Connection.Tune(frame_max=frame_max)
    capabilities: dict[str, Any] = {"publisher_confirms": True, "basic.nack": True}
    connection.server_properties = {"capabilities": capabilities}
    channel = aiormq.Channel(connection, 1, publisher_confirms=True)
    opening = asyncio.ensure_future(channel.open())
    broker = {
        spec.Channel.Open: spec.Channel.OpenOk(),
        spec.Confirm.Select: spec.Confirm.SelectOk(),
    }
    for _ in broker:
        (request,) = unmarshal_all(await written(channel))
        await receive(channel, [broker[type(request)]])
    await opening
    return channel


async def written(channel: Any) -> bytes:
    """The next payload the channel put on its connection's write queue."""
    frame = await channel.write_queue.get()
    return bytes(frame.payload)


async def receive(channel: Any, frames: Iterable[Frame]) -> None:
    """Feed ``frames`` to the channel's reader as aiormq's connection reader does.

    Each frame goes to the wire format and back through ``pamqp.frame.unmarshal`` (as the
    connection's frame receiver does), then into the channel's frame queue with its size.
    """
    for frame in frames:
        size, _, decoded = pamqp.frame.unmarshal(pamqp.frame.marshal(frame, channel.number))
        await channel.frames.put((size, decoded))


def unmarshal_all(payload: bytes) -> list[Any]:
    """Every frame in ``payload`` (several marshalled frames back to back)."""
    out: list[Any] = []
    while payload:
        size, _, frame = pamqp.frame.unmarshal(payload)
        out.append(frame)
        payload = payload[size:]
    return out


async def close_probe_channel(channel: Any) -> None:
    """Stop the probe channel's reader (its connection was never opened: nothing to send)."""
    await channel.close()


# --- pamqp internals (pamqp_hook) ---------------------------------------------------------------
def header_decoder() -> Any:
    """pamqp's current content-header decoder (its own, or a hook put in its place)."""
    return getattr(pamqp.frame, _HEADER_DECODER, None)


def set_header_decoder(decoder: Callable[[bytes], ContentHeader]) -> None:
    """Put ``decoder`` where ``pamqp.frame.unmarshal`` looks the header decoder up."""
    setattr(pamqp.frame, _HEADER_DECODER, decoder)


def header_hook_problems(expected_slots: list[str], flags: dict[str, int]) -> list[str]:
    """Why pamqp's structure no longer fits the typed header hook (empty when it does).

    ``expected_slots`` are Basic.Properties' attributes in wire order, ``flags`` their flag bits.
    """
    problems: list[str] = []
    if not callable(header_decoder()):
        problems.append(f"pamqp.frame.{_HEADER_DECODER} is missing")
    if _HEADER_DECODER not in pamqp.frame.unmarshal.__code__.co_names:
        problems.append(f"pamqp.frame.unmarshal no longer calls {_HEADER_DECODER}")
    if "unmarshal" not in ContentHeader.unmarshal.__code__.co_names:
        problems.append("ContentHeader.unmarshal no longer calls properties.unmarshal")
    if "marshal" not in ContentHeader.marshal.__code__.co_names:
        problems.append("ContentHeader.marshal no longer calls properties.marshal")
    if list(spec.Basic.Properties.__slots__) != expected_slots:
        problems.append("pamqp's Basic.Properties attributes changed")
    if any(spec.Basic.Properties.flags.get(attr) != flag for attr, flag in flags.items()):
        problems.append("pamqp's Basic.Properties flag bits changed")
    return problems


__all__ = [
    "AIORMQ_LOGGER",
    "BLOCKED_NOTICE",
    "SUPPORTED",
    "UNBLOCKED_NOTICE",
    "ReturnHook",
    "close_probe_channel",
    "header_decoder",
    "header_hook_problems",
    "install_return_hook",
    "installed_versions",
    "mark_returned",
    "max_body_frame",
    "open_probe_channel",
    "receive",
    "register_confirm",
    "set_header_decoder",
    "supported_text",
    "unmarshal_all",
    "unsupported",
    "versions_text",
    "write",
    "written",
]

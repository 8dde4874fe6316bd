"""The one hook into pamqp: typed content headers for connections opened in typed_decoding().

Reading needs one hook, because aiormq decodes frames inside pamqp before any of our code sees
them, and the widths are gone by then. ``install()`` wraps pamqp's content-header decoder
(explicit, idempotent, version- and structure-checked; the pamqp internals it touches are in
``rmqkit.broker.internals``). The wrapper is inert unless the context
variable that ``typed_decoding()`` sets is true in the task that reads the socket. aiormq's reader
task copies the context of whoever awaits ``aiormq.connect``, so:
``with typed_decoding(): conn = await aiormq.connect(url)`` (or ``await connect_typed(url)``) gives
that one connection typed ``DeliveredMessage.header.properties`` (``TypedProperties``); every
other connection in the process decodes exactly as before.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import struct
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any, Final

import aiormq
import aiormq.abc
from pamqp.exceptions import UnmarshalingException
from pamqp.header import ContentHeader

from rmqkit.broker import internals
from rmqkit.broker.codec.properties import PROPERTIES, TypedProperties

_TYPED_DECODING: ContextVar[bool] = ContextVar("rmqkit_typed_amqp_decoding", default=False)
SUPPORTED_PAMQP_MAJORS: Final = (4,)
"""pamqp major versions ``install()`` accepts (4.0.1 tested), its structure checked too."""

_EXPECTED_SLOTS: Final = [p.attr for p in PROPERTIES]
_EXPECTED_FLAGS: Final = {p.attr: p.flag for p in PROPERTIES}


class _HeaderFrameHook:
    """Stands in for pamqp's content-header decoder; inert outside typed_decoding()."""

    def __init__(self, original: Callable[[bytes], ContentHeader]) -> None:
        self.original = original

    def __call__(self, frame_data: bytes) -> ContentHeader:
        if not _TYPED_DECODING.get():
            return self.original(frame_data)
        header = ContentHeader(properties=TypedProperties())
        try:
            header.unmarshal(frame_data)
        except (struct.error, ValueError, IndexError) as error:
            raise UnmarshalingException("ContentHeader", error) from error
        return header


def pamqp_problems() -> list[str]:
    """Why the installed pamqp does not fit the hook (empty when it does)."""
    problems: list[str] = []
    try:
        version = importlib.metadata.version("pamqp")
        major = int(version.split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        version, major = "unknown", -1
    if major not in SUPPORTED_PAMQP_MAJORS:
        problems.append(
            f"pamqp {version} is not a supported major version {SUPPORTED_PAMQP_MAJORS}"
        )
    problems.extend(internals.header_hook_problems(_EXPECTED_SLOTS, _EXPECTED_FLAGS))
    return problems


def is_installed() -> bool:
    """Whether ``install()`` has put the hook in place."""
    return isinstance(internals.header_decoder(), _HeaderFrameHook)


def install() -> None:
    """Put the typed content-header hook into pamqp (idempotent; checks pamqp first).

    Until ``typed_decoding()`` is active in a connection's reader task, the hook calls pamqp's
    own function, so installing it changes nothing for other connections.
    """
    if is_installed():
        return
    problems = pamqp_problems()
    if problems:
        raise internals.unsupported(
            "cannot decode AMQP headers with exact types: " + "; ".join(problems)
        )
    # The patch itself, explicit: one module attribute, restored by uninstall().
    internals.set_header_decoder(_HeaderFrameHook(internals.header_decoder()))


def uninstall() -> None:
    """Restore pamqp's own function (for tests)."""
    current = internals.header_decoder()
    if isinstance(current, _HeaderFrameHook):
        internals.set_header_decoder(current.original)


@contextlib.contextmanager
def typed_decoding() -> Iterator[None]:
    """Inside this block, content headers decode to ``TypedProperties``; installs the hook.

    The decision is made by the task that reads the socket, which aiormq creates while
    ``aiormq.connect`` runs and which copies the context at that moment: open the connection
    inside the block, and the whole connection decodes typed, for its lifetime.
    """
    install()
    token = _TYPED_DECODING.set(True)
    try:
        yield
    finally:
        _TYPED_DECODING.reset(token)


async def connect_typed(url: str, **kwargs: Any) -> aiormq.abc.AbstractConnection:
    """``aiormq.connect(url)`` whose deliveries carry ``TypedProperties``."""
    with typed_decoding():
        return await aiormq.connect(url, **kwargs)


__all__ = [
    "SUPPORTED_PAMQP_MAJORS",
    "connect_typed",
    "install",
    "is_installed",
    "pamqp_problems",
    "typed_decoding",
    "uninstall",
]

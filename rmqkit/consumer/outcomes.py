"""How handling one delivery went: the outcomes ``decide`` turns into ack, retry or park.

rmqkit.consumer.handler classifies the handler's run into one of these; the dispatcher adds the
ones found before any handler runs (too large, no message id, undecryptable). Plain data, no
broker: rmqkit.consumer.decision re-exports them.
"""

from __future__ import annotations

import traceback as traceback_module
from dataclasses import dataclass, field
from typing import ClassVar


def qualified_type_name(cls: type) -> str:
    """``pkg.mod.Cls`` (nested classes ``pkg.mod.Outer.Inner``); builtins stay bare."""
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


# --- outcomes of handling one delivery -----------------------------------------------------------


@dataclass(frozen=True)
class Success:
    """The handler returned."""


@dataclass(frozen=True)
class Failed:
    """The handler raised.

    ``permanent``: rmqkit.Permanent (park now). ``retry_delay_s``: from rmqkit.Retry(delay_s=...);
    picks the tier whose delay is the smallest one >= it. ``base_types``: qualified names of the
    exception's base classes, so listing a base class in permanent_errors covers its subclasses.
    """

    exc_type: str
    exc_message: str
    traceback: str = ""  # given, or formatted from ``exception`` by traceback_text()
    permanent: bool = False
    retry_delay_s: float | None = None
    base_types: tuple[str, ...] = ()
    exception: BaseException | None = field(default=None, compare=False, repr=False)

    def traceback_text(self) -> str:
        """The traceback, formatted only when asked for: parking keeps it, a retry does not,
        and formatting every failure's was a fifth of the retry path's CPU."""
        if self.traceback or self.exception is None:
            return self.traceback
        return "".join(traceback_module.format_exception(self.exception))

    @classmethod
    def from_exception(
        cls, exc: BaseException, *, permanent: bool = False, retry_delay_s: float | None = None
    ) -> Failed:
        try:
            message = str(exc)
        except Exception:  # an exception whose __str__ raises is still a failure, not a crash
            message = f"<str() of the {type(exc).__name__} failed>"
        return cls(
            exc_type=qualified_type_name(type(exc)),
            exc_message=message,
            exception=exc,
            permanent=permanent,
            retry_delay_s=retry_delay_s,
            base_types=tuple(
                qualified_type_name(base)
                for base in type(exc).__mro__[1:]
                if base not in (object, BaseException)
            ),
        )


@dataclass(frozen=True)
class HandlerTimeout:
    """The handler did not finish within the handler timeout: a transient failure."""

    timeout_s: float

    error_type: ClassVar[str] = "rmqkit.HandlerTimeout"


@dataclass(frozen=True)
class Undecodable:
    """The body failed decoding or validation before the handler ran: poison, park now."""

    detail: str
    exc_type: str = "rmqkit.Undecodable"
    traceback: str = ""


@dataclass(frozen=True)
class UnroutableType(Undecodable):
    """A routed handler (rmqkit.consumer.routing) has no route for the message's type, or the
    message has none: poison, park now as ``unroutable_type``. An Undecodable, so every path
    that treats a message no handler could take as poison treats this one so too; ``decide``
    tells them apart by this class."""

    exc_type: str = "rmqkit.UnroutableType"

    error_type: ClassVar[str] = "rmqkit.UnroutableType"


@dataclass(frozen=True)
class TooLarge:
    """The body exceeds the consumer's maximum message size: park without handling it."""

    size_bytes: int
    limit_bytes: int

    error_type: ClassVar[str] = "rmqkit.TooLarge"


@dataclass(frozen=True)
class MissingMessageId:
    """The queue requires a message_id (the idempotency key) and the message has none."""

    error_type: ClassVar[str] = "rmqkit.MissingMessageId"


@dataclass(frozen=True)
class DecryptFailed:
    """A field of the body cannot be decrypted (unknown key id, tampered, no key ring, malformed
    envelope): park now, never retried, never handed to the handler half-decrypted.

    ``detail`` is rmqkit.crypto.Undecryptable's one-line text (field path, key id, cause; never
    a value), ``cause`` its stable reason (``tampered``, ``unknown-key``, …)."""

    detail: str
    cause: str = ""

    error_type: ClassVar[str] = "rmqkit.Undecryptable"


HandlerOutcome = (
    Success | Failed | HandlerTimeout | Undecodable | TooLarge | MissingMessageId | DecryptFailed
)

__all__ = [
    "DecryptFailed",
    "Failed",
    "HandlerOutcome",
    "HandlerTimeout",
    "MissingMessageId",
    "Success",
    "TooLarge",
    "Undecodable",
    "UnroutableType",
    "qualified_type_name",
]

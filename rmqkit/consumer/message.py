"""What a handler sees of a delivery (``rmqkit.Message``) and the exceptions it raises to steer it.

A handler's outcome is decided by how it ends (``rmqkit.consumer.handler.run_handler`` classifies
it; ``rmqkit.consumer.decision.decide`` turns that into ack / retry / park):

* returning: success, the delivery is acked;
* raising ``Permanent`` (or a subclass): park now, no retry;
* raising ``Retry(delay_s=...)``: a transient failure retried at the tier whose delay is the
  smallest one >= ``delay_s`` (the longest tier if none is that long);
* a body that cannot be decoded or validated: park as ``undecodable``. That is a body the
  handler's annotated parameter cannot be built from (the handler never runs), a ``DecodeError``
  (raised by ``Message.json()``) and any pydantic ``ValidationError`` escaping the handler
  (``Model.model_validate_json(message.body)`` inside it). A ``json.JSONDecodeError`` of the
  handler's own is *not* taken as one: HTTP clients raise it for a bad response, which is
  transient; use ``message.json()`` for the body, or list the type as permanent;
* any other exception: transient, retried through the tiers until ``max_attempts``.

``Message`` is built once per delivery on the consumer's hot path, so it holds references, not
copies: ``body`` is the delivery's bytes and ``headers`` the delivery's own dict, which the runner
also uses to build the retry or parking copy. Treat both as read-only.
"""

from __future__ import annotations

import json
import math
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from rmqkit import headers as h
from rmqkit.consumer.attempts import attempt_number

if TYPE_CHECKING:  # the client's message type, named through the broker layer
    from rmqkit.broker.amqp import IncomingMessage


class Permanent(Exception):
    """Raise from a handler to park the message now, without retrying it.

    The exception's type, text and traceback go into the parking headers. Raise it ``from`` the
    underlying error to keep that error in the traceback.
    """


class DecodeError(Permanent, ValueError):
    """The message body cannot be decoded or validated: the message is parked as ``undecodable``.

    Raised by ``Message.json()``; raise it yourself for a body your own code cannot read. It is a
    ``ValueError`` too, so code written around ``json.loads`` that catches ``ValueError`` keeps
    working.
    """


class Retry(Exception):
    """Raise from a handler to retry the message later, at the tier of ``delay_s``.

    ``delay_s`` picks the retry tier whose delay is the smallest one >= it (the longest tier if
    none is that long); None means the tier for this attempt, as for any transient error.
    ``reason`` is recorded as the error message in the copy's headers. It counts as an attempt:
    once ``max_attempts`` deliveries have failed, the message is parked as ``exhausted``.
    """

    def __init__(self, delay_s: float | None = None, reason: str = "") -> None:
        if delay_s is not None and (math.isnan(delay_s) or delay_s < 0):
            raise ValueError(f"Retry delay_s must be a number >= 0 or None, got {delay_s!r}")
        self.delay_s = delay_s
        self.reason = reason
        if reason:
            text = reason
        elif delay_s is None:
            text = "the handler asked for a retry"
        else:
            text = f"the handler asked for a retry in {delay_s:g} s"
        super().__init__(text)

    def __reduce__(self) -> tuple[Any, ...]:
        # BaseException pickles as type(self)(*self.args); args holds the text, not delay_s.
        return (type(self), (self.delay_s, self.reason), self.__dict__ or None)


@dataclass(frozen=True, slots=True)
class Message:
    """One delivery as a handler sees it.

    Build one yourself to test a handler: ``Message(b'{"id": 1}', message_id="m-1")``.

    ``attempt`` is 1 on the first delivery and counts the deliveries of this message through the
    work queue, retries included (see rmqkit.consumer.attempts); a broker redelivery after a lost
    connection or a crash does not count as an attempt (``redelivered`` tells you about those).
    """

    body: bytes
    _: KW_ONLY
    headers: dict[str, Any] = field(default_factory=dict, hash=False)
    message_id: str | None = None
    routing_key: str = ""
    exchange: str = ""
    redelivered: bool = False
    attempt: int = 1
    content_type: str | None = None
    correlation_id: str | None = None
    timestamp: datetime | None = None
    delivery_tag: int = 0

    @classmethod
    def from_delivery(
        cls,
        incoming: IncomingMessage,
        *,
        queue: str,
        wait_queues: tuple[str, ...] = (),
    ) -> Message:
        """The Message for a delivery from ``queue`` (``wait_queues``: its retry wait queues).

        Shares ``body`` and ``headers`` with ``incoming`` (no copy).
        """
        headers = incoming.headers
        # Without x-death and our attempt header, attempt_number is 1 by definition; most
        # first deliveries take this branch without parsing anything.
        if headers and ("x-death" in headers or h.ATTEMPT in headers):
            attempt = attempt_number(headers, queue, wait_queues=wait_queues)
        else:
            attempt = 1
        return cls(
            incoming.body,
            headers=headers,
            message_id=incoming.message_id,
            routing_key=incoming.routing_key or "",
            exchange=incoming.exchange or "",
            redelivered=bool(incoming.redelivered),
            attempt=attempt,
            content_type=incoming.content_type,
            correlation_id=incoming.correlation_id,
            timestamp=incoming.timestamp,
            delivery_tag=incoming.delivery_tag or 0,
        )

    def json(self) -> Any:
        """The body parsed as JSON (UTF-8, -16 or -32). Parses on every call.

        Raises DecodeError (the message is parked as ``undecodable`` if it escapes the handler)
        when the body is not valid JSON.
        """
        try:
            return json.loads(self.body)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
            raise DecodeError(f"the body is not valid JSON: {exc}") from exc

    def __repr__(self) -> str:
        # Never the body: it may be large or sensitive, and reprs end up in logs.
        return (
            f"Message(message_id={self.message_id!r}, routing_key={self.routing_key!r}, "
            f"attempt={self.attempt}, redelivered={self.redelivered}, "
            f"body=<{len(self.body)} bytes>)"
        )


__all__ = ["DecodeError", "Message", "Permanent", "Retry"]

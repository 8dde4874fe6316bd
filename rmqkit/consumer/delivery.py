"""One delivery on either side of its handler: the ``Message`` the handler is given, the error
text withheld when its fields were decrypted, the traceback a copy records, and the warning for a
delivery unsettled too long or delivered again. Helpers of rmqkit.consumer.dispatch's
``Dispatcher``."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

from rmqkit.broker.codec import Timestamp
from rmqkit.broker.session import Delivery
from rmqkit.consumer.acks import AckTracker
from rmqkit.consumer.decision import Failed, HandlerOutcome, Undecodable
from rmqkit.consumer.message import Message
from rmqkit.crypto import KeyRing
from rmqkit.crypto.masking import withhold_error
from rmqkit.delay import delivered_route

log = logging.getLogger("rmqkit.consumer")


def as_datetime(value: object) -> datetime | None:
    """A timestamp property as a datetime (None when there is none)."""
    if isinstance(value, Timestamp):
        return value.to_datetime()
    return value if isinstance(value, datetime) else None


def masked(outcome: Failed | Undecodable, keyring: KeyRing | None) -> Failed | Undecodable:
    """``outcome`` with its error text withheld (rmqkit.crypto.masking.withhold_error): the
    handler was given decrypted values, and no masking of them in free text can be exact."""
    if isinstance(outcome, Undecodable):
        detail, text = withhold_error(keyring, outcome.exc_type, outcome.detail, outcome.traceback)
        return replace(outcome, detail=detail, traceback=text)
    message, text = withhold_error(
        keyring, outcome.exc_type, outcome.exc_message, outcome.traceback, outcome.exception
    )
    return replace(outcome, exc_message=message, traceback=text, exception=None)


def traceback_of(outcome: HandlerOutcome) -> Callable[[], str] | None:
    """How to format the handler's traceback of a failed outcome (None: it has none)."""
    if isinstance(outcome, Failed):
        return outcome.traceback_text
    if isinstance(outcome, Undecodable) and outcome.traceback:
        text = outcome.traceback
        return lambda: text
    return None


def message_of(
    delivered: Delivery, body: bytes, headers: dict[str, Any], attempt: int, tag: int
) -> Message:
    """The ``Message`` a handler is given for ``delivered`` (``body`` decrypted)."""
    props = delivered.header.properties
    deliver = delivered.delivery
    # A delivery out of the delay ladder names its stage exchange: show the producer's.
    exchange, routing_key = delivered_route(
        deliver.exchange or "", deliver.routing_key or "", headers
    )
    return Message(
        body,
        headers=headers,
        message_id=props.message_id,
        routing_key=routing_key,
        exchange=exchange,
        redelivered=bool(deliver.redelivered),
        attempt=attempt,
        content_type=props.content_type,
        correlation_id=props.correlation_id,
        timestamp=as_datetime(props.timestamp),
        delivery_tag=tag,
    )


def warn_overdue(tracker: AckTracker, after_s: float, queue: str) -> None:
    """Name each delivery in hand for more than ``after_s`` with nothing decided for it (once
    per delivery)."""
    for tag, message_id, age_s in tracker.newly_overdue(after_s):
        log.warning(
            "delivery %d (message_id %s) from %s unsettled for %.0fs, past the handler "
            "timeout: nothing acked, retried or parked it yet",
            tag,
            message_id,
            queue,
            age_s,
            extra={
                "message_id": message_id,
                "delivery_tag": tag,
                "queue": queue,
                "age_s": round(age_s, 1),
            },
        )


def warn_redelivered(message_id: str | None, attempt: int, delivered: int) -> None:
    """A crash loop shows here: attempts stay put (no failure is ever recorded) while the
    broker's delivery count rises until its delivery limit parks the message."""
    log.warning(
        "redelivered (delivery %d): an earlier delivery of this message did not finish "
        "(a worker crash or kill, a lost connection, a stop past the grace, or a peek with "
        "the management UI's Get messages, which spends a delivery too); the queue's "
        "delivery limit parks it if this repeats",
        delivered,
        extra={"message_id": message_id, "attempt": attempt, "delivered": delivered},
    )

"""The event a consumer's hooks receive (``rmqkit.OutcomeEvent``), and how the dispatcher
builds it from a settled outcome.

Built from what the retry or parking copy records (rmqkit.consumer.decision's headers), so the
error text is the copy's: withheld on a delivery whose fields were decrypted for the handler,
whose outcome then holds no exception object either (rmqkit.consumer.dispatch masks it before
deciding). Never the body. rmqkit.consumer.hooks calls the hooks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal, get_args

from rmqkit import headers as h
from rmqkit.consumer.copies import describe_error  # the parked copy's own text of it
from rmqkit.consumer.outcomes import Failed, HandlerOutcome, qualified_type_name
from rmqkit.delay import delivered_route
from rmqkit.headers import public_type_name

if TYPE_CHECKING:
    from rmqkit.consumer.config import ConsumerConfig
    from rmqkit.consumer.decision import Park, RetryLater

__all__ = [
    "OUTCOME_KINDS",
    "OutcomeEvent",
    "OutcomeKind",
    "copy_event",
    "internal_error_event",
    "success_event",
]

OutcomeKind = Literal["success", "retry", "park"]
OUTCOME_KINDS: Final[tuple[OutcomeKind, ...]] = get_args(OutcomeKind)


@dataclass(frozen=True)
class OutcomeEvent:
    """What a hook is told about one settled outcome (never the body, never a decrypted value).

    ``kind``: ``"success"``, ``"retry"`` or ``"park"``. ``queue``: the queue the message was
    consumed from. ``attempt``: the delivery's attempt number (1 for the first). ``exchange`` /
    ``routing_key``: where the producer published it (kept across retries). ``reason``: the
    parking reason (``permanent``, ``exhausted``, ``undecodable``, …; park only). ``tier`` /
    ``delay_s`` / ``target_queue``: the retry tier, its wait and the wait queue (retry), or the
    parking queue (park). ``error_type`` / ``error_message``: the failure as the copy's headers
    record it (withheld on a delivery whose fields were decrypted). ``exception``: the handler's
    exception object (retry and park of a handler error; None otherwise, and always None when
    the delivery's fields were decrypted: its message may quote them).
    """

    kind: OutcomeKind
    queue: str
    message_id: str | None
    attempt: int
    exchange: str = ""
    routing_key: str = ""
    reason: str | None = None
    tier: str | None = None
    delay_s: float | None = None
    target_queue: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    exception: BaseException | None = field(default=None, repr=False, compare=False)


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return None if value is None else str(value)


def success_event(
    queue: str, message_id: str | None, attempt: int, deliver: Any, headers: Mapping[str, Any]
) -> OutcomeEvent:
    """The event of a handled delivery (``deliver``: its basic.deliver frame): the route is the
    producer's, kept in the headers across retries, else the delivery's own."""
    exchange = _text(headers.get(h.ORIGINAL_EXCHANGE)) if headers else None
    routing_key = _text(headers.get(h.ORIGINAL_ROUTING_KEY)) if headers else None
    if exchange is None or routing_key is None:
        route = delivered_route(deliver.exchange or "", deliver.routing_key or "", headers)
        exchange = route[0] if exchange is None else exchange
        routing_key = route[1] if routing_key is None else routing_key
    return OutcomeEvent(
        "success", queue, message_id, attempt, exchange=exchange, routing_key=routing_key
    )


def copy_event(
    config: ConsumerConfig,
    message_id: str | None,
    attempt: int,
    decision: RetryLater | Park,
    outcome: HandlerOutcome,
) -> OutcomeEvent:
    """The event of a retry or park ``decision``: its error as the copy's headers record it
    (already withheld on a delivery with decrypted fields, whose outcome then holds no
    exception object either: rmqkit.consumer.dispatch masks it before deciding)."""
    queue, tier_names = config.queue, config.tier_names
    exception = outcome.exception if isinstance(outcome, Failed) else None
    copy_headers = decision.headers
    common: dict[str, Any] = {
        "exchange": _text(copy_headers.get(h.ORIGINAL_EXCHANGE)) or "",
        "routing_key": _text(copy_headers.get(h.ORIGINAL_ROUTING_KEY)) or "",
        "target_queue": decision.target_queue,
        "error_type": _text(copy_headers.get(h.ERROR_TYPE)),
        "error_message": _text(copy_headers.get(h.ERROR_MESSAGE)),
        "exception": exception,
    }
    reason = getattr(decision, "reason", None)
    if reason is not None:
        return OutcomeEvent("park", queue, message_id, attempt, reason=reason.value, **common)
    retry: RetryLater = decision  # type: ignore[assignment]
    waited_ms = retry.expiration_ms if retry.expiration_ms is not None else retry.delay_ms
    tier = tier_names[retry.tier_index] if retry.tier_index < len(tier_names) else None
    return OutcomeEvent(
        "retry", queue, message_id, attempt, tier=tier, delay_s=waited_ms / 1000, **common
    )


def internal_error_event(
    queue: str,
    message_id: str | None,
    context: tuple[str | None, int] | None,
    exc: Exception,
    *,
    withhold: bool,
) -> OutcomeEvent:
    """The park event of a delivery rmqkit failed on (reason internal_error); ``context``:
    the (message id, attempt) being handled, if known. ``withhold``: its fields may have been
    decrypted, so neither the error's text nor the object."""
    attempt = context[1] if context is not None else 1
    return OutcomeEvent(
        "park",
        queue,
        message_id,
        attempt,
        reason=h.ParkingReason.INTERNAL_ERROR.value,
        error_type=public_type_name(qualified_type_name(type(exc))),
        error_message=None if withhold else describe_error(exc),
        exception=None if withhold else exc,
    )

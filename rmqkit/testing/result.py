"""``HandlerResult``: what the consumer would do with one message (rmqkit.testing.run_handler)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rmqkit import headers as h
from rmqkit.consumer.decision import Ack, Decision, HandlerOutcome, Park, RetryLater

__all__ = ["Action", "HandlerResult", "result_of"]

Action = Literal["ack", "retry", "park"]


@dataclass(frozen=True)
class HandlerResult:
    """What the consumer would do with the message.

    ``action``: ``"ack"``, ``"retry"`` (a copy to the wait queue ``target_queue`` of tier
    ``tier``, 0 the first, nominal delay ``delay_s``) or ``"park"`` (a copy to the parking
    queue with ``reason``: permanent, exhausted, undecodable, ...). ``error_type`` and
    ``error_message`` are the headers the copy carries (None on ack); ``headers`` the copy's
    headers ({} on ack); ``attempt`` the number of this delivery. ``outcome`` and ``decision``
    are the consumer's own objects, for assertions beyond these fields.
    """

    action: Action
    attempt: int
    target_queue: str | None = None
    tier: int | None = None
    delay_s: float | None = None
    reason: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    headers: dict[str, Any] = field(default_factory=dict, hash=False)
    outcome: HandlerOutcome | None = field(default=None, compare=False, repr=False)
    decision: Decision | None = field(default=None, compare=False, repr=False)

    @property
    def traceback(self) -> str | None:
        """The traceback the parked copy carries (None on ack and retry)."""
        value = self.headers.get(h.TRACEBACK)
        return value if isinstance(value, str) else None


def result_of(decision: Decision, outcome: HandlerOutcome, attempt: int) -> HandlerResult:
    if isinstance(decision, Ack):
        return HandlerResult("ack", attempt, outcome=outcome, decision=decision)
    error_type = decision.headers.get(h.ERROR_TYPE)
    error_message = decision.headers.get(h.ERROR_MESSAGE)
    common: dict[str, Any] = {
        "attempt": attempt,
        "target_queue": decision.target_queue,
        "error_type": error_type if isinstance(error_type, str) else None,
        "error_message": error_message if isinstance(error_message, str) else None,
        "headers": dict(decision.headers),
        "outcome": outcome,
        "decision": decision,
    }
    if isinstance(decision, RetryLater):
        return HandlerResult(
            "retry", tier=decision.tier_index, delay_s=decision.delay_ms / 1000, **common
        )
    assert isinstance(decision, Park)
    return HandlerResult("park", reason=decision.reason.value, **common)

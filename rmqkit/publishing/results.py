"""What one ``rmqkit.Publisher`` call reports per message, and the error it raises for the
messages the broker did not confirm."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rmqkit.errors import (
    MessageTooLarge,
    PublisherBusy,
    PublishFailed,
    PublishInterrupted,
    Unroutable,
)

PublishOutcome = Literal["confirmed", "returned", "nacked", "too_large", "unconfirmed"]


@dataclass(frozen=True, slots=True)
class PublishResult:
    """How the broker settled one message.

    ``exchange`` / ``routing_key``: as asked by the caller (a lane or a delay publishes
    elsewhere: ``lane`` names the lane queue, ``delay_ms`` the delay the ladder applies).
    ``outcome``: ``confirmed`` (in every queue it routes to), ``returned`` (no queue took it),
    ``nacked`` (refused: a full bounded queue), ``too_large`` (over the broker's
    ``max_message_size``: refused, never sent again), ``unconfirmed`` (the connection or channel was
    lost, or the caller's timeout ran out: its fate is unknown — it may be in the queue).
    ``attempts``: how often it was sent (after a lost connection or a busy refusal).
    """

    message_id: str
    exchange: str
    routing_key: str
    confirmed: bool
    outcome: PublishOutcome
    lane: str | None = None
    delay_ms: int = 0
    attempts: int = 1


def failure(results: Sequence[PublishResult], why: str | None = None) -> PublishFailed | None:
    """The error for ``results`` with unconfirmed messages (None if all are confirmed):
    returned ones first (a data problem: retrying does not help), then busy, then unknown."""
    bad = [r for r in results if not r.confirmed]
    if not bad:
        return None
    kept = tuple(results)
    counts = f"{len(results) - len(bad)} of {len(results)} message(s) confirmed"
    returned = [r for r in bad if r.outcome == "returned"]
    if returned:
        first = returned[0]
        return Unroutable(
            f"{len(returned)} message(s) were unroutable (no queue bound for them) and were "
            f"returned, e.g. message_id {first.message_id} to exchange {first.exchange!r} key "
            f"{first.routing_key!r}; {counts} — check the routing key and bindings "
            "(`rmqkit plan`)",
            kept,
        )
    too_large = [r for r in bad if r.outcome == "too_large"]
    if too_large:
        return MessageTooLarge(
            f"{len(too_large)} message(s) larger than the broker's max_message_size were "
            f"refused, e.g. message_id {too_large[0].message_id}{': ' + why if why else ''}; "
            f"{counts} — send smaller bodies (a reference to the payload, or split it), or "
            "raise max_message_size in rabbitmq.conf",
            kept,
        )
    nacked = [r for r in bad if r.outcome == "nacked"]
    if nacked:
        return PublisherBusy(
            f"broker busy: {len(nacked)} message(s) refused because a bounded queue is full "
            f"(overflow reject-publish); {counts} — publish the unconfirmed ones again later "
            "(their message_ids are in .unconfirmed)",
            kept,
        )
    return PublishInterrupted(
        f"{len(bad)} message(s) not confirmed{': ' + why if why else ''}; {counts} — their "
        "fate is unknown: publish them again with the same message_ids (in .unconfirmed)",
        kept,
    )

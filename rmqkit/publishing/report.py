"""What one `rmqkit publish` run did (``PublishReport``): its counts, the ids of what did not go
through, and the error its exit code comes from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rmqkit.errors import BrokerUnavailable, DataError, MessageTooLarge, RmqkitError


@dataclass
class PublishReport:
    """Counts of one publish run."""

    published: int = 0  # sent at least once
    confirmed: int = 0
    returned: int = 0  # unroutable (mandatory): no queue took them
    nacked: int = 0  # refused by the broker, e.g. a full queue with overflow reject-publish
    retried: int = 0  # busy retries made (--retry-busy)
    too_large: int = 0  # over the broker's max_message_size: refused for good, never sent again
    returned_ids: list[str] = field(default_factory=list)
    nacked_ids: list[str] = field(default_factory=list)
    too_large_ids: list[str] = field(default_factory=list)
    max_message_bytes: int | None = None  # the broker's limit, once it refused a message
    # With a topology or a delay (``publish_input``): messages per lane queue, and the delays
    # the ladder applies (ms, one per delayed message); None / empty without either.
    lanes: dict[str, int] | None = None
    delays_ms: list[int] = field(default_factory=list)
    # (exchange, routing key) of each returned message, and why they routed nowhere (the
    # bindings of the exchange: ``rmqkit.publishing.targets.routing_hint``), once looked up
    returned_to: list[tuple[str, str]] = field(default_factory=list)
    routing_hint: str | None = None

    def as_dict(self) -> dict[str, Any]:
        counts: dict[str, Any] = {
            "published": self.published,
            "confirmed": self.confirmed,
            "returned": self.returned,
            "nacked": self.nacked,
            "retried": self.retried,
        }
        if self.too_large:  # only when the broker refused some: the plain summary keeps its keys
            counts["too_large"] = self.too_large
        if self.lanes is not None:  # only with a topology/delay: the plain summary keeps its keys
            counts |= {"lanes": dict(sorted(self.lanes.items())), "delayed": len(self.delays_ms)}
        return counts

    def failure(self) -> RmqkitError | None:
        """The error of a run that did not get every message confirmed (None if it did):
        returned ones first (DataError 65: retrying does not help), then busy (69)."""
        if self.returned and self.routing_hint:
            return DataError(
                f"{self.returned} message(s) were unroutable and were returned, e.g. message_id "
                f"{self.returned_ids[0]}: {self.routing_hint}"
            )
        if self.returned:
            return DataError(
                f"{self.returned} message(s) were unroutable (no queue bound for them) and were "
                f"returned, e.g. message_id {self.returned_ids[0]} — check the routing key and "
                "bindings (`rmqkit plan`)"
            )
        if self.too_large:
            return MessageTooLarge(
                f"{self.too_large} message(s) larger than the broker's max_message_size "
                f"({self.max_message_bytes} bytes) were refused, e.g. message_id "
                f"{self.too_large_ids[0]}; every other message is settled as counted — send "
                "smaller bodies (a reference to the payload, or split it), or raise "
                "max_message_size in rabbitmq.conf"
            )
        if self.nacked:
            return BrokerUnavailable(
                f"broker busy: {self.nacked} message(s) refused because a bounded queue is full "
                "(overflow reject-publish) — retry later, or use --retry-busy; every other "
                "message is confirmed"
            )
        return None

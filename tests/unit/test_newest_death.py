"""ParkedMessage describes the newest death: rmqkit's parking headers or the broker's x-death."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pamqp.commands import Basic

from rmqkit import headers as h
from rmqkit.parking.model import ParkedMessage, broker_death_is_newest

T0 = datetime(2026, 11, 30, 9, 0, 0, 700000, tzinfo=UTC)


def _parked(headers: dict[str, Any]) -> ParkedMessage:
    return ParkedMessage.from_delivery(1, Basic.Properties(message_id="m", headers=headers), b"x")


def _record(at: datetime, *, reason: str | None = "permanent") -> dict[str, Any]:
    headers: dict[str, Any] = {
        h.ORIGIN_QUEUE: "a.work",
        h.ORIGINAL_ROUTING_KEY: "a.created",
        h.ERROR_TYPE: "myapp.Bad",
        h.ERROR_MESSAGE: "bad",
        h.ATTEMPT: 1,
        h.FIRST_FAILED_AT: h.format_timestamp(at),
        h.LAST_FAILED_AT: h.format_timestamp(at),
    }
    if reason is not None:
        headers[h.PARK_REASON] = reason
    return headers


def _death(queue: str, reason: str, at: datetime, key: str = "k") -> dict[str, Any]:
    return {
        "queue": queue,
        "reason": reason,
        "count": 1,
        "time": at.replace(microsecond=0),  # the broker's whole seconds
        "exchange": "",
        "routing-keys": [key],
    }


def test_parked_by_rmqkit_without_x_death_is_its_record() -> None:
    message = _parked(_record(T0))
    assert (message.reason, message.error_type, message.last_failed_at) == (
        "permanent",
        "myapp.Bad",
        T0.replace(microsecond=700000),
    )
    assert message.original_routing_key == "a.created"


def test_replayed_then_delivery_limit_within_the_same_second_is_the_broker_death() -> None:
    replayed = T0 + timedelta(milliseconds=200)
    headers = _record(T0) | {
        h.REPLAYED_AT: h.format_timestamp(replayed),
        h.ATTEMPT: 0,
        "x-death": [_death("b.work", "delivery_limit", T0)],  # rounded down: before T0
    }
    message = _parked(headers)
    assert message.reason == "delivery_limit" and message.origin_queue == "b.work"
    assert message.error_type is None and message.error_message is None
    assert message.last_failed_at == replayed  # the death came after the replay
    assert message.first_failed_at == T0  # the history is kept
    assert message.attempts == 1
    assert message.original_routing_key == "a.created"  # rmqkit's header still wins


def test_a_retry_copy_that_hits_the_delivery_limit_is_the_broker_death() -> None:
    later = T0 + timedelta(minutes=3)
    message = _parked(
        _record(T0, reason=None) | {"x-death": [_death("a.work", "delivery_limit", later)]}
    )
    assert message.reason == "delivery_limit" and message.last_failed_at == later.replace(
        microsecond=0
    )


def test_an_x_death_older_than_rmqkit_record_does_not_win() -> None:
    """e.g. an imported message that kept an old x-death next to a newer rmqkit parking."""
    old = T0 - timedelta(hours=1)
    message = _parked(_record(T0) | {"x-death": [_death("a.work", "rejected", old)]})
    assert message.reason == "permanent" and message.last_failed_at == T0
    assert message.error_type == "myapp.Bad"


def test_a_later_second_in_x_death_wins_without_a_replay_header() -> None:
    later = T0 + timedelta(seconds=5)
    message = _parked(_record(T0) | {"x-death": [_death("a.work", "maxlen", later)]})
    assert message.reason == "maxlen" and message.last_failed_at == later.replace(microsecond=0)


def test_broker_only_origin_is_the_newest_entry_and_the_key_the_oldest_entry_there() -> None:
    t = T0.replace(microsecond=0)
    message = _parked(
        {
            "x-death": [
                _death("w", "delivery_limit", t, key="w"),  # came back from a wait queue
                _death("w.wait", "expired", t, key="w.wait"),
                _death("w", "rejected", t, key="orders.created"),  # the producer's key
                _death("upstream", "rejected", t, key="upstream"),
            ]
        }
    )
    assert message.reason == "delivery_limit" and message.origin_queue == "w"
    assert message.original_routing_key == "orders.created"
    assert message.attempts == 3  # every death but the expiry


def test_the_rule() -> None:
    assert broker_death_is_newest(None, T0, None, None)
    assert broker_death_is_newest("permanent", None, None, None)
    assert broker_death_is_newest("permanent", T0, T0, None)
    assert not broker_death_is_newest("permanent", T0, T0 - timedelta(seconds=1), T0)
    assert broker_death_is_newest("permanent", T0, None, T0 + timedelta(seconds=1))

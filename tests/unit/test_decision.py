"""The per-message decision (ack / retry / park): every branch, tier and slot choice, the headers of
the copies, and attempt counting through simulated republish cycles on 3.10-, 3.13- and 4.x-style
brokers."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import decode as pamqp_decode
from pamqp import encode as pamqp_encode

from rmqkit import headers as h
from rmqkit.consumer.attempts import attempt_number, delivery_count
from rmqkit.consumer.decision import (
    Ack,
    Failed,
    HandlerTimeout,
    MissingMessageId,
    Park,
    RetryLater,
    Success,
    TooLarge,
    Undecodable,
    decide,
    qualified_type_name,
)
from rmqkit.consumer.policy import QueuePolicy
from rmqkit.fingerprint import fingerprint

NOW = datetime(2026, 11, 29, 16, 0, 0, 123_456, tzinfo=UTC)
NOW_TEXT = "2026-11-29T16:00:00.123Z"


def slots(base: str, count: int) -> tuple[str, ...]:
    return (*(f"{base}.slot-{i}" for i in range(count - 1)), base)


POLICY = QueuePolicy(
    queue="orders.work",
    parking_queue="orders.work.parking",
    retry_delays_ms=(1000, 5000, 30000),
    max_attempts=5,
    wait_queues=(
        slots("orders.work.wait.1s", 4),
        slots("orders.work.wait.5s", 4),
        ("orders.work.wait.30s",),
    ),
    permanent_errors=frozenset({"myapp.errors.BadInput", "KeyError", "Rejected"}),
)
TRANSIENT = Failed(
    "myapp.db.Timeout", "db timed out", "Traceback...\nmyapp.db.Timeout: db timed out"
)


def run(
    outcome: Any,
    headers: dict[str, Any] | None,
    policy: QueuePolicy = POLICY,
    *,
    exchange: str = "orders",
    routing_key: str = "orders.created",
    now: datetime = NOW,
    rand: Any = None,
) -> Ack | RetryLater | Park:
    return decide(
        outcome,
        headers,
        policy,
        exchange=exchange,
        routing_key=routing_key,
        now=now,
        host="worker-1",
        pid=4242,
        **({} if rand is None else {"rand": rand}),
    )


def roundtrip(headers: dict[str, Any]) -> dict[str, Any]:
    _, decoded = pamqp_decode.field_table(pamqp_encode.field_table(headers))
    return dict(decoded)


def assert_publishable(headers: dict[str, Any]) -> None:
    assert h.is_amqp_value(headers), headers
    pamqp_encode.field_table(headers)  # raises TypeError on what aio-pika could not publish


# --- the branches --------------------------------------------------------------------------------


@pytest.mark.parametrize("headers", [None, {}, {"x-death": [{"queue": "q", "reason": "rejected"}]}])
def test_success_acks(headers: dict[str, Any] | None) -> None:
    assert run(Success(), headers) == Ack()


def test_first_transient_failure_retries_in_tier_0() -> None:
    decision = run(TRANSIENT, {"tenant": "t1", "x-delivery-count": 0}, rand=lambda: 0.0)
    assert isinstance(decision, RetryLater)
    assert decision.target_queue == "orders.work.wait.1s.slot-0"
    assert (decision.tier_index, decision.delay_ms) == (0, 1000)
    assert decision.headers == {
        "tenant": "t1",
        h.ATTEMPT: 1,
        h.ORIGIN_QUEUE: "orders.work",
        h.ORIGINAL_EXCHANGE: "orders",
        h.ORIGINAL_ROUTING_KEY: "orders.created",
        h.FIRST_FAILED_AT: NOW_TEXT,
        h.LAST_FAILED_AT: NOW_TEXT,
        h.ERROR_TYPE: "myapp.db.Timeout",
        h.ERROR_MESSAGE: "db timed out",
        h.HOST: "worker-1",
        h.PID: 4242,
        h.DELIVERED: 1,
        h.RETRY_TIER: 0,
        h.RETRY_DELAY_MS: 1000,
    }
    assert_publishable(decision.headers)


@pytest.mark.parametrize(
    ("attempts_so_far", "tier"),
    [(0, 0), (1, 1), (2, 2), (3, 2), (7, 2), (40, 2)],
)
def test_tier_follows_the_attempt_and_the_last_tier_repeats(
    attempts_so_far: int, tier: int
) -> None:
    policy = QueuePolicy(
        queue=POLICY.queue,
        parking_queue=POLICY.parking_queue,
        retry_delays_ms=POLICY.retry_delays_ms,
        max_attempts=100,
        wait_queues=POLICY.wait_queues,
    )
    decision = run(TRANSIENT, {h.ATTEMPT: attempts_so_far}, policy)
    assert isinstance(decision, RetryLater)
    assert decision.tier_index == tier
    assert decision.target_queue in POLICY.wait_queues[tier]
    assert decision.delay_ms == POLICY.retry_delays_ms[tier]
    assert decision.headers[h.ATTEMPT] == attempts_so_far + 1
    assert decision.headers[h.RETRY_TIER] == tier


def test_last_allowed_attempt_parks_exhausted_with_the_last_error() -> None:
    earlier = run(TRANSIENT, {h.ATTEMPT: 3})
    assert isinstance(earlier, RetryLater) and earlier.headers[h.ATTEMPT] == 4
    last_error = Failed(
        "builtins.ValueError", "bad total 42", "Traceback (most recent call last):\n"
    )
    decision = run(last_error, earlier.headers)
    assert isinstance(decision, Park)
    assert decision.reason == h.ParkingReason.EXHAUSTED
    assert decision.target_queue == "orders.work.parking"
    assert decision.headers[h.PARK_REASON] == "exhausted"
    assert decision.headers[h.ATTEMPT] == 5
    assert decision.headers[h.ERROR_TYPE] == "builtins.ValueError"
    assert decision.headers[h.ERROR_MESSAGE] == "bad total 42"
    assert decision.headers[h.TRACEBACK] == "Traceback (most recent call last):\n"
    assert_publishable(decision.headers)


def test_beyond_max_attempts_still_parks() -> None:
    decision = run(TRANSIENT, {h.ATTEMPT: 50})
    assert isinstance(decision, Park) and decision.reason == h.ParkingReason.EXHAUSTED
    assert decision.headers[h.ATTEMPT] == 51


def test_max_attempts_1_parks_on_first_failure() -> None:
    policy = QueuePolicy("q", "q.parking", (1000,), 1, (("q.wait.1s",),))
    decision = run(TRANSIENT, {}, policy)
    assert isinstance(decision, Park) and decision.reason == h.ParkingReason.EXHAUSTED
    assert decision.headers[h.ATTEMPT] == 1


def test_no_retry_tiers_parks_exhausted_on_first_failure() -> None:
    policy = QueuePolicy("q", "q.parking", (), 5, ())
    assert policy.effective_max_attempts == 1
    for outcome in (TRANSIENT, HandlerTimeout(30.0), Failed("E", "m", retry_delay_s=2.0)):
        decision = run(outcome, {}, policy)
        assert isinstance(decision, Park) and decision.reason == h.ParkingReason.EXHAUSTED
        assert decision.target_queue == "q.parking"
    assert POLICY.effective_max_attempts == 5


def test_permanent_flag_parks_at_once() -> None:
    for outcome in (
        Failed("rmqkit.Permanent", "order unknown", "tb", permanent=True),
        Failed("rmqkit.Permanent", "order unknown", "tb", permanent=True, retry_delay_s=5.0),
    ):
        decision = run(outcome, {})
        assert isinstance(decision, Park) and decision.reason == h.ParkingReason.PERMANENT
        assert decision.headers[h.ATTEMPT] == 1
        assert decision.headers[h.ERROR_MESSAGE] == "order unknown"
        assert decision.headers[h.PARK_REASON] == "permanent"


@pytest.mark.parametrize(
    ("exc_type", "base_types", "permanent"),
    [
        ("myapp.errors.BadInput", (), True),  # qualified entry
        ("other.mod.Rejected", (), True),  # bare entry
        ("Rejected", (), True),
        ("KeyError", (), True),  # builtin, as qualified_type_name writes it
        ("builtins.KeyError", (), True),
        ("myapp.errors.NotBadInput", (), False),  # no suffix confusion
        ("myapp.errors.BadInputs", (), False),
        ("myapp.errors.MissingField", ("myapp.errors.BadInput", "Exception"), True),  # subclass
        ("myapp.db.Timeout", ("Exception",), False),
    ],
)
def test_permanent_errors_by_type_name(
    exc_type: str, base_types: tuple[str, ...], permanent: bool
) -> None:
    decision = run(Failed(exc_type, "m", base_types=base_types), {})
    if permanent:
        assert isinstance(decision, Park) and decision.reason == h.ParkingReason.PERMANENT
    else:
        assert isinstance(decision, RetryLater)


def test_permanent_error_entry_written_qualified_for_a_builtin() -> None:
    policy = QueuePolicy("q", "q.p", (1000,), 3, (("q.w",),), frozenset({"builtins.LookupError"}))
    decision = run(Failed.from_exception(KeyError("k")), {}, policy)
    assert isinstance(decision, Park) and decision.reason == h.ParkingReason.PERMANENT


def test_undecodable_parks_at_once() -> None:
    decision = run(Undecodable("Expecting value: line 1 column 1 (char 0)"), {"tenant": "t1"})
    assert isinstance(decision, Park) and decision.reason == h.ParkingReason.UNDECODABLE
    assert decision.headers[h.ERROR_TYPE] == "rmqkit.Undecodable"
    assert decision.headers[h.ERROR_MESSAGE] == "Expecting value: line 1 column 1 (char 0)"
    assert h.TRACEBACK not in decision.headers
    assert decision.headers[h.ATTEMPT] == 1
    detailed = run(Undecodable("1 validation error", "pydantic_core.ValidationError", "tb"), {})
    assert isinstance(detailed, Park)
    assert detailed.headers[h.ERROR_TYPE] == "pydantic_core.ValidationError"
    assert detailed.headers[h.TRACEBACK] == "tb"


def test_too_large_and_missing_message_id_park_with_their_reasons() -> None:
    too_large = run(TooLarge(size_bytes=20_000_000, limit_bytes=1_048_576), {})
    assert isinstance(too_large, Park) and too_large.reason == h.ParkingReason.TOO_LARGE
    assert too_large.headers[h.PARK_REASON] == "too_large"
    assert "20000000" in too_large.headers[h.ERROR_MESSAGE]
    missing = run(MissingMessageId(), {})
    assert isinstance(missing, Park) and missing.reason == h.ParkingReason.MISSING_MESSAGE_ID
    assert missing.headers[h.ERROR_TYPE] == "rmqkit.MissingMessageId"


def test_handler_timeout_is_transient() -> None:
    decision = run(HandlerTimeout(timeout_s=30.0), {})
    assert isinstance(decision, RetryLater) and decision.tier_index == 0
    assert decision.headers[h.ERROR_TYPE] == "rmqkit.HandlerTimeout"
    assert decision.headers[h.ERROR_MESSAGE] == "handler did not finish within 30 s"
    last = run(HandlerTimeout(timeout_s=2.5), {h.ATTEMPT: 4})
    assert isinstance(last, Park) and last.reason == h.ParkingReason.EXHAUSTED
    assert last.headers[h.ERROR_TYPE] == "rmqkit.HandlerTimeout"


# --- rmqkit.Retry(delay_s=...) picks a tier ------------------------------------------------------


@pytest.mark.parametrize(
    ("delay_s", "tier"),
    [(0.0, 0), (0.5, 0), (1.0, 0), (1.001, 1), (5, 1), (5.5, 2), (30, 2), (3600, 2)],
)
def test_requested_delay_picks_the_smallest_tier_that_is_long_enough(
    delay_s: float, tier: int
) -> None:
    # regardless of the attempt: a 3rd attempt asking for 1 s waits 1 s
    for attempts_so_far in (0, 2):
        decision = run(Failed("E", "m", retry_delay_s=delay_s), {h.ATTEMPT: attempts_so_far})
        assert isinstance(decision, RetryLater)
        assert decision.tier_index == tier
        assert decision.headers[h.RETRY_DELAY_MS] == POLICY.retry_delays_ms[tier]


def test_requested_delay_with_unsorted_tiers() -> None:
    policy = QueuePolicy("q", "q.p", (5000, 1000, 20000), 9, (("q.w5",), ("q.w1",), ("q.w20",)))
    picks = {
        delay: run(Failed("E", "m", retry_delay_s=delay), {}, policy) for delay in (0.5, 2.0, 60.0)
    }
    assert {d: (p.target_queue if isinstance(p, RetryLater) else p) for d, p in picks.items()} == {
        0.5: "q.w1",
        2.0: "q.w5",
        60.0: "q.w20",
    }


def test_requested_delay_does_not_extend_max_attempts() -> None:
    decision = run(Failed("E", "m", retry_delay_s=1.0), {h.ATTEMPT: 4})
    assert isinstance(decision, Park) and decision.reason == h.ParkingReason.EXHAUSTED


# --- jitter slots ---------------------------------------------------------------------------------


def test_slots_spread_evenly_with_a_seeded_rand() -> None:
    rng = random.Random(20261129)
    picks: Counter[str] = Counter()
    for _ in range(10_000):
        decision = run(TRANSIENT, {h.ATTEMPT: 1}, rand=rng.random)
        assert isinstance(decision, RetryLater) and decision.tier_index == 1
        picks[decision.target_queue] += 1
    assert set(picks) == set(POLICY.wait_queues[1])
    # 2,500 expected per slot; binomial sd ≈ 43, so ±150 is 3.5 sd
    assert all(abs(count - 2500) < 150 for count in picks.values()), picks
    chi_square = sum((count - 2500) ** 2 / 2500 for count in picks.values())
    assert chi_square < 16.27  # p = 0.001 for 3 degrees of freedom


@pytest.mark.parametrize(
    ("value", "slot"),
    [(0.0, 0), (0.2499, 0), (0.25, 1), (0.5, 2), (0.75, 3), (0.99999, 3), (1.0, 3)],
)
def test_slot_boundaries(value: float, slot: int) -> None:
    decision = run(TRANSIENT, {}, rand=lambda: value)
    assert isinstance(decision, RetryLater)
    assert decision.target_queue == POLICY.wait_queues[0][slot]


def test_single_slot_tier() -> None:
    decision = run(TRANSIENT, {h.ATTEMPT: 2}, rand=lambda: 0.7)
    assert isinstance(decision, RetryLater) and decision.target_queue == "orders.work.wait.30s"


def test_default_rand_is_random() -> None:
    targets = {
        d.target_queue
        for d in (run(TRANSIENT, {}) for _ in range(200))
        if isinstance(d, RetryLater)
    }
    assert targets == set(POLICY.wait_queues[0])


# --- headers of the copies -----------------------------------------------------------------------

RECEIVED_310_BROKER_LOOP = {  # recorded on 3.10.8, see test_attempts.V310_NAMED_EXCHANGE_LOOP
    "tenant": "t1",
    "x-death": [
        {
            "count": 1,
            "exchange": "",
            "queue": "orders.work.wait.0",
            "reason": "expired",
            "routing-keys": ["orders.work.wait.0"],
            "time": datetime(2026, 11, 29, 16, 26, 14, tzinfo=UTC),
        },
        {
            "count": 1,
            "exchange": "orders",
            "original-expiration": "60000",
            "queue": "orders.work",
            "reason": "rejected",
            "routing-keys": ["orders.created"],
            "time": datetime(2026, 11, 29, 16, 26, 14, tzinfo=UTC),
        },
    ],
    "x-delivery-count": 0,
    "x-first-death-exchange": "orders",
    "x-first-death-queue": "orders.work",
    "x-first-death-reason": "rejected",
    "x-last-death-exchange": "",
    "x-last-death-queue": "orders.work.wait.0",
    "x-last-death-reason": "expired",
}


@pytest.mark.parametrize(
    "outcome", [TRANSIENT, Failed("E", "m", permanent=True), Undecodable("bad json")]
)
def test_broker_headers_are_stripped_from_every_copy(outcome: Any) -> None:
    decision = run(outcome, RECEIVED_310_BROKER_LOOP, exchange="", routing_key="orders.work")
    assert isinstance(decision, RetryLater | Park)
    assert not set(decision.headers) & h.BROKER_HEADERS
    assert decision.headers["tenant"] == "t1"
    assert_publishable(decision.headers)


def test_copy_of_a_broker_driven_loop_message_takes_its_origin_from_x_death() -> None:
    # delivered back from the wait queue: exchange "" and routing key = the work queue's name
    decision = run(TRANSIENT, RECEIVED_310_BROKER_LOOP, exchange="", routing_key="orders.work")
    assert isinstance(decision, RetryLater)
    assert decision.headers[h.ATTEMPT] == 2  # one broker-driven rejection before this delivery
    assert decision.tier_index == 1
    assert decision.headers[h.ORIGINAL_EXCHANGE] == "orders"
    assert decision.headers[h.ORIGINAL_ROUTING_KEY] == "orders.created"
    assert decision.headers[h.FIRST_FAILED_AT] == "2026-11-29T16:26:14.000Z"
    assert decision.headers[h.LAST_FAILED_AT] == NOW_TEXT


def test_original_route_and_first_failure_are_kept_not_overwritten() -> None:
    first = run(TRANSIENT, {}, exchange="orders", routing_key="orders.created")
    assert isinstance(first, RetryLater)
    later = NOW + timedelta(seconds=7)
    # the copy comes back through the default exchange with the work queue as routing key
    second = run(TRANSIENT, first.headers, exchange="", routing_key="orders.work", now=later)
    assert isinstance(second, RetryLater)
    assert second.headers[h.ORIGINAL_EXCHANGE] == "orders"
    assert second.headers[h.ORIGINAL_ROUTING_KEY] == "orders.created"
    assert second.headers[h.FIRST_FAILED_AT] == NOW_TEXT
    assert second.headers[h.LAST_FAILED_AT] == "2026-11-29T16:00:07.123Z"
    parked = run(Failed("E", "m", permanent=True), second.headers, exchange="", routing_key="x")
    assert isinstance(parked, Park)
    assert parked.headers[h.ORIGINAL_EXCHANGE] == "orders"
    assert parked.headers[h.ORIGINAL_ROUTING_KEY] == "orders.created"
    assert parked.headers[h.FIRST_FAILED_AT] == NOW_TEXT


def test_default_exchange_original_is_kept_as_empty_string() -> None:
    first = run(TRANSIENT, {}, exchange="", routing_key="orders.work")
    assert isinstance(first, RetryLater)
    assert first.headers[h.ORIGINAL_EXCHANGE] == ""
    again = run(TRANSIENT, {**first.headers, h.ATTEMPT: 1}, exchange="ignored", routing_key="x")
    assert isinstance(again, RetryLater) and again.headers[h.ORIGINAL_EXCHANGE] == ""


def test_unreadable_first_failure_time_is_replaced() -> None:
    decision = run(TRANSIENT, {h.FIRST_FAILED_AT: "yesterday"})
    assert isinstance(decision, RetryLater) and decision.headers[h.FIRST_FAILED_AT] == NOW_TEXT


def test_park_headers_are_complete() -> None:
    decision = run(
        Failed("myapp.errors.BadInput", "field 'total' is negative", "Traceback...\n"),
        {"tenant": "t1", h.ATTEMPT: 1, h.ORIGINAL_EXCHANGE: "orders"},
        exchange="",
        routing_key="orders.work",
    )
    assert isinstance(decision, Park)
    assert decision.headers == {
        "tenant": "t1",
        h.ATTEMPT: 2,
        h.PARK_REASON: "permanent",
        h.ERROR_TYPE: "myapp.errors.BadInput",
        h.ERROR_MESSAGE: "field 'total' is negative",
        h.TRACEBACK: "Traceback...\n",
        h.ORIGIN_QUEUE: "orders.work",
        h.ORIGINAL_EXCHANGE: "orders",
        h.ORIGINAL_ROUTING_KEY: "orders.work",  # absent before: this delivery's
        h.FIRST_FAILED_AT: NOW_TEXT,
        h.LAST_FAILED_AT: NOW_TEXT,
        h.HOST: "worker-1",
        h.PID: 4242,
        h.DELIVERED: 1,
        h.FINGERPRINT: fingerprint(
            "permanent", "myapp.errors.BadInput", "field 'total' is negative", "Traceback...\n"
        ).id,
    }


def test_error_text_and_traceback_are_bounded() -> None:
    huge = Failed("E", "x" * 50_000, "".join(f"  frame {i}\n" for i in range(10_000)) + "E: end\n")
    for headers in ({}, {h.ATTEMPT: 4}):
        decision = run(huge, headers)
        assert isinstance(decision, RetryLater | Park)
        assert len(decision.headers[h.ERROR_MESSAGE]) == h.ERROR_MESSAGE_MAX_CHARS
    parked = run(huge, {h.ATTEMPT: 4})
    assert isinstance(parked, Park)
    assert len(parked.headers[h.TRACEBACK]) == h.TRACEBACK_MAX_CHARS
    assert parked.headers[h.TRACEBACK].endswith("E: end\n")
    assert len(pamqp_encode.field_table(parked.headers)) < 8 * 1024


def test_retry_copy_of_a_replayed_message_drops_stale_parking_details() -> None:
    replayed = {
        h.ATTEMPT: 0,
        h.PARK_REASON: "exhausted",
        h.TRACEBACK: "old traceback",
        h.ERROR_TYPE: "Old",
        h.REPLAY_COUNT: 1,
        h.REPLAYED_AT: "2026-11-29T15:00:00.000Z",
        h.FIRST_FAILED_AT: "2026-11-28T10:00:00.000Z",
    }
    decision = run(TRANSIENT, replayed)
    assert isinstance(decision, RetryLater)
    assert h.PARK_REASON not in decision.headers and h.TRACEBACK not in decision.headers
    assert decision.headers[h.ERROR_TYPE] == "myapp.db.Timeout"
    assert decision.headers[h.REPLAY_COUNT] == 1  # replay history is kept
    assert decision.headers[h.FIRST_FAILED_AT] == "2026-11-28T10:00:00.000Z"
    assert decision.headers[h.ATTEMPT] == 1
    parked = run(Failed("E", "m", permanent=True), {**replayed})
    assert isinstance(parked, Park)
    assert h.TRACEBACK not in parked.headers  # the new error has no traceback: no stale one


def test_undecodable_header_values_are_made_publishable() -> None:
    decision = run(TRANSIENT, {"legacy": b"\xff", "tags": ("a", "b")})
    assert isinstance(decision, RetryLater)
    assert decision.headers["legacy"] == bytearray(b"\xff")
    assert decision.headers["tags"] == ["a", "b"]
    assert_publishable(decision.headers)


def test_decision_does_not_mutate_the_delivery_headers() -> None:
    received = {"tags": ["a"], "x-death": [{"queue": "q", "reason": "expired", "count": 1}]}
    snapshot = {"tags": ["a"], "x-death": [{"queue": "q", "reason": "expired", "count": 1}]}
    decision = run(TRANSIENT, received)
    assert isinstance(decision, RetryLater)
    decision.headers["tags"].append("b")
    assert received == snapshot


def test_naive_now_is_utc() -> None:
    decision = run(TRANSIENT, {}, now=NOW.replace(tzinfo=None))
    assert isinstance(decision, RetryLater) and decision.headers[h.LAST_FAILED_AT] == NOW_TEXT


# --- Failed.from_exception and policy validation --------------------------------------------------


class BadInput(ValueError):
    pass


def test_failed_from_exception() -> None:
    try:
        raise BadInput("total is negative")
    except BadInput as exc:
        failed = Failed.from_exception(exc, retry_delay_s=3.0)
    assert failed.exc_type == f"{__name__}.BadInput"
    assert failed.exc_message == "total is negative"
    assert "raise BadInput" in failed.traceback_text() and failed.traceback_text().endswith(
        "negative\n"
    )
    assert failed.base_types == ("ValueError", "Exception")
    assert failed.retry_delay_s == 3.0 and not failed.permanent
    assert qualified_type_name(KeyError) == "KeyError"
    policy = QueuePolicy("q", "q.p", (1000,), 3, (("q.w",),), frozenset({"ValueError"}))
    decision = run(failed, {}, policy)
    assert isinstance(decision, Park) and decision.reason == h.ParkingReason.PERMANENT


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"retry_delays_ms": (1000,)}, "retry delays"),
        ({"retry_delays_ms": (0, 1000), "wait_queues": (("a",), ("b",))}, "positive"),
        ({"retry_delays_ms": (1000,), "wait_queues": ((),)}, "no wait queue"),
    ],
)
def test_policy_validation(kwargs: dict[str, Any], message: str) -> None:
    arguments: dict[str, Any] = {
        "queue": "q",
        "parking_queue": "q.p",
        "retry_delays_ms": (1000, 5000),
        "max_attempts": 3,
        "wait_queues": (("a",), ("b",)),
    }
    with pytest.raises(ValueError, match=message):
        QueuePolicy(**{**arguments, **kwargs})


# --- simulated republish cycles on 3.10-, 3.13- and 4.x-style brokers -----------------------------


@dataclass
class SimMessage:
    headers: dict[str, Any]
    exchange: str
    routing_key: str
    # 4.x keeps its death records as message annotations: a client publish starts them empty and the
    # client's x-death header is never read back
    records: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class SimBroker:
    """Dead-lettering as the broker versions do it (see rabbitmq-facts.md and test_attempts)."""

    version: str  # "3.10", "3.13" or "4.x"
    clock: datetime = datetime(2026, 11, 29, 16, 0, 0, tzinfo=UTC)

    def publish(self, exchange: str, routing_key: str, headers: dict[str, Any]) -> SimMessage:
        return SimMessage(roundtrip(headers), exchange, routing_key)

    def dead_letter(self, message: SimMessage, *, queue: str, reason: str, to: str) -> SimMessage:
        self.clock += timedelta(seconds=1)
        headers = dict(message.headers)
        if self.version == "4.x":
            records = [dict(r) for r in message.records]
        else:  # 3.x reads x-death back from the headers, whoever wrote it
            records = [dict(r) for r in headers.get("x-death", [])]
        existing = next((r for r in records if (r["queue"], r["reason"]) == (queue, reason)), None)
        if existing is None:
            entry = {
                "count": 1,
                "reason": reason,
                "queue": queue,
                "time": self.clock,
                "exchange": message.exchange,
                "routing-keys": [message.routing_key],
            }
        else:
            records.remove(existing)
            entry = {**existing, "count": existing["count"] + 1}
        first = not records and existing is None
        records.insert(0, entry)
        headers["x-death"] = records
        if self.version == "4.x" and first:
            headers["x-first-death-queue"] = queue
            headers["x-first-death-reason"] = reason
            headers["x-first-death-exchange"] = message.exchange
        else:
            headers.setdefault("x-first-death-queue", queue)
            headers.setdefault("x-first-death-reason", reason)
            headers.setdefault("x-first-death-exchange", message.exchange)
        if self.version != "3.10":
            headers["x-last-death-queue"] = queue
            headers["x-last-death-reason"] = reason
            headers["x-last-death-exchange"] = message.exchange
        headers.pop("x-delivery-count", None)  # dead-lettering resets the quorum delivery count
        return SimMessage(roundtrip(headers), "", to, records)

    def deliver(self, message: SimMessage, delivery_count: int = 0) -> dict[str, Any]:
        headers = dict(message.headers)
        if self.version == "3.10" or delivery_count > 0:  # omitted at 0 since 3.12
            headers["x-delivery-count"] = delivery_count
        return roundtrip(headers)


VERSIONS = ["3.10", "3.13", "4.x"]


def handle_until_settled(
    broker: SimBroker,
    message: SimMessage,
    outcomes: list[Any],
    policy: QueuePolicy = POLICY,
    rand: Any = None,
) -> tuple[Park | Ack, list[int], list[RetryLater]]:
    """Deliver, decide, carry the decision out as the runner would; return the final decision, the
    attempt number the handler saw on each delivery, and the retries made."""
    seen: list[int] = []
    retries: list[RetryLater] = []
    for outcome in outcomes:
        headers = broker.deliver(message)
        seen.append(attempt_number(headers, policy.queue, wait_queues=policy.all_wait_queues))
        decision = run(
            outcome,
            headers,
            policy,
            exchange=message.exchange,
            routing_key=message.routing_key,
            now=broker.clock,
            rand=rand,
        )
        if isinstance(decision, Ack | Park):
            return decision, seen, retries
        retries.append(decision)
        copy = broker.publish("", decision.target_queue, decision.headers)
        message = broker.dead_letter(
            copy, queue=decision.target_queue, reason="expired", to=policy.queue
        )
    raise AssertionError("not settled")


@pytest.mark.parametrize("version", VERSIONS)
def test_failing_every_time_is_handled_max_attempts_times_then_parked(version: str) -> None:
    broker = SimBroker(version)
    message = broker.publish("orders", "orders.created", {"tenant": "t1"})
    final, seen, retries = handle_until_settled(broker, message, [TRANSIENT] * 20)
    assert seen == [1, 2, 3, 4, 5]
    assert [r.tier_index for r in retries] == [0, 1, 2, 2]
    assert isinstance(final, Park) and final.reason == h.ParkingReason.EXHAUSTED
    assert final.headers[h.ATTEMPT] == 5
    assert final.headers[h.ORIGINAL_EXCHANGE] == "orders"
    assert final.headers[h.ORIGINAL_ROUTING_KEY] == "orders.created"
    assert final.headers[h.FIRST_FAILED_AT] == "2026-11-29T16:00:00.000Z"
    assert final.headers[h.LAST_FAILED_AT] == "2026-11-29T16:00:04.000Z"
    assert not set(final.headers) & h.BROKER_HEADERS
    assert_publishable(final.headers)


@pytest.mark.parametrize("version", VERSIONS)
def test_transient_twice_then_success(version: str) -> None:
    broker = SimBroker(version)
    message = broker.publish("orders", "orders.created", {})
    final, seen, _ = handle_until_settled(broker, message, [TRANSIENT, TRANSIENT, Success()])
    assert final == Ack() and seen == [1, 2, 3]


@pytest.mark.parametrize("version", VERSIONS)
def test_taking_over_a_broker_driven_loop(version: str) -> None:
    # two rejections by an old consumer (work --reject--> wait --expired--> work), then rmqkit
    broker = SimBroker(version)
    message = broker.publish("orders", "orders.created", {"tenant": "t1"})
    for _ in range(2):
        waiting = broker.dead_letter(
            message, queue="orders.work", reason="rejected", to="orders.work.wait.5s"
        )
        message = broker.dead_letter(
            waiting, queue="orders.work.wait.5s", reason="expired", to="orders.work"
        )
    final, seen, retries = handle_until_settled(broker, message, [TRANSIENT] * 10)
    assert seen == [3, 4, 5]
    assert [r.tier_index for r in retries] == [2, 2]
    assert isinstance(final, Park) and final.headers[h.ATTEMPT] == 5
    assert final.headers[h.ORIGINAL_EXCHANGE] == "orders"  # recovered from x-death
    assert final.headers[h.ORIGINAL_ROUTING_KEY] == "orders.created"
    assert final.headers[h.FIRST_FAILED_AT] == "2026-11-29T16:00:01.000Z"


def test_without_stripping_3_10_would_keep_growing_x_death() -> None:
    # why strip_broker_headers exists: 3.10 reads a client-set x-death back and adds to it
    broker = SimBroker("3.10")
    message = broker.publish("", "orders.work.wait.1s", {"rmqkit-attempt": 1})
    for _ in range(3):
        message = broker.dead_letter(
            message, queue="orders.work.wait.1s", reason="expired", to="orders.work"
        )
        message = broker.publish("", "orders.work.wait.1s", dict(message.headers))
    assert message.headers["x-death"][0]["count"] == 3
    broker4 = SimBroker("4.x")
    message = broker4.publish("", "orders.work.wait.1s", {"x-death": [{"count": 9}]})
    message = broker4.dead_letter(
        message, queue="orders.work.wait.1s", reason="expired", to="orders.work"
    )
    assert message.headers["x-death"][0]["count"] == 1  # 4.x ignores the client's x-death


outcome_strategy = st.one_of(
    st.just(TRANSIENT),
    st.just(HandlerTimeout(5.0)),
    st.builds(
        lambda d: Failed("E", "m", retry_delay_s=d),
        st.floats(0, 100, allow_nan=False),
    ),
    st.just(Success()),
    st.just(Failed("E", "m", permanent=True)),
)


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(VERSIONS),
    st.lists(outcome_strategy, min_size=12, max_size=12),
    st.integers(1, 6),
    st.randoms(use_true_random=False),
)
def test_republish_cycles_count_every_attempt_exactly_once(
    version: str, outcomes: list[Any], max_attempts: int, rng: random.Random
) -> None:
    policy = QueuePolicy(
        queue=POLICY.queue,
        parking_queue=POLICY.parking_queue,
        retry_delays_ms=POLICY.retry_delays_ms,
        max_attempts=max_attempts,
        wait_queues=POLICY.wait_queues,
    )
    broker = SimBroker(version)
    message = broker.publish("orders", "orders.created", {})
    final, seen, retries = handle_until_settled(broker, message, outcomes, policy, rng.random)
    assert seen == list(range(1, len(seen) + 1))  # never decreases, never skips
    assert len(seen) <= max_attempts
    assert [r.headers[h.ATTEMPT] for r in retries] == seen[: len(retries)]
    if isinstance(final, Park):
        assert final.headers[h.ATTEMPT] == seen[-1]
        assert final.headers[h.ORIGINAL_ROUTING_KEY] == "orders.created"
        if final.reason == h.ParkingReason.EXHAUSTED:
            assert seen[-1] == max_attempts
        assert_publishable(final.headers)


def test_copies_record_the_brokers_delivery_count() -> None:
    """DELIVERED is the broker's count of the failing delivery (issue 14: a message whose worker
    crashed twice fails on its third delivery), written on retry and park copies alike, and an
    old value is overwritten, never carried along."""
    for outcome in (TRANSIENT, Failed("myapp.errors.BadInput", "bad", "")):
        decision = decide(
            outcome,
            {h.DELIVERED: 7, "x-delivery-count": 2},
            POLICY,
            exchange="orders",
            routing_key="order.created",
            now=NOW,
            host="worker-1",
            pid=4242,
            delivered=3,
        )
        assert isinstance(decision, RetryLater | Park)
        assert decision.headers[h.DELIVERED] == 3
        assert "x-delivery-count" not in decision.headers


@pytest.mark.parametrize(
    ("headers", "redelivered", "count"),
    [
        ({}, False, 1),
        ({}, True, 2),  # no header (3.12+ at 0, classic queues): a lower bound
        ({"x-delivery-count": 0}, False, 1),  # 3.10 sets it at 0
        ({"x-delivery-count": 3}, True, 4),
        ({"x-delivery-count": "5"}, True, 6),
        ({"x-delivery-count": "junk"}, True, 2),
    ],
)
def test_delivery_count(headers: dict[str, Any], redelivered: bool, count: int) -> None:
    assert delivery_count(headers, redelivered) == count


FULL = QueuePolicy(
    queue="q",
    parking_queue="q.parking",
    retry_delays_ms=(1000,),
    max_attempts=3,
    wait_queues=(
        (
            "q.wait.1s.slot-1ms",
            "q.wait.1s.slot-250ms",
            "q.wait.1s.slot-500ms",
            "q.wait.1s.slot-750ms",
            "q.wait.1s",
        ),
    ),
    wait_ttls_ms=((1, 250, 500, 750, 1000),),
    full_jitter=True,
)


def _full_retry(value: float, policy: QueuePolicy = FULL) -> RetryLater:
    decision = decide(
        TRANSIENT,
        {},
        policy,
        exchange="",
        routing_key="q",
        now=NOW,
        host="h",
        pid=1,
        rand=lambda: value,
    )
    assert isinstance(decision, RetryLater)
    return decision


@pytest.mark.parametrize(
    ("value", "slot", "expiration"),
    [
        (0.0, "q.wait.1s.slot-1ms", 0),  # a wait of 0 ms: expires at once
        (0.3, "q.wait.1s.slot-500ms", 300),  # int(0.3 * 1001) = 300: the 500 ms slot
        (0.25, "q.wait.1s.slot-250ms", None),  # 250 ms: the slot's own TTL, no expiration
        (0.9999, "q.wait.1s", None),  # 1000 ms: the full delay
    ],
)
def test_full_jitter_picks_the_slot_at_or_above_the_drawn_wait(
    value: float, slot: str, expiration: int | None
) -> None:
    retry = _full_retry(value)
    assert (retry.target_queue, retry.expiration_ms, retry.delay_ms) == (slot, expiration, 1000)


def test_full_jitter_waits_are_uniform_over_zero_to_the_delay() -> None:
    """Seed 001: uniform over [0, d], not over the slot window [d/2, d]."""
    rng = random.Random(7)
    waits = []
    for _ in range(20_000):
        retry = _full_retry(rng.random())
        index = FULL.wait_queues[0].index(retry.target_queue)
        ttl = FULL.wait_ttls_ms[0][index]
        wait = ttl if retry.expiration_ms is None else retry.expiration_ms
        assert wait <= ttl  # never longer than its slot, so never longer than the tier
        waits.append(wait)
    assert min(waits) == 0 and max(waits) == 1000
    quarters = Counter(min(w // 250, 3) for w in waits)
    assert all(4500 <= quarters[q] <= 5500 for q in range(4)), quarters
    assert abs(sum(waits) / len(waits) - 500) < 15


def test_window_jitter_is_unchanged_and_sets_no_expiration() -> None:
    window = QueuePolicy(
        queue="q",
        parking_queue="q.parking",
        retry_delays_ms=(1000,),
        max_attempts=3,
        wait_queues=(("q.wait.1s.slot-500ms", "q.wait.1s"),),
        wait_ttls_ms=((500, 1000),),
    )
    assert _full_retry(0.0, window).target_queue == "q.wait.1s.slot-500ms"
    assert _full_retry(0.0, window).expiration_ms is None


def test_full_jitter_needs_the_slot_ttls() -> None:
    with pytest.raises(ValueError, match="wait_ttls_ms"):
        QueuePolicy("q", "q.parking", (1000,), 3, (("q.wait.1s",),), full_jitter=True)
    with pytest.raises(ValueError, match="one TTL per slot"):
        QueuePolicy("q", "q.parking", (1000,), 3, (("a", "b"),), wait_ttls_ms=((1000,),))


# --- undecryptable bodies and delayed deliveries (issues 15, 16) ---------------------------------


def test_undecryptable_parks_at_once_with_the_reason_text() -> None:
    from rmqkit.consumer.decision import DecryptFailed

    text = "field customer.name: cannot decrypt (tampered): the ciphertext was altered"
    for headers in ({}, {h.ATTEMPT: 1}):  # never retried, whatever the attempt
        decision = run(DecryptFailed(text, "tampered"), headers)
        assert isinstance(decision, Park)
        assert decision.reason == h.ParkingReason.UNDECRYPTABLE
        assert decision.headers[h.PARK_REASON] == "undecryptable"
        assert decision.headers[h.ERROR_TYPE] == "rmqkit.Undecryptable"
        assert decision.headers[h.ERROR_MESSAGE] == text
        assert h.TRACEBACK not in decision.headers
        assert_publishable(decision.headers)


def _delayed_headers() -> dict[str, Any]:
    from rmqkit.delay import Ladder

    plan = Ladder("rmqkit.delay", 100, 8).plan(1500, "orders", "orders.created", {"k": "v"})
    return dict(plan.headers)


def test_a_delayed_delivery_keeps_the_producers_route_not_the_ladder_stage() -> None:
    headers = _delayed_headers()
    # what the broker hands over when the ladder's last stage dead-letters it into "orders"
    stage = "rmqkit.delay.100ms.after-00"
    decision = run(TRANSIENT, headers, exchange=stage, routing_key="orders.created")
    assert isinstance(decision, RetryLater)
    assert decision.headers[h.ORIGINAL_EXCHANGE] == "orders"
    assert decision.headers[h.ORIGINAL_ROUTING_KEY] == "orders.created"
    parked = run(Failed("E", "m", permanent=True), headers, exchange=stage, routing_key="x")
    assert isinstance(parked, Park) and parked.headers[h.ORIGINAL_EXCHANGE] == "orders"
    # a plain delivery through an exchange that merely looks like a stage is left alone
    plain = run(TRANSIENT, {}, exchange="shop.after-00", routing_key="k")
    assert isinstance(plain, RetryLater) and plain.headers[h.ORIGINAL_EXCHANGE] == "shop.after-00"


def test_a_broker_driven_loop_of_a_delayed_message_maps_its_x_death_route() -> None:
    headers = _delayed_headers()
    headers["x-death"] = [
        {
            "queue": "orders.work",
            "reason": "rejected",
            "count": 1,
            "exchange": "rmqkit.delay.100ms.after-02",
            "routing-keys": ["orders.created"],
            "time": datetime(2026, 11, 29, 15, 0, tzinfo=UTC),
        }
    ]
    decision = run(TRANSIENT, headers, exchange="", routing_key="orders.work")
    assert isinstance(decision, RetryLater)
    assert decision.headers[h.ORIGINAL_EXCHANGE] == "orders"


def test_the_delay_ladders_header_names_are_listed_in_headers() -> None:
    from rmqkit.delay import ladder

    assert h.DELAY_PREFIX == ladder.ALL_HEADERS_PREFIX
    assert h.DELAY_BIT_PREFIX == ladder.BIT_PREFIX
    assert (h.DELAY_TOP, h.DELAY_EXCHANGE, h.DELAY_ROUTING_KEY, h.DELAY_MS, h.DELAY_UNITS) == (
        ladder.TOP,
        ladder.EXCHANGE,
        ladder.ROUTING_KEY,
        ladder.DELAY_MS,
        ladder.UNITS,
    )
    assert {h.DELAY_TOP, h.DELAY_EXCHANGE, h.DELAY_MS} <= h.ALL_HEADERS


# --- counts at the edge of what a header holds, internal errors ------------------------------


def test_counts_of_2_63_minus_1_are_capped_so_the_copy_can_be_written() -> None:
    top = h.COUNT_MAX
    death = {"queue": "orders.work", "reason": "rejected", "count": top}
    for headers in ({h.ATTEMPT: top}, {"x-death": [death]}, {h.ATTEMPT: top, "x-death": [death]}):
        assert attempt_number(headers, "orders.work") == top
        parked = run(TRANSIENT, {**headers, "x-delivery-count": top})
        assert isinstance(parked, Park) and parked.reason == h.ParkingReason.EXHAUSTED
        assert parked.headers[h.ATTEMPT] == top
        pamqp_encode.table_integer(parked.headers[h.ATTEMPT])  # writable as AMQP 'l'
    assert delivery_count({"x-delivery-count": top}) == top
    huge = decide(
        TRANSIENT,
        {},
        POLICY,
        exchange="",
        routing_key="",
        now=NOW,
        host="h",
        pid=1,
        delivered=top + 5,
    )
    assert huge.headers[h.DELIVERED] == top  # type: ignore[union-attr]
    assert attempt_number({h.ATTEMPT: "9" * 5000}, "orders.work") == 1  # not a count


def test_internal_error_park_keeps_the_headers_it_can_and_never_raises() -> None:
    from rmqkit.consumer.decision import internal_error_park

    kwargs: dict[str, Any] = {
        "exchange": "orders",
        "routing_key": "orders.created",
        "now": NOW,
        "host": "worker-1",
        "pid": 4242,
    }
    parked = internal_error_park(
        "TypeError", "bad", "Traceback...", {"app": "x", h.ATTEMPT: 2}, POLICY, **kwargs
    )
    assert parked.reason == h.ParkingReason.INTERNAL_ERROR
    assert parked.headers[h.PARK_REASON] == "internal_error"
    assert (parked.headers["app"], parked.headers[h.ATTEMPT]) == ("x", 3)
    assert parked.headers[h.TRACEBACK] == "Traceback..."
    bare = internal_error_park("TypeError", "bad", "tb", None, POLICY, **kwargs)
    assert bare.headers[h.ORIGIN_QUEUE] == "orders.work" and "app" not in bare.headers
    assert bare.headers[h.ORIGINAL_EXCHANGE] == "orders"


@settings(max_examples=200)
@given(
    st.dictionaries(
        st.sampled_from([*sorted(h.ALL_HEADERS), "x-death", "x-delivery-count", "app"]),
        st.recursive(
            st.none()
            | st.booleans()
            | st.integers()
            | st.floats(allow_nan=True)
            | st.text()
            | st.binary(),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(st.text(max_size=5), inner, max_size=3)
            ),
            max_leaves=10,
        ),
    )
)
def test_decide_never_raises_whatever_the_headers_hold(headers: dict[str, Any]) -> None:
    decision = run(TRANSIENT, headers)
    assert isinstance(decision, RetryLater | Park)
    assert 1 <= decision.headers[h.ATTEMPT] <= h.COUNT_MAX

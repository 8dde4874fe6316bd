"""Attempt counting and x-death parsing on header shapes recorded from RabbitMQ 3.10, 4.0, 4.3.

Shapes are as aio-pika hands them to a consumer (pamqp decoding): long strings ``S`` arrive as
``str`` (``bytes`` only when not valid UTF-8), byte arrays ``x`` as ``bytearray``, the broker's
``count`` (type ``l``) as ``int``, ``time`` (type ``T``, whole seconds) as an aware UTC datetime.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import decode as pamqp_decode
from pamqp import encode as pamqp_encode

from rmqkit import headers as h
from rmqkit.consumer.attempts import attempt_number, attempts_made, recorded_attempts
from rmqkit.deaths import (
    DeathEvent,
    DeathReason,
    delivery_limit_hit,
    parking_reason,
    read_death_history,
    read_x_death,
)
from tests.unit.recorded import v3_10, v4_0, v4_3

T0 = datetime(2026, 11, 29, 16, 26, 5, tzinfo=UTC)
T1 = datetime(2026, 11, 29, 16, 26, 6, tzinfo=UTC)

# --------------------------------------------------------------------------------------------------
# RabbitMQ 3.10.8 — RECORDED from the live broker on 127.0.0.1:5672 (Debian bookworm package,
# Erlang 25.2.3) with aio-pika 10.2.1 / aiormq 7.2.4 / pamqp 4.0.1, in a throwaway vhost: quorum
# queues, dead-lettering through the default exchange ("x-dead-letter-exchange": ""), wait queues
# with x-message-ttl 100-200 ms. Printed with pprint from IncomingMessage.headers; only the
# timestamps were shortened to T0/T1 (they are whole seconds, as the broker sends them).
# --------------------------------------------------------------------------------------------------

# First delivery from a quorum queue: x-delivery-count is present even at 0 on 3.10/3.11.
V310_FIRST_DELIVERY: dict[str, Any] = {"app": "v", "x-delivery-count": 0}

# Broker-driven loop: bd.work --reject(requeue=False)--> bd.work.wait.0 (TTL) --expired--> bd.work.
# Delivery 2 on bd.work (after one rejection):
V310_BROKER_LOOP_DELIVERY_2: dict[str, Any] = {
    "app": "v",
    "x-death": [
        {
            "count": 1,
            "exchange": "",
            "queue": "bd.work.wait.0",
            "reason": "expired",
            "routing-keys": ["bd.work.wait.0"],
            "time": T0,
        },
        {
            "count": 1,
            "exchange": "",
            "queue": "bd.work",
            "reason": "rejected",
            "routing-keys": ["bd.work"],
            "time": T0,
        },
    ],
    "x-delivery-count": 0,
    "x-first-death-exchange": "",
    "x-first-death-queue": "bd.work",
    "x-first-death-reason": "rejected",
}
# Delivery 4 on bd.work (after three rejections): the same two entries, count 3, newest first.
V310_BROKER_LOOP_DELIVERY_4: dict[str, Any] = {
    "app": "v",
    "x-death": [
        {
            "count": 3,
            "exchange": "",
            "queue": "bd.work.wait.0",
            "reason": "expired",
            "routing-keys": ["bd.work.wait.0"],
            "time": T0,
        },
        {
            "count": 3,
            "exchange": "",
            "queue": "bd.work",
            "reason": "rejected",
            "routing-keys": ["bd.work"],
            "time": T0,
        },
    ],
    "x-delivery-count": 0,
    "x-first-death-exchange": "",
    "x-first-death-queue": "bd.work",
    "x-first-death-reason": "rejected",
}
# Same loop, message published by the producer to topic exchange "orders" with routing key
# "orders.created" and a per-message expiration of 60 s; nack(requeue=True) once (x-delivery-count
# rose to 1), then rejected; this is the delivery after it came back from the wait queue. Note that
# x-death keeps the producer's exchange and routing key, and dead-lettering reset x-delivery-count.
V310_NAMED_EXCHANGE_LOOP: dict[str, Any] = {
    "tenant": "t1",
    "x-death": [
        {
            "count": 1,
            "exchange": "",
            "queue": "orders.work.wait.0",
            "reason": "expired",
            "routing-keys": ["orders.work.wait.0"],
            "time": T0,
        },
        {
            "count": 1,
            "exchange": "orders",
            "original-expiration": "60000",
            "queue": "orders.work",
            "reason": "rejected",
            "routing-keys": ["orders.created"],
            "time": T0,
        },
    ],
    "x-delivery-count": 0,
    "x-first-death-exchange": "orders",
    "x-first-death-queue": "orders.work",
    "x-first-death-reason": "rejected",
}
# rmqkit-style retry: consume from rp.work, publish a copy (x-* stripped, rmqkit-attempt set) to
# rp.work.wait.0 through the default exchange, ack; the copy expires back to rp.work:
V310_REPUBLISHED_STRIPPED: dict[str, Any] = {
    "app": "v",
    "rmqkit-attempt": 1,
    "x-death": [
        {
            "count": 1,
            "exchange": "",
            "queue": "rp.work.wait.0",
            "reason": "expired",
            "routing-keys": ["rp.work.wait.0"],
            "time": T1,
        }
    ],
    "x-delivery-count": 0,
    "x-first-death-exchange": "",
    "x-first-death-queue": "rp.work.wait.0",
    "x-first-death-reason": "expired",
}
# The same, but the copy was republished WITHOUT stripping x-death: 3.10 keeps the client-set
# x-death and increments its count (4.0+ would have ignored it). This is why we strip.
V310_REPUBLISHED_UNSTRIPPED: dict[str, Any] = {
    "app": "v",
    "rmqkit-attempt": 2,
    "x-death": [
        {
            "count": 2,
            "exchange": "",
            "queue": "rp.work.wait.0",
            "reason": "expired",
            "routing-keys": ["rp.work.wait.0"],
            "time": T1,
        }
    ],
    "x-delivery-count": 0,
    "x-first-death-exchange": "",
    "x-first-death-queue": "rp.work.wait.0",
    "x-first-death-reason": "expired",
}
# dl.work with x-delivery-limit 2 and DLX -> dl.work.parking; nack(requeue=True) on each delivery:
# x-delivery-count went 0, 1, 2 on dl.work; then the broker parked it:
V310_DELIVERY_LIMIT_PARKED: dict[str, Any] = {
    "x-death": [
        {
            "count": 1,
            "exchange": "",
            "queue": "dl.work",
            "reason": "delivery_limit",
            "routing-keys": ["dl.work"],
            "time": T1,
        }
    ],
    "x-delivery-count": 0,
    "x-first-death-exchange": "",
    "x-first-death-queue": "dl.work",
    "x-first-death-reason": "delivery_limit",
}

# --------------------------------------------------------------------------------------------------
# RabbitMQ 3.10.8, 4.0.5 and 4.3.6 — RECORDED by scripts/record-headers (tests/record_headers.py)
# from the real nodes of scripts/broker-up --version 3.10|4.0|4.3, one module per version in
# tests/unit/recorded/: the same scenarios (first delivery, requeues, broker-driven loop, rmqkit
# republish, delivery limit) on each. What differs, as recorded:
# - x-delivery-count: 3.10 sends it even at 0; 4.0 and 4.3 omit it at 0; on 4.0 and 4.3 it is
#   carried through dead-lettering (a message back from the wait queue, and a parked one, still
#   has it), on 3.10 dead-lettering resets it to 0.
# - 4.3 adds x-acquired-count (every acquisition, nack-requeue included) and stops counting
#   nack(requeue=True) in x-delivery-count (NACKED_REQUEUE_TWICE, NACKED_PAST_THE_LIMIT).
# - 4.0 and 4.3 add x-last-death-*; they ignore a client-set x-death (REPUBLISHED_UNSTRIPPED:
#   count 1, where 3.10 read it back and counted 3).
# - x-death table keys come in a different order (and on 3.10 a table's order depends on when
#   it was first written); parsing must not depend on it.
# (No 3.13 broker here: its shapes are no longer in this file; 3.13 is 4.0's x-death handling
# with 3.12's x-delivery-count, between the two recorded ends.)
# --------------------------------------------------------------------------------------------------
RECORDED = [v3_10, v4_0, v4_3]
V4 = [v4_0, v4_3]


def by_version(modules: list[Any]) -> Any:
    """pytest parametrize over recorded modules, with their broker version as the test id."""
    return pytest.mark.parametrize(
        "rec", modules, ids=[module.RABBITMQ_VERSION for module in modules]
    )


def shapes(module: Any) -> list[dict[str, Any]]:
    """Every recorded header table of a module (the parked copy inside NACKED_PAST_THE_LIMIT)."""
    out = []
    for name in dir(module):
        value = getattr(module, name)
        if name.isupper() and isinstance(value, dict):
            out.append(value.get("parked", value))
    return out


ALL_RECORDED = [
    V310_FIRST_DELIVERY,
    V310_BROKER_LOOP_DELIVERY_2,
    V310_BROKER_LOOP_DELIVERY_4,
    V310_NAMED_EXCHANGE_LOOP,
    V310_REPUBLISHED_STRIPPED,
    V310_REPUBLISHED_UNSTRIPPED,
    V310_DELIVERY_LIMIT_PARKED,
    *(shape for module in RECORDED for shape in shapes(module)),
]
WAITS = ("orders.work.wait.0", "orders.work.wait.1", "orders.work.wait.2.slot-1s")


def roundtrip(headers: dict[str, Any]) -> Any:
    """Encode with pamqp and decode again: what a consumer would get after a publish."""
    encoded = pamqp_encode.field_table(headers)
    _, decoded = pamqp_decode.field_table(encoded)
    return decoded


# --- attempt_number on recorded shapes ------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "queue", "expected"),
    [
        (V310_FIRST_DELIVERY, "bd.work", 1),
        ({}, "orders.work", 1),
        (V310_BROKER_LOOP_DELIVERY_2, "bd.work", 2),
        (V310_BROKER_LOOP_DELIVERY_4, "bd.work", 4),
        (V310_NAMED_EXCHANGE_LOOP, "orders.work", 2),
        (V310_REPUBLISHED_STRIPPED, "rp.work", 2),
        (V310_REPUBLISHED_UNSTRIPPED, "rp.work", 3),
    ],
)
def test_attempt_number_on_recorded_shapes(
    headers: dict[str, Any], queue: str, expected: int
) -> None:
    assert attempt_number(headers, queue) == expected
    waits = (f"{queue}.wait.0", *WAITS)
    assert attempt_number(headers, queue, wait_queues=waits) == expected


@by_version(RECORDED)
@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("FIRST_DELIVERY", 1),
        ("EMPTY_HEADERS_TABLE", 1),
        ("REJECTED_REQUEUE_TWICE", 1),
        ("NACKED_REQUEUE_TWICE", 1),
        ("BROKER_LOOP_DELIVERY_2", 2),
        ("BROKER_LOOP_DELIVERY_3", 3),
        ("NAMED_EXCHANGE_LOOP", 2),
        # rmqkit's own header said 3 attempts; the copy's one expiry adds nothing to it
        ("REPUBLISHED_STRIPPED", 4),
    ],
)
def test_attempt_number_on_every_recorded_version(rec: Any, name: str, expected: int) -> None:
    headers = getattr(rec, name)
    assert attempt_number(headers, "orders.work") == expected
    assert attempt_number(headers, "orders.work", wait_queues=WAITS) == expected


@by_version(V4)
def test_client_set_x_death_is_ignored_from_40(rec: Any) -> None:
    # 4.0+: the x-death the client republished (count 2 by then) was not read back: count 1,
    # so the republish alone would lose the history; rmqkit-attempt carries it.
    events = read_x_death(rec.REPUBLISHED_UNSTRIPPED)
    assert [(e.queue, e.reason, e.count) for e in events] == [("orders.work.wait.0", "expired", 1)]
    assert attempt_number(rec.REPUBLISHED_UNSTRIPPED, "orders.work", wait_queues=WAITS) == 4


def test_client_set_x_death_is_read_back_on_310() -> None:
    events = read_x_death(v3_10.REPUBLISHED_UNSTRIPPED)
    assert [(e.queue, e.reason, e.count) for e in events] == [("orders.work.wait.0", "expired", 3)]
    assert attempt_number(v3_10.REPUBLISHED_UNSTRIPPED, "orders.work", wait_queues=WAITS) == 4


def test_x_delivery_count_is_not_an_attempt() -> None:
    # a redelivery after a lost connection or a shutdown is not a failed attempt; crash loops are
    # the delivery limit's job
    for rec in RECORDED:
        assert rec.REJECTED_REQUEUE_TWICE["x-delivery-count"] == 2
        assert attempt_number(rec.REJECTED_REQUEUE_TWICE, "orders.work") == 1
    assert attempt_number({"x-delivery-count": 7}, "orders.work") == 1


def test_delivery_annotations_by_version() -> None:
    """What each version puts in x-delivery-count / x-acquired-count (recorded)."""
    assert v3_10.FIRST_DELIVERY == {"tenant": "t1", "x-delivery-count": 0}
    assert v4_0.FIRST_DELIVERY == v4_3.FIRST_DELIVERY == {"tenant": "t1"}  # omitted at 0
    # nack(requeue=True) counts on 3.10 and 4.0; on 4.3 only x-acquired-count rises
    assert v3_10.NACKED_REQUEUE_TWICE["x-delivery-count"] == 2
    assert v4_0.NACKED_REQUEUE_TWICE["x-delivery-count"] == 2
    assert v4_3.NACKED_REQUEUE_TWICE == {"tenant": "t1", "x-acquired-count": 2}
    assert v4_3.REJECTED_REQUEUE_TWICE["x-acquired-count"] == 2
    assert "x-acquired-count" not in v4_0.REJECTED_REQUEUE_TWICE
    # so four nacks pass a delivery limit of 2 on 4.3 only (4.0 parks the message)
    assert v4_3.NACKED_PAST_THE_LIMIT == {"tenant": "t1", "x-acquired-count": 4}
    assert delivery_limit_hit(v4_0.NACKED_PAST_THE_LIMIT["parked"])
    # dead-lettering resets the count on 3.10 and carries it along on 4.x: a message back from
    # a wait queue counts its rejections; 4.3 (not 4.0) carries it into the parking queue too,
    # so a parking queue with a delivery limit would start spending it at 3
    assert v3_10.BROKER_LOOP_DELIVERY_3["x-delivery-count"] == 0
    for rec in V4:
        assert rec.BROKER_LOOP_DELIVERY_3["x-delivery-count"] == 2
    assert v3_10.DELIVERY_LIMIT_PARKED["x-delivery-count"] == 0
    assert "x-delivery-count" not in v4_0.DELIVERY_LIMIT_PARKED
    assert v4_3.DELIVERY_LIMIT_PARKED["x-delivery-count"] == 3
    assert v4_3.DELIVERY_LIMIT_PARKED["x-acquired-count"] == 3


def test_rejections_of_another_queue_do_not_count() -> None:
    assert attempt_number(V310_BROKER_LOOP_DELIVERY_4, "some.other.queue") == 1


def test_rejections_after_our_republish_add_to_our_count() -> None:
    # an rmqkit copy (2 attempts so far, x-death stripped) rejected once more by a consumer of a
    # broker-driven loop: 3 attempts made, this is the 4th
    headers = {
        h.ATTEMPT: 2,
        "x-death": [
            {"count": 1, "reason": "expired", "queue": "orders.work.wait.0", "time": T1},
            {"count": 1, "reason": "rejected", "queue": "orders.work", "time": T1},
        ],
    }
    assert attempts_made(headers, "orders.work") == 3
    assert attempt_number(headers, "orders.work") == 4


def test_wait_queue_expiries_are_a_lower_bound() -> None:
    # a copy published straight into a wait queue by someone who kept x-death but dropped our
    # header (3.10 keeps client x-death): three returns from waiting mean three failures
    headers = {
        "x-death": [
            {"count": 2, "reason": "expired", "queue": "orders.work.wait.1", "time": T1},
            {"count": 1, "reason": "expired", "queue": "orders.work.wait.0", "time": T0},
        ]
    }
    assert attempt_number(headers, "orders.work") == 1  # without knowing the wait queues
    assert attempt_number(headers, "orders.work", wait_queues=WAITS) == 4
    # expiries in a queue that is not one of ours (e.g. a producer-side delay queue) never count
    assert attempt_number(headers, "orders.work", wait_queues=("elsewhere",)) == 1


@by_version(V4)
def test_never_lower_than_our_header(rec: Any) -> None:
    headers = {**rec.BROKER_LOOP_DELIVERY_3, h.ATTEMPT: 10}
    assert attempt_number(headers, "orders.work", wait_queues=WAITS) >= 11


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (3, 3),
        (0, 0),
        (-4, 0),
        ("3", 3),  # typed by hand in the management UI
        (" 5 ", 5),
        (b"6", 6),
        (bytearray(b"7"), 7),
        (2.0, 2),
        ("abc", 0),
        (True, 0),
        (None, 0),
        ([1], 0),
        (float("nan"), 0),
    ],
)
def test_recorded_attempts_is_lenient(value: object, expected: int) -> None:
    assert recorded_attempts({h.ATTEMPT: value}) == expected
    assert attempt_number({h.ATTEMPT: value}, "q") == expected + 1


def test_recorded_attempts_without_headers() -> None:
    assert recorded_attempts(None) == 0
    assert recorded_attempts({}) == 0
    assert attempt_number(None, "q") == 1


# --- read_x_death / read_death_history ------------------------------------------------------------


def test_read_x_death_310_named_exchange() -> None:
    events = read_x_death(V310_NAMED_EXCHANGE_LOOP)
    assert events == [
        DeathEvent(
            queue="orders.work.wait.0",
            reason="expired",
            count=1,
            time=T0,
            exchange="",
            routing_keys=("orders.work.wait.0",),
        ),
        DeathEvent(
            queue="orders.work",
            reason="rejected",
            count=1,
            time=T0,
            exchange="orders",
            routing_keys=("orders.created",),
            original_expiration="60000",
        ),
    ]
    assert events[1].reason == DeathReason.REJECTED


def test_read_x_death_same_records_on_all_versions() -> None:
    # 3.10, 4.0 and 4.3 order table keys differently; the parsed records are the same (but for
    # the broker's timestamps: each recording ran at its own time)
    def untimed(headers: dict[str, Any]) -> list[DeathEvent]:
        return [dataclasses.replace(event, time=None) for event in read_x_death(headers)]

    for name in ("BROKER_LOOP_DELIVERY_3", "NAMED_EXCHANGE_LOOP", "DELIVERY_LIMIT_PARKED"):
        expected = untimed(getattr(v3_10, name))
        assert expected
        for rec in V4:
            assert untimed(getattr(rec, name)) == expected, (rec.RABBITMQ_VERSION, name)


def test_history_last_death_derived_before_313() -> None:
    history = read_death_history(V310_NAMED_EXCHANGE_LOOP)
    assert (history.first_queue, history.first_reason, history.first_exchange) == (
        "orders.work",
        "rejected",
        "orders",
    )
    assert (history.last_queue, history.last_reason, history.last_exchange) == (
        "orders.work.wait.0",
        "expired",
        "",
    )


def test_history_last_death_read_on_4() -> None:
    for headers in (rec.BROKER_LOOP_DELIVERY_3 for rec in V4):
        assert "x-last-death-queue" in headers
        history = read_death_history(headers)
        assert (history.last_queue, history.last_reason, history.last_exchange) == (
            "orders.work.wait.0",
            "expired",
            "",
        )
        assert history.count(queue="orders.work", reason="rejected") == 2
        assert history.count(reason="expired") == 2
        assert history.count() == 4
        found = history.find(queue="orders.work", reason="rejected")
        assert found is not None
        assert found.exchange == "orders"
        assert history.find(queue="orders.work", reason="maxlen") is None


def test_read_x_death_bytes_values() -> None:
    # a client that leaves long strings undecoded, and a non-UTF-8 queue name
    headers = {
        "x-death": [
            {
                b"count": 2,
                b"queue": b"orders.work",
                b"reason": bytearray(b"rejected"),
                b"exchange": b"orders",
                b"routing-keys": [b"orders.created", "x", 5],
                b"time": T0,
            },
            {"count": 1, "queue": b"caf\xe9", "reason": "expired"},
        ],
        "x-first-death-reason": b"rejected",
    }
    events = read_x_death(headers)
    assert events[0] == DeathEvent(
        "orders.work", "rejected", 2, T0, "orders", ("orders.created", "x")
    )
    assert events[1].queue == "caf\ufffd"
    assert events[1].time is None and events[1].exchange is None and events[1].routing_keys == ()
    assert read_death_history(headers).first_reason == "rejected"
    assert attempt_number(headers, "orders.work") == 3


@pytest.mark.parametrize(
    ("count", "expected"),
    [(2**40, 2**40), (3, 3), ("4", 4), (None, 1), (True, 1), (-1, 0), ("x", 1)],
)
def test_read_x_death_count_widths_and_absence(count: object, expected: int) -> None:
    entry: dict[str, Any] = {"queue": "q", "reason": "rejected"}
    if count is not None:
        entry["count"] = count
    assert read_x_death({"x-death": [entry]})[0].count == expected


def test_read_x_death_counts_repeated_entries() -> None:
    # very old brokers wrote one entry per death without a count
    entry = {"queue": "q", "reason": "rejected"}
    assert attempt_number({"x-death": [entry, dict(entry), dict(entry)]}, "q") == 4


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (T0, T0),
        (datetime(2026, 11, 29, 16, 26, 5), T0),  # naive: taken as UTC
        (int(T0.timestamp()), T0),
        (int(T0.timestamp()) * 1000, T0),  # milliseconds, as pamqp guesses them
        ("2026-11-29T16:26:05Z", T0),
        ("not a time", None),
        (None, None),
    ],
)
def test_read_x_death_time_shapes(raw: object, expected: datetime | None) -> None:
    entry: dict[str, Any] = {"queue": "q", "reason": "expired", "count": 1, "time": raw}
    assert read_x_death({"x-death": [entry]})[0].time == expected


def test_read_x_death_time_other_timezone_is_normalised() -> None:
    cet = datetime(2026, 11, 29, 17, 26, 5, tzinfo=timezone(timedelta(hours=1)))
    event = read_x_death({"x-death": [{"queue": "q", "reason": "expired", "time": cet}]})[0]
    assert event.time == T0 and event.time.utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "x-death as a string",
        5,
        [],
        ["not a table", 3, None],
        [{"reason": "rejected", "count": 1}],  # no queue
        [{"queue": "q", "count": 1}],  # no reason
        [{"queue": 5, "reason": "rejected"}],
    ],
)
def test_read_x_death_skips_what_it_cannot_read(raw: object) -> None:
    assert read_x_death({"x-death": raw}) == []
    assert attempt_number({"x-death": raw}, "q") == 1


def test_read_x_death_single_table() -> None:
    events = read_x_death({"x-death": {"queue": "q", "reason": "rejected", "count": 2}})
    assert [(e.queue, e.count) for e in events] == [("q", 2)]


def test_read_x_death_no_headers() -> None:
    assert read_x_death(None) == []
    assert read_x_death({}) == []
    history = read_death_history(None)
    assert history.events == () and history.last_queue is None and not history.delivery_limit_hit


# --- delivery limit and parking reason ------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        (V310_DELIVERY_LIMIT_PARKED, True),
        (v3_10.DELIVERY_LIMIT_PARKED, True),
        (v4_0.DELIVERY_LIMIT_PARKED, True),
        (v4_3.DELIVERY_LIMIT_PARKED, True),
        (v4_0.NACKED_PAST_THE_LIMIT["parked"], True),
        (v4_3.NACKED_PAST_THE_LIMIT, False),
        (v4_3.NACKED_REQUEUE_TWICE, False),
        (v4_3.BROKER_LOOP_DELIVERY_3, False),
        ({"x-first-death-reason": "delivery_limit"}, True),
        ({"x-last-death-reason": "delivery_limit"}, True),
        (V310_BROKER_LOOP_DELIVERY_4, False),
        (v4_0.REJECTED_REQUEUE_TWICE, False),
        (V310_FIRST_DELIVERY, False),
        ({}, False),
        (None, False),
    ],
)
def test_delivery_limit_hit(headers: dict[str, Any] | None, expected: bool) -> None:
    assert delivery_limit_hit(headers) is expected


def test_parking_reason() -> None:
    assert parking_reason(V310_DELIVERY_LIMIT_PARKED) == h.ParkingReason.DELIVERY_LIMIT
    assert parking_reason({h.PARK_REASON: "exhausted"}) == h.ParkingReason.EXHAUSTED
    assert isinstance(parking_reason({h.PARK_REASON: "permanent"}), h.ParkingReason)
    assert parking_reason({h.PARK_REASON: b"undecodable"}) == h.ParkingReason.UNDECODABLE
    assert parking_reason({h.PARK_REASON: "from_the_future"}) == "from_the_future"
    # ours wins over the broker's history (a replayed message that later exhausted its attempts)
    parked = v4_3.DELIVERY_LIMIT_PARKED
    assert parking_reason(parked) == h.ParkingReason.DELIVERY_LIMIT
    assert parking_reason({**parked, h.PARK_REASON: "exhausted"}) == "exhausted"
    assert parking_reason({h.PARK_REASON: ""}) is None
    assert parking_reason({}) is None
    assert parking_reason(None) is None


# --- stripping and encodability ------------------------------------------------------------------


@pytest.mark.parametrize("headers", ALL_RECORDED)
def test_strip_removes_every_broker_header(headers: dict[str, Any]) -> None:
    stripped = h.strip_broker_headers(headers)
    assert not set(stripped) & h.BROKER_HEADERS
    assert {k: v for k, v in headers.items() if k not in h.BROKER_HEADERS} == stripped
    assert roundtrip(stripped) == stripped  # what is left can be published again
    assert read_x_death(stripped) == []


def test_strip_covers_all_versions_broker_headers() -> None:
    expected = {
        "x-death",
        "x-first-death-queue",
        "x-first-death-reason",
        "x-first-death-exchange",
        "x-last-death-queue",
        "x-last-death-reason",
        "x-last-death-exchange",
        "x-delivery-count",
    }
    assert expected <= h.BROKER_HEADERS


def test_strip_returns_an_independent_copy() -> None:
    original: dict[str, Any] = {"tags": ["a", {"k": ["v"]}], "x-death": [{"queue": "q"}]}
    stripped = h.strip_broker_headers(original)
    stripped["tags"][1]["k"].append("w")
    stripped["new"] = 1
    assert original == {"tags": ["a", {"k": ["v"]}], "x-death": [{"queue": "q"}]}
    assert h.strip_broker_headers(None) == {}


def test_strip_makes_undecodable_strings_publishable_again() -> None:
    # pamqp decodes a non-UTF-8 long string as bytes but refuses to encode bytes (seen: aio-pika
    # 10.2.1 publish raises TypeError "Unknown type: <class 'bytes'>")
    received: dict[str, Any] = {"legacy": b"\xff\xfe", "nested": {"list": [b"\x80", ("t", 1)]}}
    with pytest.raises(TypeError):
        pamqp_encode.field_table(received)
    stripped = h.strip_broker_headers(received)
    assert stripped == {
        "legacy": bytearray(b"\xff\xfe"),
        "nested": {"list": [bytearray(b"\x80"), ["t", 1]]},
    }
    assert roundtrip(stripped) == stripped


header_keys = st.one_of(
    st.sampled_from(sorted(h.BROKER_HEADERS | h.ALL_HEADERS)), st.text(max_size=8)
)
leaf_values = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.text(max_size=10),
    st.binary(max_size=6),
    st.booleans(),
    # AMQP timestamps are unsigned whole seconds
    st.datetimes(datetime(1970, 1, 2), datetime(2200, 1, 1), timezones=st.just(UTC)).map(
        lambda moment: moment.replace(microsecond=0)
    ),
)
header_values = st.recursive(
    leaf_values,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.tuples(children),
        st.dictionaries(st.text(max_size=5), children, max_size=3),
    ),
    max_leaves=8,
)
header_tables = st.dictionaries(header_keys, header_values, max_size=8)


@given(header_tables)
def test_strip_is_idempotent(headers: dict[str, Any]) -> None:
    once = h.strip_broker_headers(headers)
    assert h.strip_broker_headers(once) == once
    assert not set(once) & h.BROKER_HEADERS
    assert set(once) == set(headers) - h.BROKER_HEADERS


@given(header_tables)
def test_stripped_headers_are_encodable(headers: dict[str, Any]) -> None:
    stripped = h.strip_broker_headers(headers)
    pamqp_encode.field_table(stripped)  # raises on anything pamqp cannot encode
    assert h.is_amqp_value(stripped)


# --- properties of the count ---------------------------------------------------------------------

deaths = st.lists(
    st.fixed_dictionaries(
        {
            "queue": st.sampled_from(["orders.work", *WAITS, "elsewhere"]),
            "reason": st.sampled_from(["rejected", "expired", "maxlen", "delivery_limit"]),
            "count": st.integers(1, 50),
            "time": st.just(T0),
        }
    ),
    max_size=6,
)


@given(st.integers(0, 1000), deaths, st.integers(1, 5))
def test_count_never_below_our_header_and_grows_with_rejections(
    recorded: int, x_death: list[dict[str, Any]], more_rejections: int
) -> None:
    headers: dict[str, Any] = {h.ATTEMPT: recorded, "x-death": x_death}
    n = attempt_number(headers, "orders.work", wait_queues=WAITS)
    assert n >= recorded + 1
    rejected_again = {
        h.ATTEMPT: recorded,
        "x-death": [
            {"queue": "orders.work", "reason": "rejected", "count": more_rejections},
            *x_death,
        ],
    }
    rejected_before = sum(
        d["count"] for d in x_death if d["queue"] == "orders.work" and d["reason"] == "rejected"
    )
    again = attempt_number(rejected_again, "orders.work", wait_queues=WAITS)
    assert again >= n
    assert again == max(n, recorded + rejected_before + more_rejections + 1)
    assert attempt_number(headers, "orders.work") <= n  # knowing the wait queues only raises it


@given(deaths)
def test_count_survives_an_encode_decode_roundtrip(x_death: list[dict[str, Any]]) -> None:
    headers = {h.ATTEMPT: 3, "x-death": x_death}
    assert attempt_number(roundtrip(headers), "orders.work", wait_queues=WAITS) == attempt_number(
        headers, "orders.work", wait_queues=WAITS
    )


# --- timestamps and truncation --------------------------------------------------------------------


def test_timestamp_format() -> None:
    moment = datetime(2024, 5, 1, 12, 34, 56, 789_123, tzinfo=UTC)
    assert h.format_timestamp(moment) == "2024-05-01T12:34:56.789Z"
    assert h.format_timestamp(moment.replace(tzinfo=None)) == "2024-05-01T12:34:56.789Z"
    plus2 = moment.astimezone(timezone(timedelta(hours=2)))
    assert h.format_timestamp(plus2) == "2024-05-01T12:34:56.789Z"
    assert h.parse_timestamp("2024-05-01T12:34:56.789Z") == moment.replace(microsecond=789_000)


@given(st.datetimes(timezones=st.just(UTC)))
def test_timestamp_roundtrip_and_order(moment: datetime) -> None:
    text = h.format_timestamp(moment)
    assert len(text) == len("2024-05-01T12:34:56.789Z")
    parsed = h.parse_timestamp(text)
    assert parsed is not None
    assert abs(parsed - moment) < timedelta(milliseconds=1)


def test_truncation() -> None:
    assert h.truncate_message("short") == "short"
    long = "m" * 5000
    cut = h.truncate_message(long)
    assert len(cut) == h.ERROR_MESSAGE_MAX_CHARS and cut.endswith(h.TRUNCATION_MARK)
    tb = "".join(f"frame {i}\n" for i in range(2000)) + "ValueError: the end\n"
    kept = h.truncate_traceback(tb)
    assert len(kept) == h.TRACEBACK_MAX_CHARS
    assert kept.startswith(h.TRUNCATION_MARK) and kept.endswith("ValueError: the end\n")
    assert h.truncate_traceback("tb") == "tb"
    assert h.truncate_message("abcdef", 1) == "a"
    assert h.truncate_traceback("abcdef", 1) == "f"


def test_header_names() -> None:
    assert all(name.startswith(h.PREFIX) for name in h.ALL_HEADERS)
    assert not any(name.startswith("x-") for name in h.ALL_HEADERS)
    assert len(h.ALL_HEADERS) == 26  # 21 of consumer, tracing, replay, edit, archive; 5 of ladder
    assert {reason.value for reason in h.ParkingReason} >= {
        "permanent",
        "exhausted",
        "undecodable",
        "delivery_limit",
        "undecryptable",
    }

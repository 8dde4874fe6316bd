"""The delay ladder's arithmetic and wiring, without a broker (tests/integration/test_delay.py
runs it on the real one).

The routing tests push messages through the ladder's own bindings with a model of the headers
exchange (``x-match: all`` over the non-``x-`` keys, as RabbitMQ matches), so every delay of an
8-rung ladder is checked for its path, not just a few examples.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

from rmqkit import headers as h
from rmqkit.consumer.attempts import attempt_number
from rmqkit.delay import DelayRangeError, Ladder, delivered_route
from rmqkit.delay import ladder as lad
from rmqkit.delay.objects import Binding
from rmqkit.errors import DataError


def _matches(binding: Binding, headers: Mapping[str, Any]) -> bool:
    return all(headers.get(k) == v for k, v in binding.match.items() if not k.startswith("x-"))


def _route(bindings: list[Binding], exchange: str, headers: Mapping[str, Any]) -> list[str]:
    """Queues a message published to ``exchange`` reaches (exchange-to-exchange followed)."""
    queues: list[str] = []
    for b in bindings:
        if b.source == exchange and _matches(b, headers):
            if b.destination_type == "queue":
                queues.append(b.destination)
            else:
                queues.extend(_route(bindings, b.destination, headers))
    return queues


def _walk(
    ladder: Ladder, plan_headers: Mapping[str, Any], target_queue: str
) -> tuple[list[str], int]:
    """Follow a message through the ladder as the broker would: the rungs it waits in, and the
    total TTL it waits, until it reaches ``target_queue``."""
    objects = ladder.objects([("work", "")])
    bindings = [*objects.bindings, Binding("work", target_queue, "queue")]
    dlx = {q.name: q.arguments["x-dead-letter-exchange"] for q in objects.queues}
    ttl = {q.name: q.ttl_ms for q in objects.queues}
    visited: list[str] = []
    waited = 0
    reached = _route(bindings, ladder.entry, plan_headers)
    while reached != [target_queue]:
        assert len(reached) == 1, f"a message must be in exactly one place, not {reached}"
        rung = reached[0]
        visited.append(rung)
        waited += ttl[rung]
        reached = _route(bindings, dlx[rung], plan_headers)
        assert len(visited) <= ladder.bits, "a message must never visit a rung twice"
    return visited, waited


def test_every_delay_of_an_8_rung_ladder_waits_exactly_its_units_once_per_set_bit() -> None:
    ladder = Ladder(prefix="t", unit_ms=10, bits=8)
    for units in range(1, 2**8):
        plan = ladder.plan(units * 10, "work", "k")
        visited, waited = _walk(ladder, plan.headers, "work.q")
        assert waited == units * 10 == plan.applied_ms
        expected = [ladder.queue_name(b) for b in reversed(range(8)) if units >> b & 1]
        assert visited == expected == ladder.route(plan.headers)
        as_bytes = {k: v.encode() if isinstance(v, str) else v for k, v in plan.headers.items()}
        assert ladder.route(as_bytes) == expected
        assert plan.hops == len(visited) == bin(units).count("1")


def test_delays_round_up_to_whole_units_never_down() -> None:
    ladder = Ladder(prefix="t", unit_ms=100, bits=4)
    assert [ladder.units(d) for d in (1, 99, 100, 101, 199, 200, 1500)] == [1, 1, 1, 2, 2, 2, 15]
    for delay in range(1, ladder.max_delay_ms + 1, 7):
        applied = ladder.plan(delay, "work", "k").applied_ms
        assert delay <= applied <= delay + ladder.max_rounding_ms


def test_a_delay_beyond_the_maximum_is_refused_with_the_maximum_named() -> None:
    ladder = Ladder(prefix="t", unit_ms=100, bits=4)  # 15 units = 1.5 s
    assert ladder.max_delay_ms == 1500
    assert ladder.plan(1500, "work", "k").applied_ms == 1500
    with pytest.raises(DelayRangeError) as caught:
        ladder.plan(1501, "work", "k")
    assert str(caught.value) == (
        "delay 1501ms exceeds the maximum of delay ladder 't.100ms': about 2s "
        "(1500ms: 4 rungs of 100ms)"
    )
    assert isinstance(caught.value, DataError) and caught.value.exit_code == 65
    for bad in (-1, 1.5, True, "10"):
        with pytest.raises(DelayRangeError):
            ladder.plan(bad, "work", "k")  # type: ignore[arg-type]


def test_no_delay_publishes_straight_to_the_target() -> None:
    plan = Ladder().plan(0, "work", "k", {"app": "x"})
    assert (plan.exchange, plan.routing_key, plan.headers, plan.hops) == (
        "work",
        "k",
        {"app": "x"},
        0,
    )


def test_a_per_message_expiration_is_refused() -> None:
    with pytest.raises(DelayRangeError, match="per-message expiration"):
        Ladder().plan(1000, "work", "k", expiration="60000")
    assert Ladder().plan(1000, "work", "k", expiration="").exchange == "rmqkit.delay.100ms"


def test_plan_keeps_the_messages_headers_and_drops_the_brokers_and_an_earlier_trips() -> None:
    ladder = Ladder(prefix="t", unit_ms=10, bits=8)
    first = ladder.plan(250, "work", "k", {"app": "x", h.ATTEMPT: 2})
    delivered = {
        **first.headers,
        "x-death": [{"queue": "t.10ms.04-160ms", "reason": "expired", "count": 1}],
        "x-first-death-queue": "t.10ms.04-160ms",
        "x-first-death-reason": "expired",
        "x-first-death-exchange": "t.10ms",
    }
    again = ladder.plan(30, "work", "k", delivered)
    assert again.headers == {
        "app": "x",
        h.ATTEMPT: 2,
        "rmqkit-delay-bit-00": "1",
        "rmqkit-delay-bit-01": "1",
        lad.TOP: "1",
        lad.EXCHANGE: "work",
        lad.ROUTING_KEY: "k",
        lad.DELAY_MS: 30,
        lad.UNITS: 3,
    }
    assert all(h.is_amqp_value(v) for v in again.headers.values())


def test_adding_rungs_never_reroutes_a_message_already_in_the_ladder() -> None:
    small, large = Ladder(prefix="t", unit_ms=10, bits=5), Ladder(prefix="t", unit_ms=10, bits=9)
    assert set(map(repr, small.objects().bindings)) <= set(map(repr, large.objects().bindings))
    for units in range(1, 2**5):
        plan = small.plan(units * 10, "work", "k")
        assert _walk(large, plan.headers, "q") == _walk(small, plan.headers, "q")


def test_the_unit_is_in_every_name_so_two_units_share_nothing() -> None:
    a, b = Ladder(prefix="d", unit_ms=10, bits=3), Ladder(prefix="d", unit_ms=1000, bits=3)
    names_a = {e.name for e in a.objects().exchanges} | set(a.queue_names)
    names_b = {e.name for e in b.objects().exchanges} | set(b.queue_names)
    assert not names_a & names_b
    assert a.queue_names == ["d.10ms.00-10ms", "d.10ms.01-20ms", "d.10ms.02-40ms"]
    assert b.queue_name(2) == "d.1s.02-4s"


def test_rungs_are_quorum_with_at_least_once_dead_lettering_or_classic_on_request() -> None:
    quorum = Ladder(prefix="t", unit_ms=10, bits=2).objects().queues[1]
    assert quorum.arguments == {
        "x-queue-type": "quorum",
        "x-message-ttl": 20,
        "x-dead-letter-exchange": "t.10ms.after-01",
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }
    classic = Ladder(prefix="t", unit_ms=10, bits=2, queue_type="classic").objects().queues[1]
    assert classic.arguments == {
        "x-queue-type": "classic",
        "x-message-ttl": 20,
        "x-dead-letter-exchange": "t.10ms.after-01",
    }


def test_only_the_entry_exchange_takes_publishes() -> None:
    exchanges = Ladder(prefix="t", unit_ms=10, bits=3).objects().exchanges
    assert [e.name for e in exchanges if not e.internal] == ["t.10ms"]
    assert {e.declare_kwargs()["exchange_type"] for e in exchanges} == {"headers"}


def test_exits_into_an_exchange_or_a_queue_of_the_default_exchange() -> None:
    ladder = Ladder(prefix="t", unit_ms=10, bits=2)
    into_exchange, into_queue = ladder.objects([("work", "ignored"), ("", "q1")]).bindings[-2:]
    assert into_exchange.declare_kwargs() == {
        "destination": "work",
        "source": "t.10ms.out",
        "routing_key": "",
        "arguments": {"x-match": "all", lad.EXCHANGE: "work"},
        "label": f"t.10ms.out → work ({lad.EXCHANGE}=work)",
    }
    assert into_queue.declare_kwargs()["queue"] == "q1"
    assert into_queue.arguments == {"x-match": "all", lad.EXCHANGE: "", lad.ROUTING_KEY: "q1"}
    # Via the default exchange the routing key names the queue: a delayed message reaches it.
    plan = ladder.plan(30, "", "q1")
    objects = ladder.objects([("", "q1"), ("", "q2")])
    reached = _route(objects.bindings, ladder.out, plan.headers)
    assert reached == ["q1"]
    with pytest.raises(DelayRangeError):
        ladder.target_bindings("", "")


def test_ladder_sizes_and_limits() -> None:
    default = Ladder()
    # docs/delay.md, Costs: bits queues, bits + 2 exchanges, bits + bits(bits+1)/2 bindings,
    # plus one per distinct target.
    objects = default.objects([("a", ""), ("a", "other key"), ("", "q")])
    assert (len(objects.queues), len(objects.exchanges), len(objects.bindings)) == (20, 22, 232)
    assert default.queue_name(19) == "rmqkit.delay.100ms.19-52428800ms"
    assert (default.unit_ms, default.bits, default.max_delay_ms) == (100, 20, 104_857_500)
    assert Ladder.for_max_delay(600_000, unit_ms=1000).bits == 10  # 10 min in seconds: 1023 s
    assert Ladder.for_max_delay(600_000, unit_ms=1000).max_delay_ms == 1_023_000
    with pytest.raises(ValueError, match="TTL above the broker's maximum"):
        Ladder(unit_ms=1000, bits=24)  # the top rung would wait 2**23 s > 2**32-1 ms
    with pytest.raises(ValueError):
        Ladder(bits=0)


# A delivery that left the ladder, as RabbitMQ 3.10.8 delivered it (rungs 02 and 00: 5 units).
_DELIVERED = {
    "app": "x",
    "rmqkit-delay-bit-00": "1",
    "rmqkit-delay-bit-01": "0",
    "rmqkit-delay-bit-02": "1",
    lad.EXCHANGE: "work",
    lad.DELAY_MS: 43,
    lad.ROUTING_KEY: "a.b",
    lad.TOP: "2",
    lad.UNITS: 5,
    "x-death": [
        {
            "count": 1,
            "exchange": "t.10ms.after-02",
            "queue": "t.10ms.00-10ms",
            "reason": "expired",
            "routing-keys": ["a.b"],
            "time": datetime(2026, 12, 1, 19, 53, 43, tzinfo=UTC),
        },
        {
            "count": 1,
            "reason": "expired",
            "queue": "t.10ms.02-40ms",
            "time": datetime(2026, 12, 1, 19, 53, 43, tzinfo=UTC),
            "exchange": "t.10ms",
            "routing-keys": ["a.b"],
        },
    ],
    "x-first-death-exchange": "t.10ms",
    "x-first-death-queue": "t.10ms.02-40ms",
    "x-first-death-reason": "expired",
}


def test_the_ladders_x_death_entries_are_not_counted_as_attempts() -> None:
    waits = ["w.wait.1s", "w.wait.1s.slot-500ms"]
    assert attempt_number(_DELIVERED, "w", wait_queues=waits) == 1
    # Then a broker-driven retry loop: rejected in w, back from its wait queue: attempt 2.
    looped = {
        **_DELIVERED,
        "x-death": [
            {"queue": "w.wait.1s", "reason": "expired", "count": 1},
            {"queue": "w", "reason": "rejected", "count": 1},
            *_DELIVERED["x-death"],  # type: ignore[misc]
        ],
    }
    assert attempt_number(looped, "w", wait_queues=waits) == 2


def test_delivered_route_names_the_producers_target_not_the_ladders_exchange() -> None:
    assert delivered_route("t.10ms.after-00", "a.b", _DELIVERED) == ("work", "a.b")
    assert delivered_route("orders", "a.b", _DELIVERED) == ("orders", "a.b")  # not from a ladder
    assert delivered_route("x.after-00", "k", {"app": "x"}) == ("x.after-00", "k")
    raw = {lad.TOP: "0", lad.EXCHANGE: b"work", lad.ROUTING_KEY: bytearray(b"k")}
    assert delivered_route("t.10ms.after-03", "k", raw) == ("work", "k")


def test_delayed_in_reads_waiting_and_stuck_from_management_stats() -> None:
    ladder = Ladder(prefix="t", unit_ms=10, bits=3)
    stats: list[dict[str, Any]] = [
        {"name": "t.10ms.00-10ms", "messages": 3, "messages_dlx": 1},  # messages includes dlx
        {"name": "t.10ms.02-40ms", "messages": 5},  # classic: no messages_dlx
        {"name": "other", "messages": 9},
        {"name": "t.10ms.01-20ms"},  # statistics not collected yet
    ]
    counts = ladder.delayed_in(stats)
    assert {k: (v.waiting, v.stuck) for k, v in counts.items()} == {
        "t.10ms.00-10ms": (2, 1),
        "t.10ms.01-20ms": (0, 0),
        "t.10ms.02-40ms": (5, 0),
    }

"""retry_engine = "broker": which ladders the broker's delayed retry can express, what the work
queue gets instead of wait queues, the plan's refusal before 4.3, and the consumer's decision
(a reject that the broker holds back; every counted return an attempt)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from rmqkit import headers as h
from rmqkit.consumer.attempts import attempt_number
from rmqkit.consumer.config import policy_from_topology
from rmqkit.consumer.decision import Park, RetryLater, decide
from rmqkit.consumer.outcomes import Failed
from rmqkit.errors import TopologyFileError
from rmqkit.topology.expand import expand
from rmqkit.topology.model import parse_topology
from rmqkit.topology.plan import LiveState, compute_plan

BROKER = (
    '[queues."r.work"]\nretry_engine = "broker"\nretry_delays = ["1s", "2s", "3s"]\n'
    "max_attempts = 6\n"
)


def test_the_work_queue_gets_the_delayed_retry_and_no_wait_queues() -> None:
    state = expand(parse_topology(BROKER, "t.toml"), broker_version=(4, 3, 6))
    assert [q.name for q in state.queues] == ["r.work", "r.work.parking"]
    [work] = [q for q in state.queues if q.name == "r.work"]
    assert work.settings["delayed-retry-type"] == "failed"
    assert (work.settings["delayed-retry-min"], work.settings["delayed-retry-max"]) == (
        1000,
        3000,
    )
    assert work.arguments("arguments")["x-delayed-retry-type"] == "failed"
    [summary] = state.work_queues
    assert "held back by the broker: delayed retry, no jitter, no wait queues" in summary.text()


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ('retry_delays = ["1s", "10s"]', "is not of that shape (with these ends it would be"),
        ('retry_delays = ["2s", "5s"]', "is not of that shape"),
        ("retry_delays = []", "needs retry_delays"),
        ('retry_delays = ["1s"]\njitter = 0.5', "has no jitter"),
        ('retry_delays = ["1s"]\nmax_attempts = 12', "delivery_limit 10 is below max_attempts 12"),
        ('retry_delays = ["1s"]\nretry_engine = "native"', "retry_engine"),
    ],
)
def test_a_ladder_the_broker_cannot_express_is_refused_with_the_line(extra: str, says: str) -> None:
    text = f'[queues."r.work"]\nretry_engine = "broker"\n{extra}\n'
    if 'retry_engine = "native"' in extra:
        text = f'[queues."r.work"]\n{extra}\n'
    with pytest.raises(TopologyFileError) as info:
        parse_topology(text, "t.toml")
    assert says in str(info.value), str(info.value)
    assert "t.toml:" in str(info.value)


@pytest.mark.parametrize("ladder", [["1s"], ["2s", "3s"], ["1s", "2s", "3s"], ["500ms", "1s"]])
def test_linear_then_flat_ladders_are_accepted(ladder: list[str]) -> None:
    shown = ", ".join(f'"{d}"' for d in ladder)
    parse_topology(f'[queues."r.work"]\nretry_engine = "broker"\nretry_delays = [{shown}]\n', "t")


@pytest.mark.parametrize("version", [(3, 10, 8), (4, 0, 5), (4, 2, 1)])
def test_before_4_3_the_plan_is_a_conflict_with_the_fix(version: tuple[int, int, int]) -> None:
    desired = expand(parse_topology(BROKER, "t.toml"), broker_version=version)
    live = LiveState(queues={}, exchanges={}, bindings=[], policies={}, version=version)
    [conflict] = compute_plan(desired, live, source="t.toml", vhost="/").conflicts
    assert conflict.name == "r.work" and "needs RabbitMQ 4.3" in conflict.detail
    assert 'retry_engine = "queues"' in conflict.fix
    on_43 = LiveState(queues={}, exchanges={}, bindings=[], policies={}, version=(4, 3, 6))
    desired = expand(parse_topology(BROKER, "t.toml"), broker_version=(4, 3, 6))
    assert not compute_plan(desired, on_43, source="t.toml", vhost="/").conflicts


def _decide(headers: dict[str, object]) -> RetryLater | Park:
    policy = policy_from_topology(parse_topology(BROKER, "t.toml"), "r.work", None)
    assert policy.broker_retry and policy.wait_queues == ()
    decision = decide(
        Failed("app.Flaky", "try again"),
        headers,
        policy,
        exchange="",
        routing_key="r.work",
        now=datetime.now(UTC),
        host="h",
        pid=1,
    )
    assert isinstance(decision, RetryLater | Park)
    return decision


def test_a_failure_is_put_back_for_the_broker_to_hold_its_tiers_delay() -> None:
    first = _decide({})
    assert isinstance(first, RetryLater) and first.requeue
    assert (first.target_queue, first.tier_index, first.delay_ms) == ("r.work", 0, 1000)
    third = _decide({"x-delivery-count": 2})
    assert isinstance(third, RetryLater) and (third.tier_index, third.delay_ms) == (2, 3000)
    fifth = _decide({"x-delivery-count": 4})
    assert isinstance(fifth, RetryLater) and fifth.delay_ms == 3000  # the last tier repeats


def test_the_last_attempt_parks_exhausted_counting_the_brokers_returns() -> None:
    parked = _decide({"x-delivery-count": 5})
    assert isinstance(parked, Park) and parked.reason == h.ParkingReason.EXHAUSTED
    assert parked.headers[h.ATTEMPT] == 6
    # a replayed message starts afresh (attempt header 0, a new message to the broker)
    assert attempt_number({h.ATTEMPT: 0}, "r.work", broker_retry=True) == 1
    assert attempt_number({"x-delivery-count": 3}, "r.work", broker_retry=True) == 4
    assert attempt_number({"x-delivery-count": 3}, "r.work") == 1  # wait queues: not attempts

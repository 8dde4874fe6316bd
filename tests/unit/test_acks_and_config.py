from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmqkit.consumer.acks import AckTracker
from rmqkit.consumer.config import ConsumerFlags, build_config, policy_from_topology
from rmqkit.consumer.runner import Backoff
from rmqkit.errors import ConfigError
from rmqkit.topology.model import load_topology, parse_topology

ROOT = Path(__file__).resolve().parents[2]
ORDERS = load_topology(ROOT / "topologies" / "orders.toml")


def test_acks_the_finished_prefix_only() -> None:
    tracker = AckTracker()
    for tag in (1, 2, 3, 4):
        tracker.received(tag)
    tracker.finished(2)
    assert tracker.take_ack() is None  # 1 still running: acking 2 with multiple would ack 1
    tracker.finished(1)
    assert tracker.take_ack() == 2
    tracker.finished(4)
    assert tracker.take_ack() is None
    tracker.settled_elsewhere(3)  # nacked on its own
    assert tracker.take_ack() == 4
    assert tracker.outstanding == 0


def test_a_nacked_tag_is_never_the_tag_of_a_multiple_ack() -> None:
    """Acking a tag already nacked closes the channel (unknown delivery tag)."""
    tracker = AckTracker()
    for tag in (1, 2, 3, 4):
        tracker.received(tag)
    tracker.finished(1)
    tracker.settled_elsewhere(2)
    assert tracker.take_ack() == 1  # not 2
    tracker.settled_elsewhere(3)
    assert tracker.take_ack() is None  # only nacked ones: nothing to ack
    assert tracker.outstanding == 1 and tracker.pending_acks == 0
    tracker.finished(4)
    assert tracker.pending_acks == 1 and tracker.take_ack() == 4


@given(st.lists(st.tuples(st.integers(1, 40), st.booleans()), unique_by=lambda x: x[0]))
def test_multiple_acks_never_name_a_nacked_tag(settles: list[tuple[int, bool]]) -> None:
    tracker = AckTracker()
    for tag in range(1, 41):
        tracker.received(tag)
    nacked = {tag for tag, nack in settles if nack}
    settled: set[int] = set()
    for tag, nack in settles:
        (tracker.settled_elsewhere if nack else tracker.finished)(tag)
        settled.add(tag)
        last = tracker.take_ack()
        if last is not None:
            assert last not in nacked
            assert all(t in settled for t in range(1, last + 1))


@given(st.permutations(list(range(1, 60))))
def test_never_acks_past_an_unfinished_tag(order: list[int]) -> None:
    tracker = AckTracker()
    for tag in range(1, 60):
        tracker.received(tag)
    finished: set[int] = set()
    acked_up_to = 0
    for tag in order:
        tracker.finished(tag)
        finished.add(tag)
        last = tracker.take_ack()
        if last is not None:
            assert all(t in finished for t in range(1, last + 1))
            assert last > acked_up_to
            acked_up_to = last
    assert acked_up_to == 59


def test_backoff_grows_with_jitter_and_caps() -> None:
    random.seed(1)
    backoff = Backoff(base_s=0.5, cap_s=4.0)
    delays = [backoff.next_delay() for _ in range(8)]
    assert 0.25 <= delays[0] <= 0.5
    assert all(d <= 4.0 for d in delays) and delays[-1] >= 2.0
    backoff.reset()
    assert backoff.next_delay() <= 0.5


def test_policy_from_topology() -> None:
    policy = policy_from_topology(ORDERS, "orders.work", None)
    assert policy.parking_queue == "orders.work.parking"
    assert policy.retry_delays_ms == (1000, 5000, 30000, 120000)
    assert policy.wait_queues[0][-1] == "orders.work.wait.1s" and len(policy.wait_queues[0]) == 5
    assert policy.max_attempts == 5
    assert policy_from_topology(ORDERS, "orders.work", 9).max_attempts == 9
    with pytest.raises(ConfigError, match="no work queue 'nope'"):
        policy_from_topology(ORDERS, "nope", None)


def test_flags_beat_the_topology_and_warnings_are_collected() -> None:
    policy = policy_from_topology(ORDERS, "orders.work", None)
    config = build_config("m:f", "orders.work", policy, ConsumerFlags(), ORDERS)
    assert config.prefetch == 200 and config.handler_timeout_s == 30.0 and not config.warnings
    flags = ConsumerFlags(prefetch=3000, handler_timeout_s=2000.0, permanent_errors=("X",))
    config = build_config("m:f", "orders.work", policy, flags, ORDERS)
    assert config.prefetch == 3000 and "X" in config.policy.permanent_errors
    assert any("consumer timeout" in w for w in config.warnings)
    assert any("2,000" in w for w in config.warnings)
    bare = parse_topology('[queues.q]\nhandler_timeout = "5s"\n', "t.toml")
    config = build_config("m:f", "q", policy_from_topology(bare, "q", None), ConsumerFlags(), bare)
    assert config.handler_timeout_s == 5.0
    assert any("no retry tiers" in w for w in config.warnings)


def test_prefetch_is_capped_to_the_concurrency_with_a_warning() -> None:
    """Issue 9, finding 12: never hold a message no handler can start (a stop hands it back and
    spends one of its delivery attempts)."""
    policy = policy_from_topology(ORDERS, "orders.work", None)
    config = build_config(
        "m:f", "orders.work", policy, ConsumerFlags(prefetch=50, concurrency=4), ORDERS
    )
    assert config.prefetch == 4
    assert any("prefetch 50 capped to --concurrency 4" in w for w in config.warnings)
    config = build_config("m:f", "orders.work", policy, ConsumerFlags(concurrency=300), ORDERS)
    assert config.prefetch == 200  # more concurrency than prefetch: nothing to cap
    assert not any("capped" in w for w in config.warnings)

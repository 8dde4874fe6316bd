from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmqkit.consumer.acks import AckTracker
from rmqkit.consumer.config import ConsumerFlags, build_config, policy_from_topology
from rmqkit.consumer.metrics import ConsumerMetrics
from rmqkit.consumer.refusals import Backoff, RefusedCopies
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


def test_a_slow_head_holds_its_own_tag_only() -> None:
    """Finished tags past an unfinished one are acked alone one take later (the prefix may
    reach them meanwhile); the slow one is never acked, and the multiple ack that finally
    covers it never names a tag already acked alone."""
    tracker = AckTracker()
    for tag in range(1, 6):
        tracker.received(tag)
    for tag in (2, 3):
        tracker.finished(tag)
    assert tracker.take_acks() == (None, [])  # 2 and 3 may yet be covered by the prefix
    tracker.finished(4)
    assert tracker.take_acks() == (None, [2, 3])  # still behind 1: alone now
    assert tracker.pending_acks == 1 and tracker.outstanding == 3  # 1 running, 4 waiting, 5
    assert tracker.take_acks() == (None, [4])
    tracker.finished(1)
    tracker.finished(5)
    assert tracker.take_acks() == (5, [])  # multiple up to 5 covers 1 (2-4 are acked)
    assert tracker.outstanding == 0 and tracker.pending_acks == 0


def test_tags_past_a_slow_one_wait_while_the_window_has_room(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Acks one by one only when they free a slot the consumer needs (the unacked deliveries
    fill the window) or after LINGER_MAX_S: otherwise the prefix may still cover them."""
    from rmqkit.consumer import acks

    tracker = AckTracker()
    for tag in range(1, 5):
        tracker.received(tag)
    tracker.finished(2)
    tracker.finished(3)
    assert tracker.take_acks(window=5) == (None, [])
    assert tracker.take_acks(window=5) == (None, [])  # 4 unacked of a window of 5: room
    tracker.received(5)
    assert tracker.take_acks(window=5) == (None, [2, 3])  # 5 unacked: the window is full
    tracker.finished(4)
    assert tracker.take_acks(window=5) == (None, [])
    monkeypatch.setattr(acks, "LINGER_MAX_S", 0.0)
    assert tracker.take_acks(window=5) == (None, [4])  # waited long enough


def test_everything_acks_every_finished_tag_now() -> None:
    tracker = AckTracker()
    for tag in range(1, 5):
        tracker.received(tag)
    tracker.finished(3)
    tracker.finished(4)
    assert tracker.take_acks(everything=True) == (None, [3, 4])
    assert tracker.outstanding == 2 and tracker.is_open(1) and not tracker.is_open(3)


def test_a_tag_is_finished_once() -> None:
    tracker = AckTracker()
    tracker.received(1)
    tracker.finished(1)
    tracker.finished(1)  # e.g. a late error after its success: no second ack
    assert tracker.pending_acks == 1
    assert tracker.take_acks() == (1, [])
    tracker.finished(1)
    assert tracker.take_acks() == (None, []) and tracker.pending_acks == 0


@given(
    st.permutations(list(range(1, 41))),
    st.lists(st.booleans(), min_size=40, max_size=40),
    st.lists(st.booleans(), min_size=40, max_size=40),
)
def test_acks_are_never_for_an_unsettled_or_settled_tag(
    order: list[int], nacks: list[bool], takes: list[bool]
) -> None:
    """Against a model of the broker's unacked set: every ack names a tag it holds (else it
    closes the channel), no unfinished tag is ever acked, and in the end all are settled."""
    tracker = AckTracker()
    held = set(range(1, 41))  # the broker's unacked deliveries
    finished: set[int] = set()
    for tag in range(1, 41):
        tracker.received(tag)

    def take(everything: bool = False) -> None:
        last, alone = tracker.take_acks(everything=everything)
        if last is not None:
            assert last in held
            covered = {t for t in held if t <= last}
            assert covered <= finished, "a multiple ack covered an unfinished tag"
            held.difference_update(covered)
        for tag in alone:
            assert tag in held and tag in finished
            held.discard(tag)

    for step, tag in enumerate(order):
        if nacks[step]:
            tracker.settled_elsewhere(tag)
            held.discard(tag)
        else:
            tracker.finished(tag)
        finished.add(tag)
        if takes[step]:
            take()
    take()
    take()
    assert held == set() and tracker.outstanding == 0


def test_backoff_grows_with_jitter_and_caps() -> None:
    random.seed(1)
    backoff = Backoff(base_s=0.5, cap_s=4.0)
    delays = [backoff.next_delay() for _ in range(8)]
    assert 0.25 <= delays[0] <= 0.5
    assert all(d <= 4.0 for d in delays) and delays[-1] >= 2.0
    backoff.reset()
    assert backoff.next_delay() <= 0.5


def test_refused_copies_back_off_per_target_and_are_counted() -> None:
    """Issue 9, finding 10: the hold before a refused copy's original goes back grows while a
    target refuses (jittered, capped), is separate per target, ends with a confirmed copy, and
    stays well below the queue's consumer timeout."""
    random.seed(2)
    metrics = ConsumerMetrics("w")
    refusals = RefusedCopies(metrics, base_s=1.0, cap_s=15.0)
    holds = [refusals.refused("w.parking", "nacked", {}) for _ in range(8)]
    assert 0.5 <= holds[0] <= 1.0 and 1.0 <= holds[1] <= 2.0
    assert all(7.5 <= h <= 15.0 for h in holds[4:]), holds
    assert refusals.refused("w.wait.1s", "returned", {}) <= 1.0  # another target: from base
    assert refusals.refusing() == ["w.parking", "w.wait.1s"]
    refusals.confirmed("w.parking")
    assert refusals.refused("w.parking", "nacked", {}) <= 1.0
    text = metrics.render().decode()
    assert 'rmqkit_consumer_copies_refused_total{queue="w",target="w.parking"} 9.0' in text
    assert 'rmqkit_consumer_copies_refused_total{queue="w",target="w.wait.1s"} 1.0' in text
    short = RefusedCopies(metrics, consumer_timeout_s=8.0)
    assert max(short.refused("t", "nacked", {}) for _ in range(10)) <= 2.0


def test_a_consumer_cancel_fails_readiness_and_is_counted() -> None:
    metrics = ConsumerMetrics("w")
    metrics.set_connected(True)
    metrics.set_consuming(True)
    assert metrics.not_ready_reason() is None
    metrics.cancelled_by_broker()
    assert metrics.not_ready_reason() == "connected but not consuming"
    assert 'rmqkit_consumer_cancelled_by_broker_total{queue="w"} 1.0' in metrics.render().decode()


def test_the_consumer_timeout_warning_names_where_the_timeout_comes_from() -> None:
    """Issue 9, finding 11: a queue's own consumer timeout (read from the broker, with or
    without a topology file) against the handler timeout; else the assumed 30 min default."""
    policy = policy_from_topology(ORDERS, "orders.work", None)
    config = build_config("m:f", "orders.work", policy, ConsumerFlags(), ORDERS, 2.0)
    assert config.consumer_timeout_s == 2.0
    [warning] = [w for w in config.warnings if "consumer timeout" in w]
    assert warning.startswith(
        "handler timeout 30s is not below the consumer timeout: queue 'orders.work' has a "
        "consumer timeout of 2s (x-consumer-timeout or a policy)"
    )
    flags = ConsumerFlags(handler_timeout_s=1.5)
    config = build_config("m:f", "orders.work", policy, flags, ORDERS, 2.0)
    assert not any("consumer timeout" in w for w in config.warnings)
    config = build_config("m:f", "orders.work", policy, ConsumerFlags(handler_timeout_s=3600))
    [warning] = [w for w in config.warnings if "consumer timeout" in w]
    assert "assumed to be the default 1800s" in warning


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
    bare = parse_topology('[queues.q]\nhandler_timeout = "5s"\nretry_delays = []\n', "t.toml")
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

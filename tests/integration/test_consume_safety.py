"""`rmqkit consume` must not spend healthy messages' attempts, nor run on wiring that drops them.

Issue 9, findings 4, 12 and 13, against the real broker. Each test failed on the code of 7cb9a46
(the counts are in its docstring) and asserts on what the broker holds and on the handler ledger.
"""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests import broker
from tests.consumer_harness import JOBS, ConsumerProcess, effects, events, wait_until
from tests.handlers import body

WORK, PARKING = "jobs.work", "jobs.work.parking"


def _ids(n: int) -> list[str]:
    return [uuid.uuid4().hex for _ in range(n)]


def _exit_code(consumer: ConsumerProcess, timeout_s: float) -> int | None:
    try:
        return consumer.proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None


def _parked_ids(vhost: str) -> dict[str, dict[str, object]]:
    return {str(p["message_id"]): p["headers"] for p in broker.drain(vhost, PARKING)}


# --- finding 4: a hanging sync handler ----------------------------------------------------------


def test_hanging_sync_handlers_do_not_spend_healthy_messages_attempts(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    """Two messages whose `def` handler never returns, then 20 healthy ones, prefetch 4.

    The healthy ones are published once both hung messages are on their second attempt (four
    calls hang). On 7cb9a46 those calls held the pool of 4 threads, the healthy messages'
    timeouts ran while they queued for a thread, and all 20 were parked `exhausted` with
    HandlerTimeout, their handler never started. Now a timeout counts from the handler's start,
    a stuck call does not hold a healthy message's thread, and a worker whose spare threads are
    all held by stuck calls is recycled (the supervisor restarts it).
    """
    hung, healthy = _ids(2), _ids(20)
    broker.publish_with_ids(jobs_vhost, "jobs", "job", [(m, body(id=m, hang=True)) for m in hung])
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(
        jobs_vhost,
        ledger,
        "--prefetch",
        "4",
        "--handler-timeout",
        "2s",
        "--grace",
        "5s",
        handler="tests.handlers:handle_sync",
    )
    consumers.append(consumer)
    # Once both hung messages are on their second attempt, four calls hang: on the old code its
    # pool of 4 threads was full from then on.
    second_attempts = {(m, 2) for m in hung}
    assert wait_until(
        lambda: second_attempts <= {(e[0], e[1]) for e in events(ledger)}, timeout_s=30
    ), consumer.output()
    broker.publish_with_ids(
        jobs_vhost, "jobs", "job", [(m, body(id=m, sleep=0.05)) for m in healthy]
    )

    # The hung messages end in parking after their 4 attempts (1 s + 2 s tiers, 2 s timeouts);
    # wait until every message is accounted for (parked or applied).
    def settled() -> bool:
        parked = broker.depths(jobs_vhost, [PARKING])[PARKING] or 0
        return parked + len(set(effects(ledger)) & set(healthy)) >= len(hung) + len(healthy)

    assert wait_until(settled, timeout_s=90), consumer.output()
    time.sleep(1.0)
    parked = _parked_ids(jobs_vhost)
    wrongly_parked = sorted(set(parked) & set(healthy))
    assert not wrongly_parked, f"{len(wrongly_parked)} healthy messages parked"
    assert set(parked) == set(hung)
    for headers in parked.values():
        assert headers["rmqkit-error-type"] == "rmqkit.HandlerTimeout", headers
    done = effects(ledger)
    assert set(done) == set(healthy)
    assert all(n == 1 for n in done.values())
    log = consumer.output()
    assert "handler threads exhausted" in log, log
    assert "restarting" in log, log
    assert broker.depths(jobs_vhost, [WORK])[WORK] == 0
    assert consumer.stop() == 0, consumer.output()


@pytest.mark.timing
def test_sigterm_with_a_stuck_sync_handler_exits_within_the_grace(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    """SIGTERM while a `def` handler never returns: out within --grace 2s plus a small margin,
    the message not acked (back in the work queue).

    On 7cb9a46 the worker finished its drain and then waited for the handler thread at
    interpreter exit: still running 20 s after SIGTERM (the issue saw 30 s past a 5 s grace).
    """
    (mid,) = _ids(1)
    broker.publish_with_ids(jobs_vhost, "jobs", "job", [(mid, body(id=mid, hang=True))])
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(
        jobs_vhost,
        ledger,
        "--handler-timeout",
        "60s",
        "--grace",
        "2s",
        handler="tests.handlers:handle_sync",
    )
    consumers.append(consumer)
    assert wait_until(lambda: any(e[0] == mid for e in events(ledger)), timeout_s=30)
    started = time.monotonic()
    consumer.signal(signal.SIGTERM)
    code = _exit_code(consumer, timeout_s=20)
    took = time.monotonic() - started
    assert code == 0, (code, consumer.output())
    assert took < 2.0 + 3.0, took
    assert "grace period over with 1 handler(s) still running" in consumer.output()
    assert wait_until(lambda: broker.depths(jobs_vhost, [WORK])[WORK] == 1, timeout_s=10)
    assert broker.depths(jobs_vhost, [PARKING])[PARKING] == 0
    assert not effects(ledger)


# --- finding 12: restarts with --concurrency below --prefetch ------------------------------------


def test_graceful_restarts_with_concurrency_below_prefetch_spend_no_attempts(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    """Five SIGTERM restarts of `--concurrency 2 --prefetch 20` (delivery limit 3).

    On 7cb9a46 each stop handed back the 18 prefetched messages no handler had started; on 3.10
    every return counts toward the delivery limit (and the returned ones keep their place at the
    head), so the same messages came back each time and were parked `delivery_limit` (6 of 60
    when the test first saw parking non-empty). Now the prefetch is capped to the concurrency: a
    consumer holds only messages it is running, and a graceful stop lets them finish.
    """
    ids = _ids(60)
    broker.publish_with_ids(jobs_vhost, "jobs", "job", [(m, body(id=m, sleep=0.3)) for m in ids])
    ledger = tmp_path / "ledger.db"
    args = ("--concurrency", "2", "--prefetch", "20", "--grace", "5s")
    for _ in range(5):
        before = len(effects(ledger))
        consumer = ConsumerProcess(jobs_vhost, ledger, *args)
        consumers.append(consumer)
        assert wait_until(lambda b=before: len(effects(ledger)) >= b + 2, timeout_s=30)
        consumer.signal(signal.SIGTERM)
        assert _exit_code(consumer, timeout_s=15) == 0, consumer.output()

    consumer = ConsumerProcess(jobs_vhost, ledger, *args)
    consumers.append(consumer)
    assert wait_until(
        lambda: (
            set(effects(ledger)) >= set(ids)
            or (broker.depths(jobs_vhost, [PARKING])[PARKING] or 0) > 0
        ),
        timeout_s=90,
    )
    code = consumer.stop()
    parked = _parked_ids(jobs_vhost)
    reasons = {
        str(h.get("rmqkit-park-reason") or h.get("x-first-death-reason")) for h in parked.values()
    }
    assert not parked, f"{len(parked)} parked ({reasons})"
    assert set(effects(ledger)) == set(ids)
    # Nothing was handed back: no message reached its handler a second time.
    attempts = [e for e in events(ledger) if e[2] == "attempt"]
    assert len(attempts) == len(ids)
    assert broker.depths(jobs_vhost, [WORK])[WORK] == 0
    assert "prefetch 20 capped to --concurrency 2" in consumers[0].output()
    assert code == 0, consumer.output()


# --- finding 13: wiring that would drop messages --------------------------------------------------

TTL_ONLY = {
    "pattern": r"^jobs\.work\.wait\.",
    "apply-to": "queues",
    "priority": 20,
    "definition": {"message-ttl": 1000},
}


@pytest.mark.parametrize("with_topology", [True, False], ids=["topology", "broker"])
def test_consume_refuses_wait_queues_that_would_drop_their_messages(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess], with_topology: bool
) -> None:
    """A user policy of higher priority that sets only message-ttl on the wait queues replaces
    rmqkit's: they no longer dead-letter back to the work queue.

    On 7cb9a46 `consume --topology` started, the message failed once, went to a wait queue and
    was dropped when its wait expired (work, wait and parking queues all empty, no effect); without
    --topology the wait queues were silently left out and every transient failure was parked at
    once. Now consume refuses to start: exit 78, one line naming the queue, nothing consumed.
    """
    path = f"/policies/{broker.q(jobs_vhost)}/ttl-only"
    broker.api("PUT", path, json=TTL_ONLY).raise_for_status()
    (mid,) = _ids(1)
    broker.publish_with_ids(jobs_vhost, "jobs", "job", [(mid, body(id=mid, fail=1))])
    ledger = tmp_path / "ledger.db"
    # Without a file: --no-topology, on the wiring the broker holds (the queue is wired, so
    # consume would otherwise refuse for want of a file before it looks at the wait queues).
    consumer = ConsumerProcess(
        jobs_vhost,
        ledger,
        *([] if with_topology else ["--no-topology"]),
        topology=JOBS if with_topology else None,
    )
    consumers.append(consumer)
    code = _exit_code(consumer, timeout_s=15)
    # What the broker holds first: the old code lost the message here.
    if code is None:
        time.sleep(5)  # let the old code's copy expire from its wait queue
    assert broker.depths(jobs_vhost, [WORK])[WORK] == 1, consumer.output()
    assert not events(ledger)
    assert code == 78, consumer.output()
    lines = [line for line in consumer.output().splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "jobs.work.wait." in lines[0] and "drop" in lines[0], lines[0]
    assert "ttl-only" in lines[0], lines[0]


def test_consume_refuses_a_work_queue_that_would_drop_over_its_delivery_limit(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    """A higher-priority policy on the work queue that keeps a delivery limit but has no
    dead-letter target: a message over the limit would be dropped. consume refuses (78)."""
    policy = {
        "pattern": r"^jobs\.work$",
        "apply-to": "queues",
        "priority": 20,
        "definition": {"delivery-limit": 3},
    }
    broker.api("PUT", f"/policies/{broker.q(jobs_vhost)}/limit-only", json=policy)
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(jobs_vhost, ledger)
    consumers.append(consumer)
    code = _exit_code(consumer, timeout_s=15)
    assert code == 78, consumer.output()
    assert "jobs.work" in consumer.output() and "drop" in consumer.output()

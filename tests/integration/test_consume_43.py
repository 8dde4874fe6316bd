"""`rmqkit consume` on RabbitMQ 4.3: a parking queue that refuses copies, and a consumer timeout.

Issue 9, findings 10 and 11, against the real broker (run with the 4.3 node's variables,
``set -a; eval "$(scripts/broker-up --version 4.3 --env)"; set +a``, and on the default 3.10
node). What the broker does that these tests build on, checked on the nodes:

- 4.3 does not count ``basic.nack(requeue=True)`` toward a quorum queue's delivery limit;
  ``basic.reject(requeue=True)`` counts on 3.10, 4.0 and 4.3 (test_broker_versions.py).
- A work queue with ``dead-letter-strategy=at-least-once`` (what ``rmqkit declare`` sets) whose
  parking queue is full (``overflow=reject-publish``) keeps a message over its delivery limit,
  counted in the management API's ``messages_dlx``, on 3.10.8 and 4.3.6 alike; it moves into
  the parking queue with reason ``delivery_limit`` once there is room.
- 4.3 enforces a queue's ``x-consumer-timeout``/``consumer-timeout`` to the second (2 s: the
  basic.cancel came at 2.0 s), cancels the consumer (the channel stays open), and returns its
  unacked messages at once; such returns do not count toward the delivery limit (only
  ``x-acquired-count`` rises). Up to 4.2 the channel is closed instead (406).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

import rmqkit
from rmqkit import headers as h
from rmqkit.topology import declare_topology, load_topology
from rmqkit.topology.desired import policy_name
from tests import broker
from tests.consumer_harness import JOBS, ConsumerProcess, effects, events, wait_until
from tests.handlers import body, record
from tests.ports import free_port

pytestmark = pytest.mark.semantics("4.3")

WORK, PARKING = "jobs.work", "jobs.work.parking"
DELIVERY_LIMIT = 3  # tests/topologies/jobs.toml


def _add_to_rmqkit_policy(vhost: str, queue: str, **settings: Any) -> None:
    """Add keys to the policy `rmqkit declare` made for ``queue`` (only one policy applies)."""
    path = f"/policies/{broker.q(vhost)}/{broker.q(policy_name(queue))}"
    policy = broker.api("GET", path).json()
    policy["definition"].update({k.replace("_", "-"): v for k, v in settings.items()})
    new = {k: policy[k] for k in ("pattern", "definition", "priority", "apply-to")}
    broker.api("PUT", path, json=new).raise_for_status()


def _queue_stats(vhost: str, name: str) -> dict[str, Any]:
    return broker.mgmt_queue(vhost, name) or {}


def _metric(port: int, line_start: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


# --- finding 10: a parking queue that refuses copies --------------------------------------------


async def _fill(vhost: str, queue: str, most: int) -> int:
    """Publish fillers into ``queue`` until the broker nacks one; the number accepted."""
    import aio_pika

    conn = await aio_pika.connect(_url(vhost))
    try:
        channel = await conn.channel()
        for accepted in range(most):
            try:
                await channel.default_exchange.publish(
                    aio_pika.Message(b"filler", message_id=f"filler-{accepted}"), routing_key=queue
                )
            except aio_pika.exceptions.DeliveryError:
                return accepted
        raise AssertionError(f"{queue} took {most} messages without refusing one")
    finally:
        await conn.close()


def _url(vhost: str) -> str:
    from rmqkit.settings import with_vhost

    return with_vhost(broker.BASE_URL, vhost)


@pytest.mark.timing
def test_a_full_parking_queue_does_not_make_an_endless_retry_loop(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    """50 messages whose handler raises Permanent; the parking queue bounded and full.

    Bound: each park copy is refused, so each original is put back with basic.reject
    (requeue), which counts toward the work queue's delivery limit on every version: a message
    is delivered at most limit + 1 times, then the broker dead-letters it (delivery_limit) and,
    at-least-once, keeps it in the work queue while parking is full. So at most 50 x (limit + 1)
    handler runs, and none once all 50 are held (nothing else returns a message here). The
    work queue's policy lowers the limit to 1 here: each refusal holds its original up to 15 s
    (the refusal backoff's cap), so every extra delivery costs the test that long.

    On 7cb9a46 against 4.3.6: the original was nack-requeued about once a second, which 4.3 does
    not count, and the runs never stopped: 6,815 handler runs in the 150 s this test waits, and
    none of the 50 held by the broker (the issue saw 1,049 in 40 s). On 3.10 the old code's nack
    counted toward the limit, so it passes there.
    """
    limit = 1  # below the topology's 3: a quorum queue takes the policy's limit when lower
    _add_to_rmqkit_policy(jobs_vhost, PARKING, max_length=5)
    _add_to_rmqkit_policy(jobs_vhost, WORK, delivery_limit=limit)
    assert wait_until(
        lambda: (
            _queue_stats(jobs_vhost, PARKING)
            .get("effective_policy_definition", {})
            .get("max-length")
            == 5
            and _queue_stats(jobs_vhost, WORK)
            .get("effective_policy_definition", {})
            .get("delivery-limit")
            == limit
        ),
        timeout_s=10,
    )
    fillers = broker.run(_fill(jobs_vhost, PARKING, 50))
    ids = [uuid.uuid4().hex for _ in range(50)]
    broker.publish_with_ids(
        jobs_vhost, "jobs", "job", [(m, body(id=m, permanent=True)) for m in ids]
    )
    ledger = tmp_path / "ledger.db"
    port = free_port()
    consumer = ConsumerProcess(jobs_vhost, ledger, "--metrics-port", str(port), "--grace", "5s")
    consumers.append(consumer)

    def runs() -> int:
        return sum(1 for e in events(ledger) if e[2] == "attempt")

    # All 50 held by the broker (over their limit, parking full): messages_dlx.
    held = wait_until(
        lambda: _queue_stats(jobs_vhost, WORK).get("messages_dlx") == len(ids), timeout_s=150
    )
    at_held = runs()
    assert held, (at_held, _queue_stats(jobs_vhost, WORK), consumer.output()[-3000:])
    time.sleep(5)  # nothing left to deliver: the run count stays where it is
    total = runs()
    assert total == at_held, (at_held, total)
    per_message = [sum(1 for e in events(ledger) if e[0] == m and e[2] == "attempt") for m in ids]
    assert max(per_message) <= limit + 1, per_message
    assert total <= len(ids) * (limit + 1), total

    # Counted and logged; the consumer is still running and ready.
    refused = 'rmqkit_consumer_copies_refused_total{queue="jobs.work",target="jobs.work.parking"}'
    assert _metric(port, refused) == total, total
    assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200
    log = consumer.output()
    assert "copy to jobs.work.parking was refused (nacked)" in log, log[-3000:]
    assert "dead-letters at-most-once" not in log  # declare's work queue: at-least-once
    assert consumer.proc.poll() is None

    # Nothing lost: every message is in the work queue (held for dead-lettering) or parked.
    work = _queue_stats(jobs_vhost, WORK)
    assert work.get("messages_ready") == 0 and work.get("messages_unacknowledged") == 0, work
    assert broker.depths(jobs_vhost, [PARKING])[PARKING] == fillers

    started = time.monotonic()
    assert consumer.stop(timeout=20) == 0, consumer.output()[-3000:]
    assert time.monotonic() - started < 5 + 5

    # The held messages are real: 50 in the work queue's dead-letter backlog, still there.
    assert _queue_stats(jobs_vhost, WORK).get("messages_dlx") == len(ids)


def test_refused_retry_copies_are_bounded_by_the_delivery_limit(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    """The same bound for retries: the first tier's wait queues are deleted under a running
    consumer, so every retry copy is returned (unroutable). Each original is held, put back
    counting toward the delivery limit, and after 4 runs (limit 3) the broker dead-letters it
    into parking (reason delivery_limit). Runs on every version. On 7cb9a46 against 4.3.6 the
    nack-requeue loop never reached the limit: none of the 10 parked in 150 s (on 3.10 the nack
    counted, so it passes there)."""
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(jobs_vhost, ledger)
    consumers.append(consumer)
    assert wait_until(lambda: "consuming jobs.work" in consumer.output(), timeout_s=20)
    for wait in (n for n in broker.queue_names(jobs_vhost) if n.startswith("jobs.work.wait.1s")):
        broker.api("DELETE", f"/queues/{broker.q(jobs_vhost)}/{broker.q(wait)}")
    ids = [uuid.uuid4().hex for _ in range(10)]
    broker.publish_with_ids(jobs_vhost, "jobs", "job", [(m, body(id=m, fail=99)) for m in ids])
    assert wait_until(
        lambda: (broker.depths(jobs_vhost, [PARKING])[PARKING] or 0) == len(ids), timeout_s=150
    ), (_queue_stats(jobs_vhost, WORK), consumer.output()[-3000:])
    attempts = [sum(1 for e in events(ledger) if e[0] == m and e[2] == "attempt") for m in ids]
    assert attempts == [DELIVERY_LIMIT + 1] * len(ids), attempts
    log = consumer.output()
    assert "copy to jobs.work.wait.1s" in log and " was refused (returned); holding" in log, log
    assert consumer.stop() == 0
    parked = broker.drain(jobs_vhost, PARKING)
    assert sorted(str(p["message_id"]) for p in parked) == sorted(ids)
    assert all(p["headers"]["x-death"][0]["reason"] == "delivery_limit" for p in parked)


def test_a_bounded_parking_queue_with_at_most_once_dead_lettering_is_warned_about(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    """With the work queue's dead-lettering at-most-once (a policy without
    dead-letter-strategy), a full bounded parking queue would make the broker drop a message
    over its delivery limit: consume says so at start."""
    path = f"/policies/{broker.q(jobs_vhost)}/{broker.q(policy_name(WORK))}"
    policy = broker.api("GET", path).json()
    del policy["definition"]["dead-letter-strategy"]
    new = {k: policy[k] for k in ("pattern", "definition", "priority", "apply-to")}
    broker.api("PUT", path, json=new).raise_for_status()
    _add_to_rmqkit_policy(jobs_vhost, PARKING, max_length=5)
    assert wait_until(
        lambda: (
            "max-length" in _queue_stats(jobs_vhost, PARKING).get("effective_policy_definition", {})
            and "dead-letter-strategy"
            not in _queue_stats(jobs_vhost, WORK).get("effective_policy_definition", {})
        ),
        timeout_s=10,
    )
    consumer = ConsumerProcess(jobs_vhost, tmp_path / "ledger.db")
    consumers.append(consumer)
    warning = (
        "parking queue 'jobs.work.parking' is bounded and work queue 'jobs.work' dead-letters "
        "at-most-once"
    )
    assert wait_until(lambda: "consuming jobs.work" in consumer.output(), timeout_s=20)
    assert warning in consumer.output(), consumer.output()
    assert consumer.stop() == 0


# --- finding 11: the consumer timeout -----------------------------------------------------------


async def slow_first(message: rmqkit.Message) -> None:
    """Handler: the first delivery of a message takes 3.5 s, a redelivery none."""
    record(message.message_id, message.attempt, "attempt")
    if not message.redelivered:
        await asyncio.sleep(3.5)
    record(message.message_id, message.attempt, "effect")


def _short_queue_timeout(vhost: str) -> None:
    """Give the work queue a 2 s consumer timeout (policy key), and wait until it applies."""
    if broker.version() < (4, 3):
        pytest.skip(
            "a consumer timeout per consumer (x-consumer-timeout on basic.consume) is passed on "
            "4.3 only; before it a queue's timeout closes the channel (406) about once a minute "
            "and 3.10 has no per-queue timeout; the 406 close takes the reconnect path "
            "test_consume.py covers"
        )
    _add_to_rmqkit_policy(vhost, WORK, consumer_timeout=2000)
    assert wait_until(
        lambda: (
            _queue_stats(vhost, WORK).get("effective_policy_definition", {}).get("consumer-timeout")
            == 2000
        ),
        timeout_s=10,
    )


def test_a_queue_consumer_timeout_shorter_than_the_handler_no_longer_cancels_it(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    """The work queue's consumer timeout is 2 s, each handler's first run 3.5 s, the handler
    timeout 30 s. On 4.3 the consumer passes x-consumer-timeout (30 s + 60 s margin) on its own
    basic.consume, which outranks the queue's: no cancel, each message handled once, on its
    first delivery. Before this, 4.3 cancelled the consumer at 2 s and returned the messages,
    not counting the returns toward the delivery limit: each handler ran again (a duplicate
    effect had it not been for the redelivered flag this handler checks), and a handler
    always slower than the timeout looped for ever."""
    _short_queue_timeout(jobs_vhost)
    ids = [uuid.uuid4().hex for _ in range(5)]
    broker.publish_with_ids(jobs_vhost, "jobs", "job", [(m, body(id=m)) for m in ids])
    ledger = tmp_path / "ledger.db"
    port = free_port()
    consumer = ConsumerProcess(
        jobs_vhost,
        ledger,
        "--metrics-port",
        str(port),
        "--log-format",
        "json",
        "--handler-timeout",
        "30s",
        handler="tests.integration.test_consume_43:slow_first",
    )
    consumers.append(consumer)
    assert wait_until(lambda: set(effects(ledger)) >= set(ids), timeout_s=30), consumer.output()[
        -3000:
    ]
    assert wait_until(
        lambda: (
            (s := _queue_stats(jobs_vhost, WORK)).get("messages") == 0
            and s.get("messages_unacknowledged") == 0
        ),
        timeout_s=20,
    ), (_queue_stats(jobs_vhost, WORK), consumer.output()[-3000:])
    assert broker.depths(jobs_vhost, [WORK, PARKING]) == {WORK: 0, PARKING: 0}
    attempts = [e for e in events(ledger) if e[2] == "attempt"]
    assert sorted(e[0] for e in attempts) == sorted(ids), attempts  # one run each
    assert effects(ledger) == {m: 1 for m in ids}
    lines = [json.loads(x) for x in consumer.output().splitlines() if x.startswith("{")]
    messages = [str(x.get("msg", "")) for x in lines]
    assert not any(m.startswith("the broker cancelled consumer ") for m in messages), messages
    assert not any("is not below the consumer timeout" in m for m in messages), messages
    cancels = 'rmqkit_consumer_cancelled_by_broker_total{queue="jobs.work"}'
    assert _metric(port, cancels) == 0
    assert consumer.stop() == 0


async def always_hangs(message: rmqkit.Message) -> None:
    """Handler: never finishes (until the handler timeout cancels it)."""
    record(message.message_id, message.attempt, "attempt")
    await asyncio.sleep(3600)


def test_a_handler_that_always_hangs_is_still_parked_exhausted(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    """4.3 does not count consumer timeouts toward the delivery limit, so the broker would
    never park this message. rmqkit's own attempts do: the handler timeout (1 s) fails each
    run, the message goes through the wait queues, and after max_attempts (2 here) it is
    parked with reason exhausted. The queue's 2 s consumer timeout cancels nothing."""
    _short_queue_timeout(jobs_vhost)
    mid = uuid.uuid4().hex
    broker.publish_with_ids(jobs_vhost, "jobs", "job", [(mid, body(id=mid))])
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(
        jobs_vhost,
        ledger,
        "--handler-timeout",
        "1s",
        "--max-attempts",
        "2",
        handler="tests.integration.test_consume_43:always_hangs",
    )
    consumers.append(consumer)
    assert wait_until(lambda: broker.depths(jobs_vhost, [PARKING])[PARKING] == 1, timeout_s=40), (
        consumer.output()[-3000:]
    )
    (parked,) = broker.drain(jobs_vhost, PARKING)
    assert parked["message_id"] == mid
    assert parked["headers"][h.PARK_REASON] == "exhausted", parked["headers"]
    assert [e[1] for e in events(ledger) if e[2] == "attempt"] == [1, 2]
    assert broker.depths(jobs_vhost, [WORK]) == {WORK: 0}
    assert "the broker cancelled consumer " not in consumer.output()
    assert consumer.stop() == 0


def test_a_deleted_work_queue_cancels_the_consumer_which_says_so_and_waits_for_it(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    """Any version: deleting the work queue makes the broker cancel the consumer (basic.cancel).
    The consumer logs it, fails /readyz naming the missing queue, and waits (a queue deleted
    under a running consumer is not a reason to stop: only its own consumer waits, docs/
    consume.md); declared again, it is consumed again. On 7cb9a46 it logged nothing of its own
    and kept running, ready; later it exited 78, stopping every queue it served."""
    port = free_port()
    consumer = ConsumerProcess(jobs_vhost, tmp_path / "ledger.db", "--metrics-port", str(port))
    consumers.append(consumer)
    assert wait_until(lambda: "consuming jobs.work" in consumer.output(), timeout_s=20)
    broker.api("DELETE", f"/queues/{broker.q(jobs_vhost)}/{broker.q(WORK)}").raise_for_status()

    def ready() -> tuple[int, str]:
        try:
            response = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=3)
        except httpx.HTTPError as exc:
            return 0, str(exc)
        return response.status_code, response.text

    assert wait_until(lambda: "queue 'jobs.work' does not exist" in ready()[1], timeout_s=30), (
        ready(),
        consumer.output(),
    )
    assert ready()[0] == 503
    log = consumer.output()
    assert "the broker cancelled consumer " in log, log
    assert "queue 'jobs.work' does not exist" in log, log
    assert consumer.proc.poll() is None, log  # waiting, not stopped

    broker.run(declare_topology(broker.settings_for(jobs_vhost), load_topology(JOBS)))
    mid = uuid.uuid4().hex
    broker.publish_with_ids(jobs_vhost, "jobs", "job", [(mid, body(id=mid))])
    assert wait_until(lambda: mid in effects(tmp_path / "ledger.db"), timeout_s=30), (
        consumer.output()
    )
    assert wait_until(lambda: ready()[0] == 200, timeout_s=15), ready()
    assert consumer.stop() == 0, consumer.output()

"""`rmqkit consume` against the real broker: outcomes, retries, parking, shutdown, bad handlers."""

from __future__ import annotations

import json
import random
import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from rmqkit.settings import with_vhost
from tests import broker
from tests.consumer_harness import JOBS, ConsumerProcess, effects, events, wait_until
from tests.handlers import body

pytestmark = pytest.mark.semantics("4.0")

WORK, PARKING = "jobs.work", "jobs.work.parking"


def _all_queues_empty_but_parking(vhost: str) -> bool:
    counts = broker.depths(vhost, broker.queue_names(vhost) - {PARKING})
    return all(v == 0 for v in counts.values())


@pytest.mark.timing  # the retry delays between the attempts the ledger records
def test_mixed_outcomes_each_effect_once_and_poison_parked(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    rng = random.Random(7)
    ids = [uuid.uuid4().hex for _ in range(1000)]
    kinds = ["transient"] * 100 + ["permanent"] * 20 + ["undecodable"] * 10 + ["ok"] * 870
    rng.shuffle(kinds)
    kind_of = dict(zip(ids, kinds, strict=True))
    messages = []
    for mid in ids:
        kind = kind_of[mid]
        if kind == "undecodable":
            messages.append((mid, b"\x00\xff not json"))
        else:
            messages.append(
                (
                    mid,
                    body(
                        id=mid, fail=2 if kind == "transient" else 0, permanent=kind == "permanent"
                    ),
                )
            )
    broker.publish_with_ids(jobs_vhost, "jobs", "job", messages)

    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(jobs_vhost, ledger)
    consumers.append(consumer)
    good = {m for m, k in kind_of.items() if k in ("ok", "transient")}
    assert wait_until(lambda: set(effects(ledger)) >= good, timeout_s=60), consumer.output()
    assert wait_until(lambda: broker.depths(jobs_vhost, [PARKING])[PARKING] == 30, timeout_s=20)
    assert wait_until(lambda: _all_queues_empty_but_parking(jobs_vhost), timeout_s=10)
    assert consumer.stop() == 0, consumer.output()

    done = effects(ledger)
    assert set(done) == good
    assert all(n == 1 for n in done.values()), [m for m, n in done.items() if n > 1]

    parked = {p["message_id"]: p for p in broker.drain(jobs_vhost, PARKING)}
    assert set(parked) == {m for m, k in kind_of.items() if k in ("permanent", "undecodable")}
    for mid, message in parked.items():
        headers = message["headers"]
        expected = "permanent" if kind_of[mid] == "permanent" else "undecodable"
        assert headers["rmqkit-park-reason"] == expected
        assert headers["rmqkit-attempt"] == 1
        assert headers["rmqkit-origin-queue"] == WORK
        assert headers["rmqkit-original-exchange"] == "jobs"
        assert headers["rmqkit-original-routing-key"] == "job"
        assert headers["rmqkit-error-type"] and headers["rmqkit-error-message"]
        assert "x-death" not in headers
        if expected == "permanent":
            assert headers["rmqkit-error-type"] == "rmqkit.Permanent"  # public name
            assert "is invalid" in headers["rmqkit-error-message"]
        assert message["body"] == dict(messages)[mid]

    # Retry delays follow the tiers: attempt 2 comes 0.5-1 s after attempt 1 (1 s tier with
    # jitter 0.5), attempt 3 comes 1-2 s after attempt 2 (2 s tier).
    starts: dict[tuple[str, int], float] = {}
    for mid, attempt, kind, t in events(ledger):
        if kind == "attempt":
            starts.setdefault((mid, attempt), t)
    for mid in (m for m, k in kind_of.items() if k == "transient"):
        first, second = starts[(mid, 2)] - starts[(mid, 1)], starts[(mid, 3)] - starts[(mid, 2)]
        assert 0.45 <= first <= 1.0 + 0.6, (mid, first)
        assert 0.95 <= second <= 2.0 + 0.6, (mid, second)
        assert (mid, 4) not in starts


def test_a_message_failing_every_time_is_parked_exhausted(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    mid = uuid.uuid4().hex
    broker.publish_with_ids(jobs_vhost, "jobs", "job", [(mid, body(id=mid, fail=99))])
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(jobs_vhost, ledger)
    consumers.append(consumer)
    assert wait_until(lambda: broker.depths(jobs_vhost, [PARKING])[PARKING] == 1, timeout_s=20)
    assert consumer.stop() == 0
    attempts = sorted(a for m, a, kind, _ in events(ledger) if kind == "attempt")
    assert attempts == [1, 2, 3, 4]  # max_attempts = 4
    [parked] = broker.drain(jobs_vhost, PARKING)
    headers = parked["headers"]
    assert headers["rmqkit-park-reason"] == "exhausted"
    assert headers["rmqkit-attempt"] == 4
    assert headers["rmqkit-error-type"] == "ConnectionError"
    assert headers["rmqkit-error-message"] == "downstream timed out on attempt 4"
    assert "ConnectionError" in headers["rmqkit-traceback"]
    assert headers["rmqkit-first-failed-at"] < headers["rmqkit-last-failed-at"]
    assert _all_queues_empty_but_parking(jobs_vhost)


@pytest.mark.timing
def test_sigterm_under_load_exits_0_in_grace_and_leaves_nothing_unacked(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    ids = [uuid.uuid4().hex for _ in range(400)]
    broker.publish_with_ids(jobs_vhost, "jobs", "job", [(m, body(id=m, sleep=0.2)) for m in ids])
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(jobs_vhost, ledger, "--grace", "3s", "--processes", "2")
    consumers.append(consumer)
    assert wait_until(lambda: len(effects(ledger)) >= 50, timeout_s=30), consumer.output()
    started = time.monotonic()
    consumer.signal(signal.SIGTERM)
    code = consumer.proc.wait(timeout=10)  # not stop(): a second SIGTERM means "stop at once"
    elapsed = time.monotonic() - started
    assert code == 0, consumer.output()
    assert elapsed <= 3 + 1, elapsed
    done = effects(ledger)
    assert all(n == 1 for n in done.values())
    # Nothing lost: every id is either done or back in the queue, ready (not unacked).
    remaining = broker.depths(jobs_vhost, [WORK])[WORK]
    assert remaining is not None and len(done) + remaining == len(ids)
    queue = broker.wait_for(
        lambda: (q := broker.mgmt_queue(jobs_vhost, WORK)) and q.get("consumers") == 0 and q
    )
    assert queue and queue.get("messages_unacknowledged", 0) == 0


@pytest.mark.timing
def test_a_second_signal_stops_at_once_and_loses_nothing(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    ids = [uuid.uuid4().hex for _ in range(100)]
    broker.publish_with_ids(jobs_vhost, "jobs", "job", [(m, body(id=m, sleep=20)) for m in ids])
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(jobs_vhost, ledger, "--grace", "60s", "--processes", "2")
    consumers.append(consumer)

    def handling() -> bool:
        return len({m for m, _, kind, _ in events(ledger) if kind == "attempt"}) >= 20

    assert wait_until(handling, timeout_s=30), consumer.output()
    consumer.signal(signal.SIGTERM)  # graceful: would wait up to 60 s for 20 s handlers
    time.sleep(0.5)
    started = time.monotonic()
    consumer.signal(signal.SIGTERM)  # the second one: stop now
    code = consumer.proc.wait(timeout=10)
    assert code == 130, consumer.output()
    assert time.monotonic() - started < 5
    assert not effects(ledger)  # every handler was cut off before its side effect
    # Nothing lost: the broker takes back what the killed workers held.
    assert broker.wait_for(lambda: broker.depths(jobs_vhost, [WORK])[WORK] == len(ids)), (
        broker.depths(jobs_vhost, [WORK])
    )


def test_handler_that_cannot_be_imported_exits_78(jobs_vhost: str) -> None:
    for spec, needle in (
        ("nosuch.module:handle", "nosuch"),
        ("tests.handlers:missing_function", "missing_function"),
        # a module with no @rmqkit.handler routes: says how to name one handler
        ("tests.handlers", "@rmqkit.handler"),
        ("tests/handlers.py", "expected 'module:function'"),
    ):
        result = broker.cli("consume", spec, "--queue", WORK, "--topology", JOBS, vhost=jobs_vhost)
        assert result.returncode == 78, (spec, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], result.stderr


def test_without_topology_the_queue_settings_come_from_the_broker(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    mid = uuid.uuid4().hex
    broker.publish_with_ids(jobs_vhost, "jobs", "job", [(mid, body(id=mid, fail=1))])
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(jobs_vhost, ledger, "--no-topology", topology=None)
    consumers.append(consumer)
    assert wait_until(lambda: effects(ledger)[mid] == 1, timeout_s=20), consumer.output()
    assert consumer.stop() == 0
    assert Counter(a for m, a, k, _ in events(ledger) if k == "attempt") == {1: 1, 2: 1}


@pytest.mark.timing
def test_jitter_spreads_a_burst_of_retries_over_the_tier_window(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    ids = [uuid.uuid4().hex for _ in range(500)]
    broker.publish_with_ids(jobs_vhost, "jobs", "job", [(m, body(id=m, fail=1)) for m in ids])
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(jobs_vhost, ledger, "--prefetch", "500")
    consumers.append(consumer)
    assert wait_until(lambda: set(effects(ledger)) >= set(ids), timeout_s=30), consumer.output()
    assert consumer.stop() == 0
    first: dict[str, float] = {}
    second: dict[str, float] = {}
    decided: dict[str, float] = {}
    for mid, attempt, kind, t in events(ledger):
        if kind == "attempt":
            (first if attempt == 1 else second).setdefault(mid, t)
        elif kind == "failed_at":
            decided.setdefault(mid, t)
    burst_start = min(first.values())
    returns = sorted(second[m] - burst_start for m in ids)
    # No retry waits longer than its tier (1 s) plus scheduling slack, counted from the
    # consumer's retry decision (rmqkit-last-failed-at) to the next delivery's handling.
    waits = [second[m] - decided[m] for m in ids]
    assert min(waits) >= 0.45, min(waits)  # the shortest slot is half the delay
    assert max(waits) <= 1.0 + 0.75, max(waits)
    # No 100 ms window holds more than 30% of the burst.
    worst = max(sum(1 for r in returns if start <= r < start + 0.1) for start in returns)
    assert worst <= 0.30 * len(ids), (worst, returns[:5], returns[-5:])


def test_metrics_readiness_and_json_logs_with_message_context(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    import httpx

    from tests.ports import free_port

    port = free_port()
    ok = [uuid.uuid4().hex for _ in range(20)]
    broker.publish_with_ids(jobs_vhost, "jobs", "job", [(m, body(id=m)) for m in ok])
    [bad] = [uuid.uuid4().hex]
    broker.publish_with_ids(jobs_vhost, "jobs", "job", [(bad, body(id=bad, permanent=True))])
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(
        jobs_vhost, ledger, "--metrics-port", str(port), "--log-format", "json"
    )
    consumers.append(consumer)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return httpx.get(url + "/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    assert wait_until(ready, timeout_s=20), consumer.output()
    assert httpx.get(url + "/healthz", timeout=2).status_code == 200
    assert wait_until(lambda: len(effects(ledger)) == 20, timeout_s=20)
    assert wait_until(lambda: broker.depths(jobs_vhost, [PARKING])[PARKING] == 1, timeout_s=10)
    metrics = httpx.get(url + "/metrics", timeout=2).text
    assert 'rmqkit_consumer_received_total{queue="jobs.work"} 21.0' in metrics
    assert 'rmqkit_consumer_parked_total{queue="jobs.work",reason="permanent"} 1.0' in metrics
    assert "rmqkit_consumer_handler_seconds_bucket" in metrics
    assert consumer.stop() == 0
    import json

    lines = [json.loads(x) for x in consumer.output().splitlines() if x.startswith("{")]
    parked = [x for x in lines if x.get("decision") == "park"]
    assert parked and parked[0]["message_id"] == bad and parked[0]["attempt"] == 1


def test_fails_over_to_the_next_url(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    mid = uuid.uuid4().hex
    broker.publish_with_ids(jobs_vhost, "jobs", "job", [(mid, body(id=mid))])
    ledger = tmp_path / "ledger.db"
    dead = f"amqp://guest:guest@127.0.0.1:5999/{broker.q(jobs_vhost)}"
    live = with_vhost(broker.BASE_URL, jobs_vhost)  # the broker under test
    consumer = ConsumerProcess(jobs_vhost, ledger, "--url", f"{dead},{live}", global_args=True)
    consumers.append(consumer)
    assert wait_until(lambda: effects(ledger)[mid] == 1, timeout_s=20), consumer.output()
    assert consumer.stop() == 0


def test_headers_the_client_library_cannot_decode_do_not_loop(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    """pamqp alone fails the whole connection on these header values (which RabbitMQ accepts):
    one such message would become a reconnect loop that spends its neighbours' attempts."""
    import asyncio

    import aiormq

    from rmqkit.broker.codec import Timestamp, TypedProperties
    from rmqkit.settings import with_vhost

    async def publish() -> None:
        conn = await aiormq.connect(with_vhost(broker.BASE_URL, jobs_vhost))
        channel = await conn.channel()
        odd = {"far-future": Timestamp(2**64 - 1), "key-\udcff": "x"}
        await channel.basic_publish(
            body(id="odd"),
            routing_key=WORK,
            properties=TypedProperties(message_id="odd", headers=odd),
        )
        await channel.basic_publish(
            body(id="next"), routing_key=WORK, properties=TypedProperties(message_id="next")
        )
        await conn.close()

    asyncio.run(publish())
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(jobs_vhost, ledger)
    consumers.append(consumer)
    assert wait_until(lambda: effects(ledger) == Counter({"odd": 1, "next": 1}), timeout_s=20)
    assert consumer.stop() == 0
    assert "connection lost" not in consumer.output()
    assert broker.depths(jobs_vhost, [PARKING])[PARKING] == 0


def test_returned_retry_copies_without_or_with_shared_ids_are_not_lost(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    """A retry copy the broker returns (its wait queue is gone) must leave the original to come
    back. aiormq matches returns by message_id: for a copy with none, or one shared with another
    copy in flight, the return was dropped and the ack that follows counted as the copy's."""
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(jobs_vhost, ledger, handler="tests.handlers:handle_by_body_id")
    consumers.append(consumer)
    assert wait_until(lambda: "consuming jobs.work" in consumer.output(), timeout_s=20)
    tier = sorted(n for n in broker.queue_names(jobs_vhost) if n.startswith("jobs.work.wait.1s"))
    assert len(tier) > 1, tier  # the tier's queue and its jitter slots: every copy is returned
    for name in tier:
        broker.api("DELETE", f"/queues/{broker.q(jobs_vhost)}/{broker.q(name)}")
    ids = [f"job-{i}" for i in range(40)]
    shared = uuid.uuid4().hex
    broker.publish_exact(
        jobs_vhost,
        "jobs",
        [("job", None if i % 2 else shared, body(id=key, fail=1), {}) for i, key in enumerate(ids)],
    )
    wait_until(lambda: "was refused (returned)" in consumer.output(), timeout_s=10)
    assert broker.cli("declare", JOBS, vhost=jobs_vhost).returncode == 0  # the wait queue back

    def settled() -> bool:
        parked = broker.depths(jobs_vhost, [PARKING])[PARKING] or 0
        return len(set(effects(ledger))) + parked == len(ids) and _all_queues_empty_but_parking(
            jobs_vhost
        )

    assert wait_until(settled, timeout_s=60), (effects(ledger), consumer.output()[-3000:])
    assert consumer.stop() == 0
    assert "was refused (returned)" in consumer.output()
    done = effects(ledger)
    assert all(n == 1 for n in done.values()), done
    parked = broker.drain(jobs_vhost, PARKING)
    parked_ids = {str(json.loads(p["body"])["id"]) for p in parked}
    assert set(done) | parked_ids == set(ids) and not set(done) & parked_ids
    assert {p["headers"]["rmqkit-park-reason"] for p in parked} <= {"delivery_limit"}


_FULL_JITTER_WORKER = """
import dataclasses, random, sys
from rmqkit.consumer.config import ConsumerFlags, build_config, policy_from_topology
from rmqkit.consumer.worker import run_worker
from rmqkit.settings import load_settings
from rmqkit.topology import load_topology

random.seed(7)  # the draws of decide(): the same run every time
topology = load_topology(sys.argv[1])
policy = dataclasses.replace(policy_from_topology(topology, "fj.work", None), full_jitter=True)
config = build_config("tests.handlers:handle", "fj.work", policy, ConsumerFlags(), topology)
sys.exit(run_worker(load_settings(), config))
"""

# One 1 s tier whose five slot queues spread over (0, 1 s] (10 ms, 257 ms, 505 ms, 752 ms, 1 s):
# the layout full jitter wants (jitter 1.0 once the topology accepts it; 0.99 is the closest).
_FULL_JITTER_TOPOLOGY = """
[queues."fj.work"]
retry_delays = ["1s"]
max_attempts = 3
jitter = 0.99
jitter_slots = 5
"""


@pytest.mark.timing  # how the ledger's attempt times spread
def test_full_jitter_spreads_retries_over_zero_to_the_delay(
    fresh_vhost: Callable[[], str], tmp_path: Path
) -> None:
    """Issue 15: with full jitter a retry of a 1 s tier waits uniformly over [0, 1 s] (seed 001),
    give or take the gap between two slot TTLs (a copy expires at the head of its slot only):
    the broker expires each copy at its drawn per-message TTL. A consumer worker run with a
    full-jitter policy (the topology switch is the lead's to wire)."""
    import subprocess
    import sys

    from rmqkit.topology import declare_topology, load_topology

    vhost = fresh_vhost()
    topology_file = tmp_path / "fj.toml"
    topology_file.write_text(_FULL_JITTER_TOPOLOGY)
    broker.run(declare_topology(broker.settings_for(vhost), load_topology(topology_file)))
    ids = [uuid.uuid4().hex for _ in range(100)]
    broker.publish_with_ids(vhost, "", "fj.work", [(m, body(id=m, fail=1)) for m in ids])
    ledger = tmp_path / "ledger.db"
    env = broker.cli_env(vhost)
    env["RMQKIT_TEST_LEDGER"] = str(ledger)
    root = Path(__file__).resolve().parents[2]
    log = (tmp_path / "worker.log").open("w")
    worker = subprocess.Popen(
        [sys.executable, "-c", _FULL_JITTER_WORKER, str(topology_file)],
        cwd=root,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        assert wait_until(lambda: set(effects(ledger)) == set(ids), timeout_s=30), (
            tmp_path / "worker.log"
        ).read_text()
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
        log.close()
    names = broker.queue_names(vhost)
    assert broker.depths(vhost, names) == dict.fromkeys(names, 0)
    # wait = when attempt 2 started - when the consumer decided on the retry (failed_at)
    failed_at = {m: t for m, a, kind, t in events(ledger) if kind == "failed_at" and a == 2}
    started = {m: t for m, a, kind, t in events(ledger) if kind == "attempt" and a == 2}
    waits = sorted(started[m] - failed_at[m] for m in ids)
    assert len(waits) == 100 and all(e == 1 for e in effects(ledger).values())
    assert waits[-1] <= 1.0 + 0.3, waits  # never longer than the tier (plus scheduling)
    # Uniform over [0, 1 s]: a quarter drew <= 257 ms and waits at most that slot's TTL.
    assert sum(w < 0.35 for w in waits) >= 15, waits
    assert sum(w > 0.75 for w in waits) >= 10, waits  # and the top of the range is used too

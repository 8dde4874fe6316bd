"""Consumer faults against the real broker: kill -9, a message that kills its process, a
connection closed by force, and the broker app stopped and started under the consumer."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from rmqkit.consumer.supervisor import RESTART_BASE_S, RESTART_CAP_S, STABLE_AFTER_S
from tests import broker
from tests.consumer_harness import JOBS, ConsumerProcess, effects, events, wait_until
from tests.handlers import body
from tests.supervision import SessionConsumer, alive

WORK, PARKING = "jobs.work", "jobs.work.parking"


def _publish(vhost: str, n: int, **fields: object) -> list[str]:
    ids = [uuid.uuid4().hex for _ in range(n)]
    broker.publish_with_ids(vhost, "jobs", "job", [(m, body(id=m, **fields)) for m in ids])
    return ids


def _settled(vhost: str) -> bool:
    counts = broker.depths(vhost, broker.queue_names(vhost) - {PARKING})
    return all(v == 0 for v in counts.values())


@pytest.mark.timing
def test_kill_9_of_a_worker_mid_batch_loses_nothing(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    ids = _publish(jobs_vhost, 2000, sleep=0.05)  # ~800/s with two workers: the kill lands mid-run
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(jobs_vhost, ledger, "--processes", "2", "--prefetch", "20")
    consumers.append(consumer)
    assert wait_until(lambda: len(effects(ledger)) >= 300, timeout_s=30), consumer.output()
    victim = consumer.workers()[0]
    killed_at = time.time()
    os.kill(victim, signal.SIGKILL)
    done_at_kill = len(effects(ledger))
    assert wait_until(lambda: set(effects(ledger)) >= set(ids), timeout_s=90), consumer.output()
    assert wait_until(lambda: _settled(jobs_vhost), timeout_s=10)
    assert wait_until(lambda: len(consumer.workers()) == 2, timeout_s=10)  # replaced
    assert consumer.stop() == 0
    done = effects(ledger)
    duplicates = {m: n for m, n in done.items() if n > 1}
    # Duplicates only among what the killed worker held: at most its prefetch window, each one
    # applied before the kill (by the victim, never acked) and again after it (redelivered).
    assert len(duplicates) <= 20, duplicates
    applied = [(m, t) for m, _, kind, t in events(ledger) if kind == "effect" and m in duplicates]
    for mid in duplicates:
        times = sorted(t for m, t in applied if m == mid)
        assert times[0] < killed_at + 0.05 and times[-1] > killed_at, (mid, times, killed_at)
    assert broker.depths(jobs_vhost, [PARKING])[PARKING] == 0
    assert done_at_kill < len(ids) - 500, done_at_kill  # the kill landed mid-work


def test_a_message_that_kills_its_worker_is_parked_by_the_delivery_limit(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    good = _publish(jobs_vhost, 300)
    [poison] = _publish(jobs_vhost, 1, crash=True)
    good += _publish(jobs_vhost, 300)
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(jobs_vhost, ledger, "--processes", "2")
    consumers.append(consumer)
    assert wait_until(lambda: set(effects(ledger)) >= set(good), timeout_s=60), (
        consumer.output()[-3000:],
        len(set(good) - set(effects(ledger))),
        broker.depths(jobs_vhost, [WORK, PARKING]),
        [
            (m["message_id"] == poison, m["headers"].get("x-death", [{}])[0].get("reason"))
            for m in broker.drain(jobs_vhost, PARKING)
        ][:10],
    )
    assert wait_until(lambda: broker.depths(jobs_vhost, [PARKING])[PARKING] == 1, timeout_s=60), (
        consumer.output()
    )
    assert wait_until(lambda: len(consumer.workers()) == 2, timeout_s=10)
    assert _settled(jobs_vhost)
    assert consumer.stop() == 0
    [parked] = broker.drain(jobs_vhost, PARKING)
    assert parked["message_id"] == poison
    deaths = parked["headers"]["x-death"]
    assert deaths[0]["reason"] == "delivery_limit" and deaths[0]["queue"] == WORK
    crashes = sum(1 for m, _, kind, _ in events(ledger) if m == poison and kind == "attempt")
    assert crashes >= 3  # delivery_limit = 3 in jobs.toml
    # Duplicates only among what a crashing worker held: its first crash takes its prefetch
    # window (50) with it; restarted workers are cautious (prefetch 1), so later crashes cost
    # only the poison's own attempts.
    duplicates = [m for m, n in effects(ledger).items() if n > 1]
    assert len(duplicates) <= 50 * 2, len(duplicates)
    _assert_restart_backoff(consumer.output(), crashes)


def _assert_restart_backoff(output: str, crashes: int) -> None:
    """Each worker slot restarts after RESTART_BASE_S, doubling while it keeps dying young."""
    deaths = [
        (int(slot), float(lived), float(delay))
        for slot, lived, delay in re.findall(
            r"worker (\d+) died \(exit -?\d+\) after ([\d.]+)s; restarting in ([\d.]+)s", output
        )
    ]
    assert len(deaths) >= crashes, output[-3000:]
    previous: dict[int, float] = {}
    for slot, lived, delay in deaths:
        young = min(RESTART_CAP_S, previous[slot] * 2) if slot in previous else RESTART_BASE_S
        if abs(lived - STABLE_AFTER_S) < 0.1:  # the log rounds: either side of the line
            allowed = {young, RESTART_BASE_S}
        else:
            allowed = {young if lived < STABLE_AFTER_S else RESTART_BASE_S}
        assert any(abs(delay - x) < 0.051 for x in allowed), (slot, lived, delay, deaths)
        previous[slot] = delay


def _close_connections(vhost: str) -> int:
    closed = 0
    for conn in broker.api("GET", f"/vhosts/{broker.q(vhost)}/connections").json():
        broker.api(
            "DELETE",
            f"/connections/{broker.q(conn['name'])}",
            headers={"X-Reason": "test: forced close"},
        )
        closed += 1
    return closed


def test_forced_connection_close_recovers_by_itself(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    ids = _publish(jobs_vhost, 1500, sleep=0.01)
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(jobs_vhost, ledger, "--prefetch", "20")
    consumers.append(consumer)
    assert wait_until(lambda: len(effects(ledger)) >= 200, timeout_s=30), consumer.output()
    assert wait_until(lambda: _close_connections(jobs_vhost) > 0, timeout_s=10)
    assert wait_until(lambda: set(effects(ledger)) >= set(ids), timeout_s=60), consumer.output()
    assert wait_until(lambda: _settled(jobs_vhost), timeout_s=10)
    output = consumer.output()
    assert "connection lost" in output and "reconnecting" in output
    assert "died" not in output  # recovered in-process, not by a supervisor restart
    # Cautious after the abnormal close (prefetch 1), then back to the configured prefetch
    # once a few more messages settled — as the broker sees the consumer, since basic.qos
    # only applies to consumers started after it.
    more = _publish(jobs_vhost, 50)
    assert wait_until(lambda: set(effects(ledger)) >= set(more), timeout_s=30)
    assert wait_until(lambda: "left cautious mode" in consumer.output(), timeout_s=30)

    def prefetch() -> set[int]:
        rows = broker.api("GET", f"/consumers/{broker.q(jobs_vhost)}").json()
        return {int(r["prefetch_count"]) for r in rows}

    assert wait_until(lambda: prefetch() == {20}, timeout_s=15), prefetch()
    assert consumer.stop() == 0
    assert sum(1 for n in effects(ledger).values() if n > 1) <= 20


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, timeout=120)


@pytest.mark.skipif(
    os.environ.get("RMQKIT_TEST_NO_BROKER_RESTART") == "1", reason="broker restarts disabled"
)
def test_broker_stop_app_start_app_during_consumption(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    ids = _publish(jobs_vhost, 1500, sleep=0.01)
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(jobs_vhost, ledger, "--prefetch", "20")
    consumers.append(consumer)
    assert wait_until(lambda: len(effects(ledger)) >= 200, timeout_s=30), consumer.output()
    try:
        _rabbitmqctl("stop_app")
        time.sleep(2)
    finally:
        _rabbitmqctl("start_app")
        _rabbitmqctl("await_startup")
    assert wait_until(lambda: set(effects(ledger)) >= set(ids), timeout_s=120), consumer.output()
    assert wait_until(lambda: _settled(jobs_vhost), timeout_s=20)
    assert "died" not in consumer.output()
    assert consumer.stop() == 0
    assert sum(1 for n in effects(ledger).values() if n > 1) <= 20


@pytest.mark.parametrize("target", ["supervisor", "group"])
def test_workers_stop_when_their_supervisor_is_killed(
    jobs_vhost: str, tmp_path: Path, target: str
) -> None:
    """`setsid rmqkit consume …`, then kill -9 of the supervisor alone (or of its process
    group): its workers (in process groups of their own) notice, drain and exit within their
    grace, and stop consuming — messages published afterwards stay in the queue."""
    log = tmp_path / "consume.log"
    consumer = SessionConsumer(
        jobs_vhost,
        log,
        "tests.handlers:handle",
        "--processes",
        "2",
        "--grace",
        f"{GRACE_S:g}s",
        queue=WORK,
        topology=JOBS,
    )
    ledger = log.with_suffix(".db")
    try:
        ids = _publish(jobs_vhost, 20)
        assert wait_until(lambda: set(effects(ledger)) >= set(ids), 30), consumer.output()
        assert wait_until(lambda: len(consumer.workers()) == 2, 10), consumer.output()
        workers = consumer.workers()
        if target == "supervisor":
            os.kill(consumer.proc.pid, signal.SIGKILL)
        else:
            os.killpg(consumer.proc.pid, signal.SIGKILL)
        consumer.proc.wait(timeout=10)
        # gone within the grace and a margin for a loaded machine (nothing was in flight)
        assert wait_until(lambda: not any(alive(p) for p in workers), GRACE_S + 15), (
            [p for p in workers if alive(p)],
            consumer.output(),
        )
        assert "the supervisor (pid" in consumer.output()
        # nobody consumes any more: what is published now stays in the queue
        assert wait_until(lambda: not _consumers_on(jobs_vhost, WORK), 15)
        late = _publish(jobs_vhost, 10)
        time.sleep(1.0)
        assert broker.depths(jobs_vhost, [WORK])[WORK] == len(late)
        assert not set(effects(ledger)) & set(late)
    finally:
        consumer.close()


GRACE_S = 3.0


def _consumers_on(vhost: str, queue: str) -> int:
    rows = broker.api("GET", f"/consumers/{broker.q(vhost)}").json()
    return sum(1 for r in rows if r.get("queue", {}).get("name") == queue)

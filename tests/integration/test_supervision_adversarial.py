"""Consumer supervision, one variant further than the plain cases (an on-call engineer's
mistakes): the work queue itself deleted while its lanes remain; a lane deleted and declared
again with other arguments; the supervisor killed -9 while a handler has a message in hand
(within and past the grace); the supervisor stopped (SIGSTOP), then killed.

The plain cases: tests/integration/test_lanes.py (a lane deleted and declared again) and
tests/faults/test_consumer_faults.py (kill -9 of the supervisor alone and of its group).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests import broker
from tests.consumer_harness import JOBS, ConsumerProcess, effects, events, wait_until
from tests.flow_handlers import read_rows
from tests.handlers import body
from tests.ports import free_port
from tests.supervision import (
    CLIPS,
    LARGE,
    SERVED,
    SLOW,
    TWO_LANES,
    SessionConsumer,
    alive,
    consumer_count,
    declare_two_lanes,
    delete_queue,
    jobs,
    readyz,
)

WORK = "jobs.work"


def _lanes_consumer(vhost: str, tmp_path: Path, port: int) -> ConsumerProcess:
    consumer = ConsumerProcess(
        vhost,
        tmp_path / "ledger.db",
        "--metrics-port",
        str(port),
        handler="tests.flow_handlers:timed",
        queue=CLIPS,
        topology=TWO_LANES,
    )
    assert broker.wait_for(
        lambda: all(consumer_count(vhost, q) == 1 for q in SERVED), timeout_s=20
    ), consumer.output()
    return consumer


def _depth(vhost: str, queue: str) -> int | None:
    return broker.depths(vhost, [queue])[queue]


def test_deleting_the_work_queue_itself_leaves_its_lanes_consumed(
    fresh_vhost: Callable[[], str], tmp_path: Path
) -> None:
    vhost = fresh_vhost()
    declare_two_lanes(vhost)
    port = free_port()
    consumer = _lanes_consumer(vhost, tmp_path, port)
    out = tmp_path / "ledger.db.jsonl"
    try:
        delete_queue(vhost, CLIPS)
        assert wait_until(lambda: f"queue {CLIPS!r} does not exist" in readyz(port)[1], 15), (
            readyz(port),
            consumer.output(),
        )
        assert readyz(port)[0] == 503
        broker.publish_with_ids(vhost, "", SLOW, jobs("slow", 3))
        broker.publish_with_ids(vhost, "", LARGE, jobs("large", 3))
        assert wait_until(lambda: len(read_rows(out)) == 6, 20), consumer.output()
        assert consumer.proc.poll() is None
        declare_two_lanes(vhost)  # the binding from the exchange comes back with it
        broker.publish_with_ids(vhost, "clips", "job", jobs("main", 4))
        assert wait_until(lambda: len(read_rows(out)) == 10, 30), consumer.output()
        assert wait_until(lambda: readyz(port)[0] == 200, 15), readyz(port)
        assert all(v == 0 for v in broker.depths(vhost, list(SERVED)).values())
    finally:
        assert consumer.stop() == 0, consumer.output()


def test_a_lane_declared_again_with_other_arguments_is_not_consumed_and_said_so(
    fresh_vhost: Callable[[], str], tmp_path: Path
) -> None:
    """A quorum lane (delivery limit, dead-lettering into parking) deleted, and declared again
    by hand as a plain classic queue: consuming it would drop the crash-loop net and the
    dead-letter route without a word. The consumer leaves it alone and names the difference,
    until the queue is declared as the topology says."""
    vhost = fresh_vhost()
    declare_two_lanes(vhost)
    port = free_port()
    consumer = _lanes_consumer(vhost, tmp_path, port)
    out = tmp_path / "ledger.db.jsonl"
    try:
        time.sleep(1.0)  # the consumer reads what the lane is declared as, in the background
        delete_queue(vhost, LARGE)
        assert wait_until(lambda: f"queue {LARGE!r} does not exist" in readyz(port)[1], 15)
        put = broker.api(
            "PUT",
            f"/queues/{broker.q(vhost)}/{broker.q(LARGE)}",
            json={"durable": True, "auto_delete": False, "arguments": {}},
        )
        assert put.status_code in (201, 204), put.text
        broker.publish_with_ids(vhost, "", LARGE, jobs("large", 3))
        assert wait_until(lambda: "other settings" in readyz(port)[1], 20), (
            readyz(port),
            consumer.output(),
        )
        status, text = readyz(port)
        assert status == 503 and LARGE in text and "x-queue-type quorum" in text, text
        assert "declared with other settings" in consumer.output()
        time.sleep(3.0)  # a few re-checks: still not consumed
        assert _depth(vhost, LARGE) == 3
        assert read_rows(out) == []
        # the other queues are consumed all along
        broker.publish_with_ids(vhost, "", SLOW, jobs("slow", 2))
        assert wait_until(lambda: len(read_rows(out)) == 2, 20), consumer.output()
        # put back as the topology says: consumed again
        delete_queue(vhost, LARGE)
        declare_two_lanes(vhost)
        broker.publish_with_ids(vhost, "", LARGE, jobs("large", 2))
        assert wait_until(lambda: len(read_rows(out)) == 4, 30), consumer.output()
        assert wait_until(lambda: readyz(port)[0] == 200, 15), readyz(port)
    finally:
        assert consumer.stop() == 0, consumer.output()


@pytest.fixture
def session_consumers() -> Iterator[list[SessionConsumer]]:
    started: list[SessionConsumer] = []
    yield started
    for consumer in started:
        consumer.close()


def _start(
    vhost: str, tmp_path: Path, grace: str, started: list[SessionConsumer]
) -> SessionConsumer:
    consumer = SessionConsumer(
        vhost,
        tmp_path / "consume.log",
        "tests.handlers:handle",
        "--grace",
        grace,
        "--prefetch",
        "5",
        queue=WORK,
        topology=JOBS,
    )
    started.append(consumer)
    assert wait_until(lambda: len(consumer.workers()) == 1, 15), consumer.output()
    return consumer


def _publish(vhost: str, n: int, **fields: object) -> list[str]:
    ids = [uuid.uuid4().hex for _ in range(n)]
    broker.publish_with_ids(vhost, "jobs", "job", [(m, body(id=m, **fields)) for m in ids])
    return ids


def _attempted(ledger: Path, message_id: str) -> bool:
    return any(m == message_id and kind == "attempt" for m, _, kind, _ in events(ledger))


def test_supervisor_killed_mid_handler_the_message_is_finished_and_acked(
    jobs_vhost: str, tmp_path: Path, session_consumers: list[SessionConsumer]
) -> None:
    consumer = _start(jobs_vhost, tmp_path, "15s", session_consumers)
    ledger = tmp_path / "consume.db"
    [worker] = consumer.workers()
    [mid] = _publish(jobs_vhost, 1, sleep=2.0)
    assert wait_until(lambda: _attempted(ledger, mid), 15), consumer.output()
    os.kill(consumer.proc.pid, signal.SIGKILL)
    assert wait_until(lambda: not alive(worker), 30), consumer.output()
    # the handler finished within the grace, and its message was acked: applied once, gone
    assert effects(ledger)[mid] == 1
    # acked before the worker's connection closed: nothing comes back to the queue (an unacked
    # message would be requeued at once when the connection went)
    time.sleep(1.0)
    assert _depth(jobs_vhost, WORK) == 0


def test_supervisor_killed_past_the_grace_the_message_goes_back_to_the_queue(
    jobs_vhost: str, tmp_path: Path, session_consumers: list[SessionConsumer]
) -> None:
    consumer = _start(jobs_vhost, tmp_path, "1s", session_consumers)
    ledger = tmp_path / "consume.db"
    [worker] = consumer.workers()
    [mid] = _publish(jobs_vhost, 1, sleep=30.0)
    assert wait_until(lambda: _attempted(ledger, mid), 15), consumer.output()
    os.kill(consumer.proc.pid, signal.SIGKILL)
    assert wait_until(lambda: not alive(worker), 20), consumer.output()
    # not finished, not acked: back in the queue for the next consumer (never lost)
    assert wait_until(lambda: _depth(jobs_vhost, WORK) == 1, 10), consumer.output()
    assert effects(ledger)[mid] == 0
    assert "grace period over" in consumer.output()


def test_a_stopped_supervisor_keeps_its_workers_and_killing_it_stops_them(
    jobs_vhost: str, tmp_path: Path, session_consumers: list[SessionConsumer]
) -> None:
    """SIGSTOP is not death: a supervisor stopped (a debugger, a paused job) keeps its workers
    consuming; killed while stopped, it is gone, and so are they."""
    consumer = _start(jobs_vhost, tmp_path, "5s", session_consumers)
    ledger = tmp_path / "consume.db"
    [worker] = consumer.workers()
    os.kill(consumer.proc.pid, signal.SIGSTOP)
    try:
        ids = _publish(jobs_vhost, 5)
        assert wait_until(lambda: set(effects(ledger)) >= set(ids), 20), consumer.output()
        assert alive(worker)
    finally:
        os.kill(consumer.proc.pid, signal.SIGKILL)
    assert wait_until(lambda: not alive(worker), 20), consumer.output()
    late = _publish(jobs_vhost, 3)
    time.sleep(1.0)
    assert _depth(jobs_vhost, WORK) == len(late)

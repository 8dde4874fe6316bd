"""Crash loops show in the consumer's log and in the parking views (issue 14, finding 3).

A handler that kills its worker never records a failure, so ``attempts`` stays 1; the broker's
delivery count is what rises. The consumer logs each redelivery with its count, the copies it
parks carry it (``rmqkit-delivered``), and ``parking list``/``show`` show ``delivered``: for a
message the broker's delivery limit parked, the work queue's limit + 1 (jobs.toml: limit 3)."""

from __future__ import annotations

import json
import os
import signal
import uuid
from pathlib import Path

import pytest

from tests import broker
from tests.consumer_harness import ConsumerProcess, events, wait_until
from tests.handlers import body

pytestmark = pytest.mark.semantics("4.3")

PARKING = "jobs.work.parking"
LIMIT = 3  # delivery_limit of jobs.work in tests/topologies/jobs.toml


def _starts(ledger: Path, mid: str) -> int:
    return sum(1 for m, _, kind, _ in events(ledger) if m == mid and kind == "attempt")


def _parked(vhost: str) -> dict[str, dict[str, object]]:
    listed = broker.cli_json_lines("parking", "list", PARKING, "--json", vhost=vhost)
    return {str(m["message_id"]): m for m in listed}


def test_a_message_whose_worker_is_killed_twice_is_parked_with_its_delivery_count(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    mid = uuid.uuid4().hex
    broker.publish_with_ids(
        jobs_vhost, "jobs", "job", [(mid, body(id=mid, sleep=2, permanent=True))]
    )
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(jobs_vhost, ledger)
    consumers.append(consumer)
    for started in (1, 2):  # kill -9 the worker while it handles the message, twice
        assert wait_until(lambda n=started: _starts(ledger, mid) >= n, timeout_s=30)
        (worker,) = consumer.workers()
        os.kill(worker, signal.SIGKILL)
    assert wait_until(lambda: broker.depths(jobs_vhost, [PARKING])[PARKING] == 1, timeout_s=30), (
        consumer.output()
    )
    assert consumer.stop() == 0, consumer.output()
    assert _starts(ledger, mid) == 3

    log = consumer.output()
    assert "redelivered (delivery 2)" in log and "redelivered (delivery 3)" in log, log
    assert (
        "redelivered (delivery 2): an earlier delivery of this message did not finish (a worker "
        "crash or kill, a lost connection, a stop past the grace, or a peek with the management "
        "UI's Get messages, which spends a delivery too); the queue's delivery limit parks it "
        "if this repeats"
    ) in log, log
    assert "(prefetch 1, cautious after a worker crash, restarted by the supervisor; hooks" in log
    (parked_line,) = [line for line in log.splitlines() if "parked in" in line]
    assert f"message_id={mid} attempt=1 delivered=3 " in parked_line, parked_line

    shown = _parked(jobs_vhost)[mid]
    assert (shown["reason"], shown["attempts"], shown["delivered"]) == ("permanent", 1, 3)
    show = broker.cli("parking", "show", PARKING, mid, vhost=jobs_vhost)
    assert json.loads(show.stdout)["delivered"] == 3, show.stdout + show.stderr
    # what the broker holds: the parked copy carries the count
    (held,) = broker.drain(jobs_vhost, PARKING)
    assert held["headers"]["rmqkit-delivered"] == 3


def test_a_crash_looping_message_parked_by_the_delivery_limit_shows_limit_plus_one(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    crash, ok = uuid.uuid4().hex, uuid.uuid4().hex
    broker.publish_with_ids(jobs_vhost, "jobs", "job", [(crash, body(id=crash, crash=True))])
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(jobs_vhost, ledger)
    consumers.append(consumer)
    assert wait_until(lambda: broker.depths(jobs_vhost, [PARKING])[PARKING] == 1, timeout_s=60), (
        consumer.output()
    )
    # a message parked by rmqkit beside it: delivered 1
    broker.publish_with_ids(jobs_vhost, "jobs", "job", [(ok, body(id=ok, permanent=True))])
    assert wait_until(lambda: broker.depths(jobs_vhost, [PARKING])[PARKING] == 2, timeout_s=30)
    assert consumer.stop() == 0, consumer.output()
    assert _starts(ledger, crash) == LIMIT + 1  # every delivery started, and killed, a worker

    log = consumer.output()
    for n in range(2, LIMIT + 2):
        assert f"redelivered (delivery {n})" in log, log
    assert log.count("died (exit 1)") == LIMIT + 1, log

    parked = _parked(jobs_vhost)
    assert (parked[crash]["reason"], parked[crash]["attempts"]) == ("delivery_limit", 1)
    assert parked[crash]["delivered"] == LIMIT + 1
    assert (parked[ok]["reason"], parked[ok]["delivered"]) == ("permanent", 1)
    tsv = broker.cli("parking", "list", PARKING, vhost=jobs_vhost)
    header, *rows = tsv.stdout.splitlines()
    column = header.split("\t").index("delivered")
    by_id = {row.split("\t")[0]: row.split("\t") for row in rows}
    assert by_id[crash][column] == str(LIMIT + 1) and by_id[ok][column] == "1", tsv.stdout
    show = broker.cli("parking", "show", PARKING, crash, vhost=jobs_vhost)
    assert json.loads(show.stdout)["delivered"] == LIMIT + 1, show.stdout + show.stderr
    assert broker.depths(jobs_vhost, [PARKING, "jobs.work"]) == {PARKING: 2, "jobs.work": 0}


def test_a_lost_connection_is_no_crash_in_the_log(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    """After the broker closes the consumer's connection (as a restart does) the consumer
    comes back cautious, and says why by what it knows: a lost connection, not a crash."""
    consumer = ConsumerProcess(jobs_vhost, tmp_path / "ledger.db")
    consumers.append(consumer)
    assert wait_until(lambda: "consuming jobs.work" in consumer.output(), timeout_s=30)

    def connections() -> list[str]:
        rows = broker.api("GET", f"/vhosts/{broker.q(jobs_vhost)}/connections").json()
        return [str(r["name"]) for r in rows]

    assert broker.wait_for(connections, timeout_s=15), "the management API lists no connection"
    for name in connections():
        broker.api("DELETE", f"/connections/{broker.q(name)}")
    assert wait_until(lambda: consumer.output().count("consuming jobs.work") >= 2, timeout_s=30)
    mid = uuid.uuid4().hex
    broker.publish_with_ids(jobs_vhost, "jobs", "job", [(mid, body(id=mid))])
    assert wait_until(lambda: broker.depths(jobs_vhost, ["jobs.work"])["jobs.work"] == 0, 30)
    assert consumer.stop() == 0, consumer.output()
    log = consumer.output()
    assert (
        "(prefetch 1, cautious after a lost connection: messages unacked on it come back "
        "redelivered; hooks"
    ) in log, log
    assert "crash" not in log, log
    assert broker.depths(jobs_vhost, [PARKING]) == {PARKING: 0}

"""The consumer's log tells the on-call engineer why (issue 14): every retry and park line
carries the error's type and message, so nobody has to open the message to see the cause."""

from __future__ import annotations

import json
import os
import re
import signal
import uuid
from pathlib import Path

from tests import broker
from tests.consumer_harness import ConsumerProcess, effects, wait_until
from tests.handlers import body

PARKING = "jobs.work.parking"


def test_retry_and_park_lines_name_the_error_type_and_message(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    transient, permanent = uuid.uuid4().hex, uuid.uuid4().hex
    broker.publish_with_ids(
        jobs_vhost,
        "jobs",
        "job",
        [(transient, body(id=transient, fail=1)), (permanent, body(id=permanent, permanent=True))],
    )
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(jobs_vhost, ledger)
    consumers.append(consumer)
    assert wait_until(lambda: transient in effects(ledger), timeout_s=30), consumer.output()
    assert wait_until(lambda: broker.depths(jobs_vhost, [PARKING])[PARKING] == 1, timeout_s=20)
    assert consumer.stop() == 0, consumer.output()
    log = consumer.output()

    retry = [line for line in log.splitlines() if "retry via" in line and transient in line]
    assert len(retry) == 1, log[-3000:]
    assert re.search(
        r"retry via jobs\.work\.wait\S*: ConnectionError: downstream timed out on attempt 1",
        retry[0],
    ), retry[0]
    parked = [line for line in log.splitlines() if "parked in" in line and permanent in line]
    assert len(parked) == 1, log[-3000:]
    assert (
        f"parked in {PARKING}: permanent (rmqkit.Permanent: job {permanent} is invalid)"
        in parked[0]
    ), parked[0]

    # Public names (issue 14): a message parked by an older version stored the module path;
    # parking views show both under rmqkit.Permanent and every spelling of the filter finds both.
    old = uuid.uuid4().hex
    broker.publish_with_ids(
        jobs_vhost,
        "",
        PARKING,
        [(old, body(id=old))],
        headers=lambda _: {
            "rmqkit-park-reason": "permanent",
            "rmqkit-error-type": "rmqkit.consumer.message.Permanent",
            "rmqkit-error-message": "parked by an older rmqkit",
            "rmqkit-origin-queue": "jobs.work",
        },
    )
    for pattern in ("rmqkit.Permanent", "Permanent", "rmqkit.*"):
        listed = broker.cli_json_lines(
            "parking", "list", PARKING, "--error-type", pattern, "--json", vhost=jobs_vhost
        )
        assert {m["message_id"]: m["error_type"] for m in listed} == {
            permanent: "rmqkit.Permanent",
            old: "rmqkit.Permanent",
        }, (pattern, listed)
    stats = json.loads(broker.cli("parking", "stats", PARKING, "--json", vhost=jobs_vhost).stdout)
    assert stats["by_error_type"] == {"rmqkit.Permanent": 2}, stats

    # the broker holds what the log says: the parked copy is the permanent one, stored under
    # the public name
    held = {m["message_id"]: m["headers"] for m in broker.drain(jobs_vhost, PARKING)}
    assert held.keys() == {permanent, old}
    assert held[permanent]["rmqkit-error-type"] == "rmqkit.Permanent"


def test_parking_stats_check_prints_the_nagios_status_line_first(jobs_vhost: str) -> None:
    """Nagios takes the first line of a plugin's output as its status: `parking stats` with a
    limit must print `PARKING <STATE>: ...` before the counts and tables (issue 14)."""
    ids = [uuid.uuid4().hex for _ in range(3)]
    broker.publish_with_ids(jobs_vhost, "", PARKING, [(i, body(id=i)) for i in ids])
    assert broker.depths(jobs_vhost, [PARKING])[PARKING] == 3
    for limit, code, label in (("2", 2, "CRITICAL"), ("100", 0, "OK")):
        check = broker.cli("parking", "stats", PARKING, "--max-count", limit, vhost=jobs_vhost)
        assert check.returncode == code, check.stdout + check.stderr
        lines = check.stdout.splitlines()
        assert lines[0].startswith(f"PARKING {label}: "), check.stdout
        assert sum(line.startswith("PARKING ") for line in lines) == 1, check.stdout
    # the check only browsed: the broker still holds all three
    assert broker.depths(jobs_vhost, [PARKING])[PARKING] == 3


ISO_LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR|CRITICAL) "
)


def _worker_restarted(consumer: ConsumerProcess) -> None:
    """Kill the worker (-9) and wait until the supervisor has logged it and restarted one."""
    assert wait_until(lambda: "consuming jobs.work" in consumer.output(), timeout_s=30)
    (worker,) = consumer.workers()
    os.kill(worker, signal.SIGKILL)
    assert wait_until(lambda: consumer.output().count("consuming jobs.work") >= 2, timeout_s=30), (
        consumer.output()
    )


def test_supervisor_and_worker_lines_share_one_timestamp_format(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    """Text: every line of the supervisor (rmqkit.supervisor) and of its worker
    (rmqkit.consumer) starts with ISO 8601 UTC with milliseconds (issue 14: the supervisor
    printed `2026-12-01 19:49:14,486`, the worker `2026-12-01T19:49:14.486Z`)."""
    consumer = ConsumerProcess(jobs_vhost, tmp_path / "text.db")
    consumers.append(consumer)
    _worker_restarted(consumer)
    assert consumer.stop() == 0, consumer.output()
    lines = consumer.output().splitlines()
    by_logger = {name: [line for line in lines if f" {name}: " in line] for name in LOGGERS}
    assert all(by_logger.values()), lines
    assert any("died" in line for line in by_logger["rmqkit.supervisor"]), lines
    bad = [line for line in lines if line.strip() and not ISO_LINE.match(line)]
    assert not bad, bad


def test_json_lines_from_supervisor_and_worker(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    """--log-format json: the supervisor's lines are JSON objects too, with the same ts."""
    consumer = ConsumerProcess(jobs_vhost, tmp_path / "json.db", "--log-format", "json")
    consumers.append(consumer)
    _worker_restarted(consumer)
    assert consumer.stop() == 0, consumer.output()
    records = [json.loads(line) for line in consumer.output().splitlines() if line.strip()]
    assert {r["logger"] for r in records} >= set(LOGGERS), records
    assert any("died" in r["msg"] for r in records if r["logger"] == "rmqkit.supervisor")
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", r["ts"]) for r in records)


LOGGERS = ("rmqkit.supervisor", "rmqkit.consumer")


def _records(log: str) -> list[str]:
    """Log records: a line with a timestamp and the continuation lines (a traceback) after it."""
    records: list[str] = []
    for line in log.splitlines():
        if ISO_LINE.match(line) or not records:
            records.append(line)
        else:
            records[-1] += "\n" + line
    return records


def test_the_handler_traceback_is_logged_once_per_message(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    """Issue 14: the traceback goes with the line of the message's first failure, once: a
    message failing every attempt (4, then parked exhausted) has one traceback in the log, so
    has one that fails once and then succeeds, and one parked as permanent at once."""
    exhausted, flaky, permanent = (uuid.uuid4().hex for _ in range(3))
    broker.publish_with_ids(
        jobs_vhost,
        "jobs",
        "job",
        [
            (exhausted, body(id=exhausted, fail=99)),
            (flaky, body(id=flaky, fail=1)),
            (permanent, body(id=permanent, permanent=True)),
        ],
    )
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(jobs_vhost, ledger)
    consumers.append(consumer)
    assert wait_until(lambda: broker.depths(jobs_vhost, [PARKING])[PARKING] == 2, timeout_s=40), (
        consumer.output()
    )
    assert wait_until(lambda: flaky in effects(ledger), timeout_s=10)
    assert consumer.stop() == 0, consumer.output()
    records = _records(consumer.output())

    def about(mid: str) -> list[str]:
        return [r for r in records if f"message_id={mid}" in r.split("\n", 1)[0]]

    for mid, failures in ((exhausted, 4), (flaky, 1), (permanent, 1)):
        lines = about(mid)
        decided = [r for r in lines if "retry via" in r or "parked in" in r]
        assert len(decided) == failures, lines
        traced = [r for r in lines if "Traceback (most recent call last)" in r]
        assert len(traced) == 1, lines
        assert traced[0] is decided[0]  # with the first failure (attempt 1)
        assert "attempt=1 " in traced[0].split("\n", 1)[0]
    # each traceback is the handler's own, ending in its error
    assert "ConnectionError: downstream timed out on attempt 1" in about(exhausted)[0]
    assert f"Permanent: job {permanent} is invalid" in about(permanent)[0]
    assert consumer.output().count("Traceback (most recent call last)") == 3
    # the broker holds the two parked messages, the last traceback stored with each
    held = {m["message_id"]: m["headers"] for m in broker.drain(jobs_vhost, PARKING)}
    assert held.keys() == {exhausted, permanent}
    assert held[exhausted]["rmqkit-park-reason"] == "exhausted"
    assert "on attempt 4" in held[exhausted]["rmqkit-traceback"]

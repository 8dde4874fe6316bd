"""A full bounded work queue makes its wait queue hold the retries it dead-letters back
(docs/doctor.md: dead-letter-backlog-held; docs/runbooks/queue-backing-up.md).

The wait queues `rmqkit declare` makes dead-letter at-least-once into their work queue; a work
queue with ``max_length`` (overflow reject-publish) refuses them while full, and the broker then
keeps them in the wait queue (``messages_dlx`` in the management API: not ready, not visible
to any consumer) and retries the hop only every few minutes, even once the work queue has room.
Built here for real: ``max_length`` 5, one retry tier of 1 s, and 30 messages that failed once
(their retry copies published into the tier, as the consumer does); then the work queue is
drained, as in the report (the work queue empty, 24 held). On the code before, `status` showed
the wait queue with 0 ready and no backlog, and `doctor` said OK (exit 0).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rmqkit import headers as h
from tests import broker

pytestmark = [pytest.mark.broker, pytest.mark.semantics("4.3")]

WORK = "hb.work"
WAIT = "hb.work.wait.1s"
FAILED = 30
TOPOLOGY = """
[exchanges.hb]
type = "direct"

[queues."hb.work"]
bind = [{ exchange = "hb", routing_key = "hb" }]
retry_delays = ["1s"]
jitter = 0.0
jitter_slots = 1
max_length = 5
"""


def status_json(vhost: str, *args: str) -> dict[str, Any]:
    result = broker.cli("status", "--json", *args, vhost=vhost)
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def row(report: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(q for q in report["queues"] if q["name"] == name)
    return found


@pytest.fixture(scope="module")
def held(vhost: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, int]]:
    """The vhost with the backlog held in the wait queue and the work queue drained; yields
    (vhost, topology file, messages held)."""
    path = tmp_path_factory.mktemp("held") / "hb.toml"
    path.write_text(TOPOLOGY)
    declared = broker.cli("declare", str(path), vhost=vhost)
    assert declared.returncode == 0, declared.stdout + declared.stderr
    # The retry copies of 30 messages that failed once (attempt 1), as the consumer publishes them.
    broker.publish(vhost, "", WAIT, [b'{"n": %d}' % i for i in range(FAILED)], {h.ATTEMPT: 1})
    # After 1 s they expire; the work queue takes ~5 and refuses the rest, which the wait queue
    # then holds (management counts lag ~5 s). Drained twice, a moment apart: a dead letter the
    # broker had not tried yet may still arrive after the first pass; once refused it is held
    # for minutes.
    assert broker.wait_for(
        lambda: (
            (broker.depths(vhost, [WORK])[WORK] or 0) >= 5
            and (broker.mgmt_queue(vhost, WAIT) or {}).get("messages_dlx")
        ),
        timeout_s=30,
    )
    taken = len(broker.drain(vhost, WORK))
    time.sleep(2)
    taken += len(broker.drain(vhost, WORK))  # what got through; the work queue is now empty
    assert 0 < taken < FAILED
    assert broker.depths(vhost, [WORK, WAIT]) == {WORK: 0, WAIT: 0}  # nothing ready anywhere
    yield vhost, path, FAILED - taken


def still_held(vhost: str, count: int) -> int:
    """The fixture's held count less what the broker's dead-letter worker has since retried into
    the work queue (it retries a refused dead letter every few minutes; on a loaded 4.3 node a
    retry fell between the fixture and a later test: 24 held then, 20 held and 4 in it now)."""
    return count - (broker.depths(vhost, [WORK])[WORK] or 0)


def test_status_json_shows_the_backlog_held_in_the_wait_queue(held: tuple[str, Path, int]) -> None:
    vhost, path, count = held
    report = broker.wait_for(
        lambda: (
            (r := status_json(vhost, "--topology", str(path)))
            and row(r, WAIT).get("dead_letter_held") == count
            and r
        ),
        timeout_s=20,
    )
    assert report, f"status never showed {count} held in {WAIT}"
    wait = row(report, WAIT)
    assert wait["ready"] == 0 and wait["dead_letter_held"] == count
    assert wait["dead_letter_held_for"] == [WORK]
    assert WORK in wait["note"] and "max-length 5" in wait["note"], wait["note"]
    assert row(report, WORK)["dead_letter_held"] == 0
    (group,) = [g for g in report["groups"] if g["work"] == WORK]
    assert group["dead_letter_held"] == count
    # without --topology, by the roles inferred from the wiring, the same
    assert row(status_json(vhost), WAIT)["dead_letter_held"] == count


def test_status_table_and_lines_say_where_the_backlog_is(held: tuple[str, Path, int]) -> None:
    vhost, _, count = held
    result = broker.cli("status", vhost=vhost)  # piped: tab-separated lines
    count = still_held(vhost, count)
    assert result.returncode == 0, result.stderr
    lines = [line.split("\t") for line in result.stdout.splitlines()]
    header, body = lines[0], {cells[0]: cells for cells in lines[1:]}
    assert body[WAIT][header.index("held")] == str(count)
    assert body[WAIT][header.index("ready")] == "0"
    # stderr says it in one line per queue, with where it is and why
    (warning,) = [line for line in result.stderr.splitlines() if "held" in line]
    assert WAIT in warning and WORK in warning and str(count) in warning, result.stderr


def test_doctor_warns_with_cause_and_fix(held: tuple[str, Path, int]) -> None:
    vhost, path, count = held
    result = broker.cli("doctor", "--json", "--growth-sample", "0", vhost=vhost)
    count = still_held(vhost, count)
    report = json.loads(result.stdout)
    assert result.returncode == 1, result.stdout + result.stderr  # Nagios: warning
    assert report["status"] == "warning" and report["exit_code"] == 1
    (finding,) = [f for f in report["findings"] if f["check"] == "dead-letter-backlog-held"]
    assert finding["severity"] == "warning" and finding["object"] == WAIT
    evidence, fix = finding["evidence"], finding["fix"]
    assert f"{count} " in evidence and WORK in evidence and "max-length 5" in evidence, evidence
    assert "reject-publish" in evidence and "few minutes" in evidence, evidence
    assert "max_length" in fix and "consumers" in fix, fix
    (check,) = [c for c in report["checks"] if c["id"] == "dead-letter-backlog-held"]
    assert check["status"] == "warning"
    plain = broker.cli("doctor", "--growth-sample", "0", "--topology", str(path), vhost=vhost)
    assert plain.returncode == 1, plain.stdout
    assert plain.stdout.startswith("DOCTOR WARNING"), plain.stdout
    assert "dead-letter-backlog-held" in plain.stdout and WAIT in plain.stdout

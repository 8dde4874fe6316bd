"""One more variant of each: a backlog held on the work queue's own dead-letter path into a
bounded parking queue, and zero delays spelled as an operator might (``"0h"``, ``"00s"``,
``" 0s "``) or wrongly (``"-0s"``, ``"0e3s"``).

Held backlog: an operator bounds the parking queue (an operator policy ``max-length 3``; the
parking queue keeps ``overflow = reject-publish`` from `rmqkit declare`), then 10 messages are
rejected from the work queue. The work queue dead-letters at-least-once, so the parking queue
takes 3 and the broker holds the rest in the *work* queue (``messages_dlx``), where no consumer
and no `rmqkit parking` command sees them. `status` must show them on the work queue, for the
parking queue, and `doctor` must warn with a parking-specific fix (exit 1).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import broker

pytestmark = pytest.mark.broker

WORK = "ha.work"
PARKING = "ha.work.parking"
REJECTED = 10
PARKING_MAX = 3
TOPOLOGY = """
[exchanges.ha]
type = "direct"

[queues."ha.work"]
bind = [{ exchange = "ha", routing_key = "ha" }]
retry_delays = []
max_length = 100
"""


@pytest.fixture(scope="module")
def parked_full(vhost: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """The work queue holding dead letters for a full parking queue; yields how many."""
    path = tmp_path_factory.mktemp("ha") / "ha.toml"
    path.write_text(TOPOLOGY)
    declared = broker.cli("declare", str(path), vhost=vhost)
    assert declared.returncode == 0, declared.stdout + declared.stderr
    # An operator policy bounds parking; rmqkit's own policy (overflow reject-publish) stays.
    response = broker.api(
        "PUT",
        f"/operator-policies/{broker.q(vhost)}/bound-parking",
        json={
            "pattern": f"^{PARKING.replace('.', '[.]')}$",
            "definition": {"max-length": PARKING_MAX},
            "apply-to": "queues",
        },
    )
    assert response.status_code in (201, 204), response.text
    broker.publish(vhost, "ha", "ha", [b'{"n": %d}' % i for i in range(REJECTED)])
    for _ in range(REJECTED):
        assert broker.reject_one(vhost, WORK)  # poison: rejected, dead-lettered to parking
    assert broker.wait_for(
        lambda: (
            (broker.depths(vhost, [PARKING])[PARKING] or 0) >= PARKING_MAX
            and (broker.mgmt_queue(vhost, WORK) or {}).get("messages_dlx")
        ),
        timeout_s=30,
    )
    parked = broker.depths(vhost, [PARKING])[PARKING] or 0
    assert broker.depths(vhost, [WORK])[WORK] == 0  # nothing ready: all of it is held
    yield REJECTED - parked


def _status(vhost: str) -> dict[str, Any]:
    result = broker.cli("status", "--json", vhost=vhost)
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def test_status_shows_the_backlog_held_on_the_work_queue_for_parking(
    vhost: str, parked_full: int
) -> None:
    def work_row() -> dict[str, Any] | None:
        found = next(q for q in _status(vhost)["queues"] if q["name"] == WORK)
        return found if found["dead_letter_held"] == parked_full else None

    row = broker.wait_for(work_row, timeout_s=20)
    assert row, f"status never showed {parked_full} held in {WORK}"
    assert row["ready"] == 0 and row["dead_letter_held_for"] == [PARKING]
    assert f"{PARKING} full" in row["note"] and f"max-length {PARKING_MAX}" in row["note"]


def test_doctor_warns_with_a_parking_fix(vhost: str, parked_full: int) -> None:
    result = broker.cli("doctor", "--json", "--growth-sample", "0", vhost=vhost)
    report = json.loads(result.stdout)
    (finding,) = [f for f in report["findings"] if f["check"] == "dead-letter-backlog-held"]
    assert finding["object"] == WORK and finding["severity"] == "warning"
    assert f"{parked_full} " in finding["evidence"] and PARKING in finding["evidence"]
    assert "rmqkit parking replay|purge" in finding["fix"], finding["fix"]
    assert "length bound" in finding["fix"], finding["fix"]
    assert result.returncode == SEVERITY_CODE[report["status"]] and result.returncode >= 1


SEVERITY_CODE = {"ok": 0, "warning": 1, "critical": 2}

ZERO_VARIANTS = {"hz.h": "0h", "hz.zz": "00s", "hz.sp": " 0s "}


def _zero_file(tmp_path: Path, delays: dict[str, str]) -> Path:
    text = '[exchanges.hz]\ntype = "direct"\n'
    for name, delay in delays.items():
        text += (
            f'\n[queues."{name}"]\nbind = [{{ exchange = "hz", routing_key = "{name}" }}]\n'
            f'retry_delays = []\ndelay = "{delay}"\n'
        )
    path = tmp_path / "hz.toml"
    path.write_text(text)
    return path


def test_zero_spelled_otherwise_declares_and_publishes_without_delay(
    vhost: str, tmp_path: Path
) -> None:
    path = _zero_file(tmp_path, ZERO_VARIANTS)
    declared = broker.cli("declare", str(path), vhost=vhost)
    assert declared.returncode == 0, declared.stdout + declared.stderr
    assert not [n for n in broker.queue_names(vhost) if n.startswith("rmqkit.delay")]
    for name, delay in ZERO_VARIANTS.items():
        for extra in ([], ["--delay", delay]):
            result = broker.cli(
                "publish", "hz", name, "--topology", str(path), "--body", "x", *extra, vhost=vhost
            )
            assert result.returncode == 0, result.stderr
    # every message is in its work queue at once: nothing went through a ladder
    assert broker.depths(vhost, list(ZERO_VARIANTS)) == dict.fromkeys(ZERO_VARIANTS, 2)


@pytest.mark.parametrize(("spelled", "says"), [("-0s", "negative"), ("0e3s", "use a number")])
def test_negative_zero_and_exponents_are_refused_in_one_line(
    vhost: str, tmp_path: Path, spelled: str, says: str
) -> None:
    flag = broker.cli("publish", "hz", "hz.h", "--delay", spelled, "--body", "x", vhost=vhost)
    assert flag.returncode == 64, flag.stderr
    (line,) = [x for x in flag.stderr.splitlines() if x.strip()]
    assert "--delay" in line and says in line, line
    path = _zero_file(tmp_path, {"hz.bad": spelled})
    declared = broker.cli("declare", str(path), vhost=vhost)
    assert declared.returncode == 65, declared.stdout + declared.stderr
    (line,) = [x for x in declared.stderr.splitlines() if x.strip()]
    assert "delay" in line and says in line, line
    assert "hz.bad" not in broker.queue_names(vhost)

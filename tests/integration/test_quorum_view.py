"""Quorum queues' leader and members in `rmqkit status` and `rmqkit doctor` (issue 14: the
node-loss runbook had no way to see them), against the real broker.

On the test broker's single node every quorum queue has one member, that node, which leads; a
classic queue has neither. Losing a majority (and members offline) needs a cluster: the pure
cases are in tests/unit/test_doctor_checks.py over management API JSON as a 3-node cluster
reports it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tests import broker

pytestmark = pytest.mark.broker


def _declare(vhost: str) -> None:
    for name, arguments in (("qq", {"x-queue-type": "quorum"}), ("cq", {})):
        response = broker.api(
            "PUT",
            f"/queues/{broker.q(vhost)}/{name}",
            json={"durable": True, "arguments": arguments},
        )
        assert response.status_code in (201, 204), response.text


def _status_rows(vhost: str) -> dict[str, dict[str, Any]]:
    result = broker.cli("status", "--json", vhost=vhost)
    assert result.returncode == 0, result.stderr
    return {row["name"]: row for row in json.loads(result.stdout)["queues"]}


def test_status_and_doctor_show_the_leader_and_members_of_quorum_queues(
    fresh_vhost: Callable[[], str],
) -> None:
    vhost = fresh_vhost()
    _declare(vhost)
    node = broker.node_name()
    # leader/members are management statistics: they appear with the next stats emission
    rows = broker.wait_for(
        lambda: (found := _status_rows(vhost))["qq"]["members"] and found, timeout_s=20
    )
    qq, cq = rows["qq"], rows["cq"]
    assert qq["leader"] == node and qq["members"] == [node] and qq["online"] == [node]
    assert qq["offline"] == [] and qq["majority"] is True
    assert (cq["leader"], cq["members"], cq["majority"]) == (None, None, None)

    piped = broker.cli("status", vhost=vhost)  # not a terminal: tab-separated lines
    lines = [line.split("\t") for line in piped.stdout.splitlines()]
    header, body = lines[0], {cells[0]: cells for cells in lines[1:]}
    assert header[-2:] == ["leader", "members"]
    assert body["qq"][-2:] == [node, "1/1"]
    assert body["cq"][-2:] == ["-", "-"]
    assert "NO MAJORITY" not in piped.stderr

    doctor = broker.cli("doctor", "--json", "--growth-sample", "0", vhost=vhost)
    report = json.loads(doctor.stdout)
    (check,) = [c for c in report["checks"] if c["id"] == "quorum-members"]
    assert check["status"] == "ok", report  # one node, one member: as meant
    assert not [f for f in report["findings"] if f["check"] == "quorum-members"]

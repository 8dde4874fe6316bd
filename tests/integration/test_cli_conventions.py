"""CLI conventions (issue 14) against the real broker: ``--vhost`` on every command.

``--vhost NAME`` (before or after the command, as rabbitmqadmin v2 takes it) points both the
AMQP connection and the management API at NAME, whatever vhost RMQKIT_URL names. Every command
runs in a subprocess from a neutral directory (PYTHONPATH kept), so exit codes are the real ones.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from rmqkit import headers as h
from rmqkit.settings import with_vhost
from rmqkit.topology import declare_topology, load_topology
from tests import broker
from tests.unit.test_cli_conventions import environment, start

ROOT = Path(__file__).resolve().parent.parent.parent
ORDERS = ROOT / "topologies" / "orders.toml"
WORK = "orders.work"
PARKING = "orders.work.parking"
PARKED = 3


def _parked_headers() -> dict[str, Any]:
    return {
        h.PARK_REASON: "permanent",
        h.ORIGIN_QUEUE: WORK,
        h.ORIGINAL_EXCHANGE: "",
        h.ORIGINAL_ROUTING_KEY: WORK,
        h.ERROR_TYPE: "rmqkit.Permanent",
        h.ERROR_MESSAGE: "no such customer",
        h.ATTEMPT: 1,
        h.LAST_FAILED_AT: h.format_timestamp(datetime.now(UTC)),
    }


@pytest.fixture(scope="module")
def target(vhost: str) -> str:
    """The vhost the commands are pointed at with --vhost: orders.toml declared, PARKED parked."""
    broker.run(declare_topology(broker.settings_for(vhost), load_topology(ORDERS)))
    broker.publish_exact(
        vhost,
        "",
        [(PARKING, uuid.uuid4().hex, b'{"id": 1}', _parked_headers()) for _ in range(PARKED)],
    )
    return vhost


@pytest.fixture(scope="module")
def decoy() -> Any:
    """The vhost RMQKIT_URL names: exists, holds nothing."""
    name = broker.create_vhost("cli-decoy")
    yield name
    broker.delete_vhost(name)


def cli(
    *args: str, vhost: str, stdin: str | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """`rmqkit ARGS` with RMQKIT_URL on ``vhost`` of the broker under test."""
    url = with_vhost(broker.BASE_URL, vhost)
    process = start(
        list(args),
        environment(RMQKIT_URL=url, RMQKIT_MANAGEMENT_URL=broker.MGMT, **env),
        stdin=stdin,
    )
    out, err = process.communicate(stdin, timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def _queue_names(report: dict[str, Any]) -> set[str]:
    return {q["name"] for q in report["queues"]}


def test_vhost_after_the_command_reaches_the_management_api(target: str, decoy: str) -> None:
    shown = cli("status", "--vhost", target, "--json", vhost=decoy)
    assert shown.returncode == 0, shown.stderr
    assert {WORK, PARKING} <= _queue_names(json.loads(shown.stdout))
    plain = cli("status", "--json", vhost=decoy)  # without it: the URL's (empty) vhost
    assert plain.returncode == 0, plain.stderr
    assert WORK not in _queue_names(json.loads(plain.stdout))


def test_vhost_before_or_after_a_parking_command_reaches_amqp(target: str, decoy: str) -> None:
    after = cli("parking", "list", PARKING, "--json", "--vhost", target, vhost=decoy)
    before = cli("--vhost", target, "parking", "list", PARKING, "--json", vhost=decoy)
    for listed in (after, before):
        assert listed.returncode == 0, listed.stderr
        rows = [json.loads(line) for line in listed.stdout.splitlines()]
        assert len(rows) == PARKED and {r["reason"] for r in rows} == {"permanent"}
    assert broker.depths(target, [PARKING])[PARKING] == PARKED  # browsing took none
    missing = cli("parking", "list", PARKING, vhost=decoy)  # not in the URL's vhost
    assert missing.returncode != 0 and PARKING in missing.stderr

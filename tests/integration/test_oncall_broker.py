"""Pointing at the wrong broker, and `status --watch` into a pipe (issue 14's trial).

- `doctor` with a dead AMQP port reported only what the management API showed (a warning about
  max-length): AMQP unreachable is critical (exit 2), since nothing can consume or publish.
- With ``RMQKIT_URL`` on another broker's port and no management URL, `status` showed the
  management API's broker without a word: the AMQP connection and the management API must be
  the same cluster (cluster_name in the AMQP server properties against ``/api/overview``).
- `status --watch` into a pipe wrote nothing until it ended (a redrawn table): one JSON line
  per reading when stdout is not a terminal.

On the code before the fix (19871ec) every test here fails.
"""

from __future__ import annotations

import json
import os
import select
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

import pytest

from rmqkit.settings import with_vhost
from tests import broker

ROOT = Path(__file__).resolve().parents[2]
DEAD_AMQP = "amqp://guest:guest@127.0.0.1:1/"


def _other_broker_url() -> str:
    """The AMQP URL of a broker other than the one under test (4.3 or 4.0, beside it)."""
    for version in ("4.3", "4.0", "3.10"):
        done = subprocess.run(
            [str(ROOT / "scripts" / "broker-up"), "--version", version, "--env"],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if done.returncode != 0:
            continue
        found = dict(
            line.split("=", 1) for line in done.stdout.splitlines() if line.startswith("RMQKIT")
        )
        url = shlex.split(found.get("RMQKIT_TEST_URL", ""))[0] if found else ""
        if url and url.rstrip("/") != broker.BASE_URL.rstrip("/"):
            return url
    pytest.skip("no second broker to point at (scripts/broker-up --version 4.3)")


def test_doctor_with_a_dead_amqp_port_is_critical(vhost: str) -> None:
    result = broker.cli(
        "doctor",
        "--growth-sample",
        "0",
        env={"RMQKIT_URL": with_vhost(DEAD_AMQP, vhost), "RMQKIT_MANAGEMENT_URL": broker.MGMT},
    )
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stdout.splitlines()
    assert lines[0].startswith("DOCTOR CRITICAL"), lines
    (critical,) = [line for line in lines if line.startswith("CRITICAL\tamqp-connection")]
    assert "127.0.0.1:1" in critical and "unreachable" in critical


def test_doctor_and_status_say_when_amqp_and_management_are_two_brokers(vhost: str) -> None:
    other = with_vhost(_other_broker_url(), "/")
    env = {"RMQKIT_URL": other, "RMQKIT_MANAGEMENT_URL": broker.MGMT + "/"}
    doctor = broker.cli("doctor", "--json", "--growth-sample", "0", env=env)
    assert doctor.returncode == 2, (doctor.stdout, doctor.stderr)
    report = json.loads(doctor.stdout)
    (finding,) = [f for f in report["findings"] if f["check"] == "amqp-connection"]
    assert "cluster" in finding["evidence"] and "RMQKIT_MANAGEMENT_URL" in finding["fix"]
    status = broker.cli("status", env=env)
    assert status.returncode == 0, status.stderr
    assert status.stderr.startswith("warning: AMQP at "), status.stderr
    assert "RMQKIT_MANAGEMENT_URL" in status.stderr
    same = broker.cli("doctor", "--json", "--growth-sample", "0", vhost=vhost)
    statuses = {c["id"]: c["status"] for c in json.loads(same.stdout)["checks"]}
    assert statuses["amqp-connection"] == "ok"
    assert broker.cli("status", vhost=vhost).stderr == ""


def _line_within(stream: IO[str], timeout_s: float) -> str:
    """One line of ``stream``, or fail if none comes in ``timeout_s`` (the old code wrote
    nothing until it was stopped)."""
    ready, _, _ = select.select([stream], [], [], timeout_s)
    assert ready, f"no line on stdout within {timeout_s} s"
    return stream.readline()


def test_status_watch_into_a_pipe_writes_a_json_line_per_reading(vhost: str) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "rmqkit", "status", "--watch", "--interval", "500ms"],
        env=broker.cli_env(vhost),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        readings = [json.loads(_line_within(process.stdout, 20.0)) for _ in range(2)]
    finally:
        os.kill(process.pid, signal.SIGINT)
        process.communicate(timeout=30)
    assert [r["vhost"] for r in readings] == [vhost, vhost]
    assert readings[0]["taken_at"] < readings[1]["taken_at"]

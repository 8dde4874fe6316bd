"""Helpers for the consumer-supervision tests (tests/integration/test_lanes.py, the supervisor
kills in tests/faults/test_consumer_faults.py, tests/integration/test_supervision_adversarial.py):
the two-lane topology, deleting a queue under a running consumer, reading ``/readyz``, and
finding a supervisor's workers."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

from rmqkit.topology import load_topology
from rmqkit.topology.apply import declare_topology
from tests import broker
from tests.consumer_harness import ROOT

TWO_LANES = str(ROOT / "tests" / "topologies" / "lanes_two.toml")
CLIPS = "clips.work"
SLOW, LARGE = "clips.work.lane.slow", "clips.work.lane.large"
CLIPS_PARKING = "clips.work.parking"
SERVED = (CLIPS, SLOW, LARGE)


def declare_two_lanes(vhost: str) -> None:
    """Declare lanes_two.toml with the library call `rmqkit declare` makes (same arguments
    every time: the way an operator restores a deleted queue)."""
    broker.run(declare_topology(broker.settings_for(vhost), load_topology(TWO_LANES)))


def delete_queue(vhost: str, name: str) -> None:
    """Delete ``name`` through the management API (as an operator would, by mistake)."""
    response = broker.api("DELETE", f"/queues/{broker.q(vhost)}/{broker.q(name)}")
    assert response.status_code in (200, 204), response.text


def consumer_count(vhost: str, name: str) -> int:
    """Consumers on ``name`` as the management API lists them (0 if it does not exist)."""
    found = broker.mgmt_queue(vhost, name) or {}
    return int(found.get("consumers") or 0)


def readyz(port: int) -> tuple[int, str]:
    """``/readyz`` of the worker serving on ``port``: (status, body); (0, error) if down."""
    try:
        response = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=3)
    except httpx.HTTPError as exc:
        return 0, str(exc)
    return response.status_code, response.text


def jobs(kind: str, count: int, sleep: float = 0.0) -> list[tuple[str, bytes]]:
    """(message_id, body) pairs for tests.flow_handlers:timed."""
    return [
        (
            f"{kind}-{i:03d}-{uuid.uuid4().hex[:6]}",
            json.dumps({"kind": kind, "sleep": sleep, "sent": time.time()}).encode(),
        )
        for i in range(count)
    ]


def children(pid: int) -> list[int]:
    """Live child processes of ``pid`` that are workers (not multiprocessing's tracker)."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
    found = []
    for child in (int(p) for p in out.stdout.split()):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"resource_tracker" not in cmdline:
            found.append(child)
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def kill_quietly(*pids: int) -> None:
    """SIGKILL whichever of ``pids`` still run (test clean-up)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


class SessionConsumer:
    """`rmqkit consume` started as `setsid rmqkit consume …` would be: the supervisor leads a
    session and process group of its own (start_new_session), so a test can kill -9 it alone
    or its whole group, as an operator would."""

    def __init__(self, vhost: str, log: Path, *args: str, queue: str, topology: str) -> None:
        env = broker.cli_env(vhost)
        env["RMQKIT_TEST_LEDGER"] = str(log.with_suffix(".db"))
        cmd = [sys.executable, "-m", "rmqkit", "consume", *args, "--queue", queue]
        cmd += ["--topology", topology]
        self.log_path = log
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.seen_workers: set[int] = set()

    def workers(self) -> list[int]:
        """The supervisor's live workers (remembered: after the supervisor dies they are
        orphans, no longer its children)."""
        found = children(self.proc.pid)
        self.seen_workers.update(found)
        return found

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def close(self) -> None:
        """Leave nothing running: the supervisor's group and every worker seen."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        kill_quietly(self.proc.pid, *self.seen_workers)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        self._log.close()

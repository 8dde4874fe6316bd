"""docs/tutorial.md, run as a new user would: every block in order, in an empty directory, on a
vhost of its own, with what the broker and the service's database end up holding checked.

The doc steers the run with HTML comments before a block (invisible when rendered):

- ``<!-- file: PATH -->``: the next block is written to PATH (the topology, the handler, …);
- ``<!-- background: NAME -->``: the next shell block runs in the background (the consumer)
  until ``<!-- stop: NAME -->``, which sends it SIGTERM and expects exit 0;
- ``<!-- wait: NAME -->`` / ``<!-- check: NAME -->``: WAITS[NAME] runs before the next block
  (the consumer works asynchronously), CHECKS[NAME] after it;
- a ```text block right after a shell block is its expected output: each line, whitespace
  collapsed and ``…`` standing for anything, must match a line of the output, in order; a line
  that is ``…`` alone skips any number of lines.

Each shell block runs under ``bash -euo pipefail``; an ``export NAME=VALUE`` in one holds for
the blocks after it, as in the reader's shell.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests import broker

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "tutorial.md"
TOKEN = re.compile(
    r"^<!-- (?P<kind>file|check|wait|background|stop): (?P<arg>\S+) -->$"
    r"|^```(?P<lang>\w*)\n(?P<body>.*?)^```$",
    re.MULTILINE | re.DOTALL,
)
SHELL = {"shell", "bash"}
WORK, PARKING = "payments.work", "payments.work.parking"


@dataclass
class Step:
    """One block of the doc with what its markers say about it."""

    lang: str
    body: str
    file: str | None = None
    background: str | None = None
    checks: list[str] = field(default_factory=list)
    waits: list[str] = field(default_factory=list)
    expected: str | None = None
    stops: list[str] = field(default_factory=list)  # before this block


def steps() -> tuple[list[Step], list[str]]:
    """The doc's blocks in order, and the background names stopped after the last block."""
    out: list[Step] = []
    pending: dict[str, Any] = {"checks": [], "waits": [], "stops": []}
    for match in TOKEN.finditer(DOC.read_text(encoding="utf-8")):
        kind, arg = match.group("kind"), match.group("arg")
        if kind in ("file", "background"):
            pending[kind] = arg
        elif kind in ("check", "wait", "stop"):
            pending[kind + "s"].append(arg)
        elif (
            match.group("lang") == "text"
            and out
            and out[-1].lang in SHELL
            and not any(pending[k] for k in ("checks", "waits", "stops"))
        ):
            out[-1].expected = match.group("body")
        else:
            out.append(Step(match.group("lang"), match.group("body"), **pending))
            pending = {"checks": [], "waits": [], "stops": []}
    return out, pending["stops"]


def assert_output(expected: str, actual: str, where: str) -> None:
    """Each expected line matches an actual line, in order (see the module docstring)."""
    lines = [" ".join(line.split()) for line in actual.splitlines()]
    position = 0
    for want in expected.splitlines():
        want = " ".join(want.split())
        if want in ("…", ""):
            continue
        pattern = re.compile(".*".join(re.escape(part) for part in want.split("…")))
        while position < len(lines) and not pattern.fullmatch(lines[position]):
            position += 1
        assert position < len(lines), f"{where}: no line {want!r} (in order) in:\n{actual}"
        position += 1


# --- what the broker and the databases hold at each point -------------------------------------


@dataclass
class Run:
    vhost: str
    cwd: Path
    env: dict[str, str]
    logs: dict[str, Path] = field(default_factory=dict)

    def charges(self) -> list[str]:
        with sqlite3.connect(self.cwd / "payments.db") as db:
            return [row[0] for row in db.execute("SELECT payment_id FROM charges ORDER BY 1")]

    def depth(self, queue: str) -> int | None:
        return broker.depths(self.vhost, [queue])[queue]

    def parked(self) -> list[dict[str, Any]]:
        result = subprocess.run(
            [sys.executable, "-m", "rmqkit", "parking", "list", PARKING, "--json"],
            env=self.env,
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]

    def until(self, what: str, condition: Callable[[], bool], timeout_s: float = 30) -> None:
        assert broker.wait_for(condition, timeout_s=timeout_s), f"{what}; consumer log:\n" + (
            self.logs["consumer"].read_text() if "consumer" in self.logs else ""
        )


def check_published(run: Run) -> None:
    # Both requests wait in the work queue, the card number encrypted on the wire.
    assert run.depth(WORK) == 2
    peek = broker.api(
        "POST",
        f"/queues/{broker.q(run.vhost)}/{broker.q(WORK)}/get",
        json={"count": 2, "ackmode": "ack_requeue_true", "encoding": "auto"},
    ).json()
    payloads = " ".join(m["payload"] for m in peek)
    assert [m["properties"]["message_id"] for m in peek] == ["pay-1001", "pay-1002"]
    assert "4111111111111111" not in payloads and "5555555555554444" not in payloads, payloads
    assert run.depth(WORK) == 2


def wait_charged(run: Run) -> None:
    run.until("both payments charged", lambda: len(run.charges()) == 2 and run.depth(WORK) == 0)


def check_duplicate(run: Run) -> None:
    log = run.logs["consumer"]
    run.until(
        "the re-sent pay-1002 acked as a duplicate",
        lambda: "duplicate: already processed" in log.read_text() and run.depth(WORK) == 0,
    )
    assert "message_id=pay-1002" in log.read_text().split("duplicate: already processed")[1]
    assert run.charges() == ["pay-1001", "pay-1002"]  # not charged twice


def wait_parked(run: Run) -> None:
    run.until("three parked", lambda: run.depth(PARKING) == 3 and run.depth(WORK) == 0)
    parked = {m["message_id"]: m for m in run.parked()}
    reasons = sorted(m["reason"] for m in parked.values())
    assert reasons == ["exhausted", "permanent", "undecodable"], parked
    assert parked["pay-1003"]["reason"] == "permanent"
    assert parked["pay-1004"]["reason"] == "exhausted"
    assert parked["pay-1004"]["attempts"] == 3
    assert run.charges() == ["pay-1001", "pay-1002"]


def check_replayed(run: Run) -> None:
    run.until("pay-1004 charged after the replay", lambda: "pay-1004" in run.charges())
    run.until("parking down to two", lambda: run.depth(PARKING) == 2)
    assert sorted(m["reason"] for m in run.parked()) == ["permanent", "undecodable"]


def check_purged(run: Run) -> None:
    assert run.depth(PARKING) == 1
    assert [m["message_id"] for m in run.parked()] == ["pay-1003"]


def check_outbox(run: Run) -> None:
    run.until("pay-2001 charged from the outbox", lambda: "pay-2001" in run.charges())
    with sqlite3.connect(run.cwd / "checkout.db") as db:
        assert db.execute("SELECT id FROM orders").fetchall() == [("2001",)]
        bodies = [row[0] for row in db.execute("SELECT body FROM rmqkit_outbox")]
    assert bodies and not any("4111111111111111" in str(body) for body in bodies), bodies


def check_final(run: Run) -> None:
    assert run.charges() == ["pay-1001", "pay-1002", "pay-1004", "pay-2001"]
    depths = broker.depths(run.vhost, broker.queue_names(run.vhost))
    assert depths.pop(PARKING) == 1, depths
    assert not any(depths.values()), depths  # nothing left waiting or retrying


def check_runbook(run: Run) -> None:
    assert [m["message_id"] for m in run.parked()] == ["pay-1003"]


CHECKS: dict[str, Callable[[Run], None]] = {
    "published": check_published,
    "duplicate": check_duplicate,
    "replayed": check_replayed,
    "purged": check_purged,
    "outbox": check_outbox,
    "final": check_final,
    "runbook": check_runbook,
}
WAITS: dict[str, Callable[[Run], None]] = {"charged": wait_charged, "parked": wait_parked}


def test_the_doc_names_only_known_checks() -> None:
    """A misspelt marker would silently check nothing."""
    blocks, _ = steps()
    names = [c for s in blocks for c in s.checks] + [w for s in blocks for w in s.waits]
    assert set(names) == set(CHECKS) | set(WAITS), names
    assert sum(1 for s in blocks if s.lang in SHELL) >= 15
    assert sum(1 for s in blocks if s.background) == 1


def test_expected_output_is_matched_in_order() -> None:
    actual = "wrote k.json: key k1ab (current)\nApplied: 26 create.\n"
    assert_output("wrote k.json: key … (current)\n…\nApplied: 26 create.", actual, "here")
    for wrong in ("Applied: 26 create.\nwrote k.json: key … (current)", "Applied: 25 create."):
        with pytest.raises(AssertionError, match="no line"):
            assert_output(wrong, actual, "here")


def _stop(process: subprocess.Popen[bytes], name: str, log: Path) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(timeout=45)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise
    assert code == 0, f"{name} exited {code}:\n{log.read_text()}"


def test_the_tutorial_runs_as_written(tmp_path: Path) -> None:
    vhost = broker.create_vhost("tutorial")
    env = broker.cli_env(vhost)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["RMQKIT_NON_INTERACTIVE"] = "1"
    run = Run(vhost, tmp_path, env)
    background: dict[str, subprocess.Popen[bytes]] = {}
    blocks, stops_at_end = steps()
    try:
        for number, step in enumerate(blocks, start=1):
            where = f"docs/tutorial.md block {number} ({step.body.splitlines()[0][:60]!r})"
            for name in step.stops:
                _stop(background.pop(name), name, run.logs[name])
            for name in step.waits:
                WAITS[name](run)
            if step.file is not None:
                target = tmp_path / step.file
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(step.body, encoding="utf-8")
            elif step.lang in SHELL and step.background is not None:
                log = run.logs[step.background] = tmp_path / f"{step.background}.log"
                with log.open("wb") as out:
                    background[step.background] = subprocess.Popen(
                        ["bash", "-c", "exec " + step.body.strip()],
                        cwd=tmp_path,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                run.until(f"{where}: started", lambda log=log: " consuming " in log.read_text())
                if step.expected is not None:
                    assert_output(step.expected, log.read_text(), where)
            elif step.lang in SHELL:
                result = subprocess.run(
                    ["bash", "-euo", "pipefail", "-c", step.body],
                    cwd=tmp_path,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=120,
                    check=False,
                )
                output = result.stdout + result.stderr
                assert result.returncode == 0, f"{where} exited {result.returncode}:\n{output}"
                if step.expected is not None:
                    assert_output(step.expected, output, where)
                for name, value in re.findall(r"^export (\w+)=(\S+)$", step.body, re.M):
                    env[name] = value
            for name in step.checks:
                CHECKS[name](run)
        for name in stops_at_end:
            _stop(background.pop(name), name, run.logs[name])
        assert not background, f"never stopped: {sorted(background)}"
    finally:
        for process in background.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        broker.delete_vhost(vhost)

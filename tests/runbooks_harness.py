"""Run the commands of a runbook in docs/runbooks/ exactly as the Markdown writes them.

A runbook marks each runnable step as a fenced block whose info string is
``console runbook:NAME`` (renderers highlight it as a console session and ignore the rest):

    ```console runbook:triage
    $ rmqkit parking stats --topology topologies/orders.toml --queue orders.work --max-count 20
    (exit 2)
    PARKING CRITICAL
    ```

- A line starting with ``$ `` is a command, run by bash (a trailing ``\\`` continues it on the
  next line). A command ending in `` &`` is started in the background and stopped with SIGTERM
  when the runbook's test ends (e.g. ``rmqkit consume …``).
- The lines after it, up to the next ``$ ``, are excerpts of its output (stdout and stderr
  together): each must appear in it, compared with runs of whitespace collapsed (TSV and aligned
  columns read the same). ``…`` / ``...`` lines are skipped.
- ``(exit N)`` is the exit code the runbook promises (default 0).
- ``(until it shows, up to Ns)`` reruns the command until its excerpts appear (management
  statistics lag up to ~5 s): the runbook says "run it again until …".

Commands run with a test's environment: ``RMQKIT_URL`` / ``RMQKIT_MANAGEMENT_URL`` naming the
test's vhost and whatever placeholders (``$MESSAGE_ID``) the test supplies, in a working directory
that holds the runbook's files (``topologies/orders.toml``, ``myapp/handlers.py``), with
``rmqkit`` on PATH as this interpreter's ``python -m rmqkit``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

RUNBOOKS = Path(__file__).resolve().parent.parent / "docs" / "runbooks"
_BLOCK = re.compile(r"^```console runbook:(?P<name>[\w-]+)[ \t]*\n(?P<body>.*?)^```", re.M | re.S)
_EXIT = re.compile(r"^\(exit (\d+)\)$")
_UNTIL = re.compile(r"^\(until it shows, up to (\d+)s\)$")


@dataclass
class Step:
    """One command of a runbook block and what the runbook says it prints."""

    command: str
    exit_code: int = 0
    expect: list[str] = field(default_factory=list)
    until_s: float = 0.0

    @property
    def background(self) -> bool:
        return self.command.rstrip().endswith("&")


def blocks(runbook: str) -> dict[str, list[Step]]:
    """Every runnable block of ``docs/runbooks/<runbook>`` by name, in order."""
    text = (RUNBOOKS / runbook).read_text()
    out: dict[str, list[Step]] = {}
    for match in _BLOCK.finditer(text):
        name = match["name"]
        assert name not in out, f"{runbook}: two blocks named {name}"
        out[name] = _parse(match["body"])
    return out


def _parse(body: str) -> list[Step]:
    steps: list[Step] = []
    lines = iter(body.splitlines())
    for line in lines:
        if line.startswith("$ "):
            command = line[2:]
            while command.endswith("\\"):
                command = command[:-1] + " " + next(lines).strip()
            steps.append(Step(command))
            continue
        text = line.strip()
        assert steps or not text, f"output before any command: {line!r}"
        if not text or text in ("…", "..."):
            continue
        if exit_match := _EXIT.match(text):
            steps[-1].exit_code = int(exit_match[1])
        elif until_match := _UNTIL.match(text):
            steps[-1].until_s = float(until_match[1])
        else:
            steps[-1].expect.append(_squash(text))
    return steps


def _squash(text: str) -> str:
    return " ".join(text.split())


@dataclass
class Result:
    """What one command did."""

    step: Step
    returncode: int
    output: str


class Runbook:
    """One runbook's blocks, run in a working directory with a test's environment."""

    def __init__(self, name: str, workdir: Path, env: dict[str, str]) -> None:
        self.name = name
        self.blocks = blocks(name)
        self.workdir = workdir
        self.env = dict(env)
        shim = workdir / ".bin"
        shim.mkdir(exist_ok=True)
        rmqkit = shim / "rmqkit"
        rmqkit.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m rmqkit "$@"\n')
        rmqkit.chmod(0o755)
        self.env["PATH"] = f"{shim}{os.pathsep}{self.env.get('PATH', '')}"
        self.env["PYTHONPATH"] = os.pathsep.join(
            [str(workdir), str(RUNBOOKS.parent.parent), self.env.get("PYTHONPATH", "")]
        )
        self.env.setdefault("COLUMNS", "200")
        self.background: list[subprocess.Popen[bytes]] = []

    def run(self, block: str, **placeholders: str) -> list[Result]:
        """Run every command of ``block``, asserting each one's exit code and excerpts."""
        assert block in self.blocks, f"{self.name} has no block {block!r}"
        env = {**self.env, **placeholders}
        results = []
        for step in self.blocks[block]:
            if step.background:
                self.background.append(self._start(step, env))
                continue
            results.append(self._run(step, env))
        return results

    def _run(self, step: Step, env: dict[str, str]) -> Result:
        deadline = time.monotonic() + step.until_s
        while True:
            done = subprocess.run(
                ["bash", "-c", step.command],
                cwd=self.workdir,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            output = done.stdout + done.stderr
            missing = [x for x in step.expect if x not in _squash(output)]
            ok = done.returncode == step.exit_code and not missing
            if ok or time.monotonic() >= deadline:
                break
            time.sleep(1)
        where = f"{self.name}: `{step.command}`"
        assert done.returncode == step.exit_code, (
            f"{where} exited {done.returncode}, runbook says {step.exit_code}:\n{output}"
        )
        assert not missing, f"{where} did not print {missing}:\n{output}"
        return Result(step, done.returncode, output)

    def _start(self, step: Step, env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f".background-{len(self.background)}.log", "wb")  # noqa: SIM115
        # `exec`, so the signal reaches the command itself, not a shell around it.
        command = "exec " + step.command.rstrip().removesuffix("&")
        return subprocess.Popen(
            ["bash", "-c", command], cwd=self.workdir, env=env, stdout=log, stderr=log
        )

    def background_output(self, index: int = 0) -> str:
        """What background command ``index`` printed so far."""
        return (self.workdir / f".background-{index}.log").read_text(errors="replace")

    def stop(self) -> list[int | None]:
        """SIGTERM every background command (as the runbook's operator would) and reap it."""
        codes: list[int | None] = []
        for proc in self.background:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                codes.append(proc.wait(timeout=40))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(proc.wait())
        self.background.clear()
        return codes

"""Start `rmqkit consume` as a real subprocess against a test vhost, and read its ledger."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tests import broker

ROOT = Path(__file__).resolve().parent.parent
JOBS = str(ROOT / "tests" / "topologies" / "jobs.toml")


class ConsumerProcess:
    """`rmqkit consume` in a subprocess (the supervisor; its workers are its children)."""

    def __init__(
        self,
        vhost: str,
        ledger: Path,
        *args: str,
        handler: str = "tests.handlers:handle",
        queue: str = "jobs.work",
        topology: str | None = JOBS,
        global_args: bool = False,
    ) -> None:
        env = broker.cli_env(vhost)
        env["RMQKIT_TEST_LEDGER"] = str(ledger)
        # global_args: args are global options (before the command), e.g. --url.
        head = [*args] if global_args else []
        tail = [] if global_args else [*args]
        cmd = [sys.executable, "-m", "rmqkit", *head, "consume", handler, "--queue", queue, *tail]
        if topology:
            cmd += ["--topology", topology]
        self.log_path = ledger.with_suffix(".log")
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT
        )

    def workers(self) -> list[int]:
        """PIDs of the supervisor's live worker processes."""
        out = subprocess.run(
            ["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True, check=False
        )
        pids = []
        for pid in (int(p) for p in out.stdout.split()):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"resource_tracker" not in cmdline:  # multiprocessing's helper, not a worker
                pids.append(pid)
        return pids

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self._log.close()

    def kill(self) -> None:
        """Leave nothing running: SIGKILL the supervisor and every worker."""
        for pid in self.workers():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log.close()

    def output(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()


def events(ledger: Path) -> list[tuple[str, int, str, float]]:
    if not ledger.exists():
        return []
    db = sqlite3.connect(str(ledger), timeout=30)
    try:
        return list(db.execute("SELECT message_id, attempt, kind, t FROM events"))
    except sqlite3.OperationalError:
        return []
    finally:
        db.close()


def effects(ledger: Path) -> Counter[str]:
    return Counter(mid for mid, _, kind, _ in events(ledger) if kind == "effect")


def wait_until(fn: Any, timeout_s: float, interval_s: float = 0.25) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if fn():
            return True
        time.sleep(interval_s)
    return bool(fn())


_ = signal  # re-exported for tests

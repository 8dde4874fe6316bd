"""Worker processes under supervision: start N, restart the ones that die, stop them gracefully.

Each worker is a spawned process running one ``rmqkit.Consumer``. Workers sit in their own process
group, so a terminal's Ctrl-C reaches only the supervisor, which forwards one SIGTERM (graceful)
and, on a second signal, SIGKILL (the broker requeues whatever was unacked).

A worker that died abnormally is restarted in *cautious* mode: prefetch 1 until it has settled
a few messages. A message that kills its process then costs only its own delivery attempts,
not those of the whole prefetch window, until the broker's delivery limit parks it.

Workers do not outlive the supervisor: each holds the read end of a pipe (the *lifeline*) whose
only write end the supervisor holds and never writes to. When the supervisor dies, by any
signal (kill -9 of it alone or of its process group included), the kernel closes its end, the
workers see end-of-file and stop as on SIGTERM: no new deliveries, in-flight ones finished and
settled within the grace, then exit. Why a pipe: ``prctl(PR_SET_PDEATHSIG)`` fires when the
parent *thread* that forked the child exits (not the process), is Linux-only and needs ctypes;
polling ``os.getppid()`` notices only at the next poll and costs a timer per worker forever.
The pipe's end-of-file is immediate, event-driven (one reader on the worker's loop), and exact:
only the supervisor's death (or its exit) closes the last write end.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import time
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from types import FrameType

from rmqkit.consumer.config import ConsumerConfig
from rmqkit.consumer.logs import configure_logging
from rmqkit.errors import ExitCode
from rmqkit.settings import Settings

log = logging.getLogger("rmqkit.supervisor")
# Mirrors rmqkit.consumer.worker.RECYCLE_EXIT_CODE (not imported: the supervisor process stays
# free of the worker's broker stack).
RECYCLE_EXIT_CODE = 75
FATAL_EXIT_CODES = frozenset({ExitCode.DATA, ExitCode.ACCESS, ExitCode.CONFIG})
RESTART_BASE_S = 0.2
RESTART_CAP_S = 5.0
STABLE_AFTER_S = 10.0  # a worker that lived this long resets its restart backoff


@dataclass
class _Slot:
    index: int
    process: BaseProcess | None = None
    started_at: float = 0.0
    failures: int = 0
    restart_at: float = 0.0


def worker_main(
    settings: Settings,
    config: ConsumerConfig,
    index: int,
    cautious: bool,
    lifeline: Connection | None = None,
) -> None:
    """Entry point of one worker process; ``lifeline``: the read end of the supervisor's pipe
    (end-of-file: the supervisor is gone, stop)."""
    os.setpgrp()  # out of the terminal's process group: signals come from the supervisor only
    from rmqkit.consumer.worker import run_worker

    raise SystemExit(
        run_worker(settings, config, index=index, cautious=cautious, lifeline=lifeline)
    )


class Supervisor:
    """Keeps ``processes`` workers running until told to stop."""

    def __init__(self, settings: Settings, config: ConsumerConfig, processes: int) -> None:
        self.settings = settings
        self.config = config
        self.slots = [_Slot(i) for i in range(processes)]
        self._ctx = multiprocessing.get_context("spawn")
        self._signals = 0
        self.restarts = 0
        # The lifeline (see the module docstring): the write end stays here, unwritten, until
        # this process ends; each worker gets a duplicate of the read end (spawn passes only
        # the descriptors given to it, so no worker ever holds the write end).
        self._lifeline, self._lifeline_end = self._ctx.Pipe(duplex=False)

    def _start(self, slot: _Slot, *, cautious: bool) -> None:
        port = self.config.metrics_port
        config = (
            self.config if port is None else replace(self.config, metrics_port=port + slot.index)
        )
        process = self._ctx.Process(
            target=worker_main,
            args=(self.settings, config, slot.index, cautious, self._lifeline),
            name=f"rmqkit-worker-{slot.index}",
            daemon=False,
        )
        process.start()
        slot.process, slot.started_at = process, time.monotonic()
        log.info(
            "worker %d started (pid %s%s)",
            slot.index,
            process.pid,
            ", cautious: prefetch 1 after a crash" if cautious else "",
        )

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        for slot in self.slots:
            process = slot.process
            if process is None or process.pid is None or not process.is_alive():
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM if self._signals == 1 else signal.SIGKILL)

    def run(self) -> int:
        """Run until a signal stops every worker; returns the exit code for the process."""
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            for slot in self.slots:
                self._start(slot, cautious=False)
            return self._watch()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _watch(self) -> int:
        fatal: int | None = None
        while True:
            alive = 0
            now = time.monotonic()
            for slot in self.slots:
                process = slot.process
                if process is not None and process.is_alive():
                    alive += 1
                    continue
                if process is not None:
                    code = process.exitcode
                    process.close()
                    slot.process = None
                    if self._signals:
                        continue
                    if code in FATAL_EXIT_CODES:
                        log.error("worker %d exited with %s (fatal); stopping", slot.index, code)
                        fatal = code
                        self._on_signal(signal.SIGTERM, None)
                        continue
                    lived = now - slot.started_at
                    slot.failures = 1 if lived > STABLE_AFTER_S else slot.failures + 1
                    delay = min(RESTART_CAP_S, RESTART_BASE_S * 2 ** (slot.failures - 1))
                    slot.restart_at = now + delay
                    log.warning(
                        "worker %d %s after %.1fs; restarting in %.1fs",
                        slot.index,
                        "recycled (stuck handlers held its threads)"
                        if code == RECYCLE_EXIT_CODE
                        else f"died (exit {code})",
                        lived,
                        delay,
                    )
                if self._signals or fatal is not None:
                    continue
                if now >= slot.restart_at:
                    self.restarts += 1
                    self._start(slot, cautious=True)
                    alive += 1
            if (self._signals or fatal is not None) and alive == 0:
                if fatal is not None:
                    return fatal
                return ExitCode.OK if self._signals == 1 else ExitCode.INTERRUPTED
            time.sleep(0.05)


def run_supervised(settings: Settings, config: ConsumerConfig, processes: int) -> int:
    """Run ``processes`` supervised workers; returns the process exit code.

    The supervisor logs through the workers' formatter (rmqkit.consumer.logs: ISO 8601 UTC
    with milliseconds in text, or JSON lines), so one consumer's output has one timestamp
    format, and its INFO lines (worker started) show as the workers' do.
    """
    configure_logging(config.log_format)
    return Supervisor(settings, config, processes).run()

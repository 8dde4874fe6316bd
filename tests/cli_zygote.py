"""The `rmqkit` command in a real process of its own, without paying its imports each time.

Most of a CLI call's CPU in this suite was Python importing rmqkit's dependencies (0.8 s of
about 1 s, measured), and the suite makes thousands of calls on a 2-core machine. A zygote
process imports the dependencies once (``PRELOAD``: third-party packages and rmqkit's library
layer, nothing that reads the environment or the terminal when imported) and forks a fresh
child per call. The child gets the call's argv, environment, working directory and its own
stdin/stdout/stderr, imports the CLI itself (typer, rich's consoles, rmqkit.cli: they read
the environment when imported) and runs ``python -m rmqkit`` as the interpreter would, exit
code and all (a signal's death as a negative code, as ``subprocess`` reports it).

``run`` falls back to a plain subprocess when the fork cannot be faithful: an environment that
differs from the zygote's in what the interpreter reads at start-up (``PYTHON*``, locale,
terminal and colour variables), coverage measurement, or ``RMQKIT_TEST_CLI_FORK=0``.
"""

from __future__ import annotations

import array
import atexit
import importlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

PRELOAD = (
    "asyncio",
    "aiormq",
    "aio_pika",
    "pamqp",
    "httpx",
    "httpcore",
    "anyio",
    "pydantic",
    "pydantic_settings",
    "cryptography.hazmat.primitives.ciphers.aead",
    "rmqkit.settings",
    "rmqkit.errors",
    "rmqkit.topology",
    "rmqkit.broker.session",
    "rmqkit.broker.management",
    "rmqkit.parking.browse",
    "rmqkit.parking.model",
    "rmqkit.parking.ops",
    "rmqkit.parking.moves",
    "rmqkit.parking.transfer",
    "rmqkit.health.doctor",
    "rmqkit.health.status",
    "rmqkit.publishing",
    "rmqkit.outbox",
    "rmqkit.crypto",
)
# What the interpreter or a preloaded module reads from the environment when it starts: a call
# that sets any of these otherwise than the zygote had them runs as a plain subprocess.
_AT_START = re.compile(
    r"PYTHON.*|LANG|LANGUAGE|LC_.*|TERM|COLUMNS|LINES|NO_COLOR|FORCE_COLOR|CLICOLOR.*|"
    r"TERMINAL_WIDTH|_TYPER_.*|COVERAGE_.*|SSL_CERT_.*|RMQKIT_TEST_CLI_FORK"
)
_MAX_FDS = 3


def _startup_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if _AT_START.fullmatch(k)}


# --- the zygote ---------------------------------------------------------------------------------


def _serve(path: str, parent: int) -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    listener.settimeout(1.0)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the per-call helpers reap themselves
    print("ready", flush=True)
    while os.getppid() == parent:  # the test process is gone: so is its zygote
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        if os.fork() == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            try:
                _handle(conn)
            finally:
                os._exit(0)
        conn.close()


def _handle(conn: socket.socket) -> None:
    """One call: fork the command's process, send its pid, wait, send its exit code."""
    conn.settimeout(None)
    message, fds, _, _ = socket.recv_fds(conn, 1 << 20, _MAX_FDS)
    request = json.loads(message)
    pid = os.fork()
    if pid == 0:
        conn.close()
        _run_command(request, fds)
    for fd in fds:
        os.close(fd)
    conn.sendall(f"{pid}\n".encode())
    _, status = os.waitpid(pid, 0)
    conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
    conn.close()


def _run_command(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: become ``python -m rmqkit ARGS`` and exit as it would."""
    import random
    import runpy
    import traceback

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
        signal.signal(number, signal.default_int_handler if number == signal.SIGINT else 0)
    os.chdir(request["cwd"])
    sys.path[0] = request["cwd"]  # as `python -m` puts it first
    os.environ.clear()
    os.environ.update(request["env"])
    random.seed()  # not the zygote's state: each process draws its own
    sys.argv = ["-m", *request["args"]]
    code: int = 0
    try:
        runpy.run_module("rmqkit", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        # as the interpreter ends on one: the traceback, then death by SIGINT
        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


# --- the client (a test process) --------------------------------------------------------------


class _Zygote:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.path: str | None = None
        self.process: subprocess.Popen[str] | None = None
        self.env: dict[str, str] = {}
        self.failed = False

    def socket_path(self) -> str | None:
        with self.lock:
            if self.path is not None or self.failed:
                return self.path
            folder = tempfile.mkdtemp(prefix="rmqkit-zygote-")
            path = os.path.join(folder, "s")
            self.env = {k: v for k, v in os.environ.items() if not k.startswith("RMQKIT_")}
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.cli_zygote", path, str(os.getpid())],
                cwd=Path(__file__).resolve().parents[1],
                env=self.env,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert self.process.stdout is not None
            if self.process.stdout.readline().strip() != "ready":
                self.failed = True
                return None
            atexit.register(self.process.kill)
            self.path = path
            return path


_ZYGOTE = _Zygote()


def run(
    argv: list[str],
    *,
    env: dict[str, str],
    timeout: float,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([python, "-m", "rmqkit", *argv], capture_output=True, text=True,
    env=env, timeout=timeout)``, through the zygote where that is faithful."""
    faithful = (
        os.environ.get("RMQKIT_TEST_CLI_FORK", "1") != "0"
        and "COVERAGE_PROCESS_START" not in env
        and hasattr(socket, "send_fds")
    )
    path = _ZYGOTE.socket_path() if faithful else None
    if path is None or _startup_env(env) != _startup_env(_ZYGOTE.env):
        return subprocess.run(
            [sys.executable, "-m", "rmqkit", *argv],
            input=stdin,
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            check=False,
        )
    with (
        tempfile.TemporaryFile() as given,
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
    ):
        if stdin is not None:
            given.write(stdin.encode())
            given.seek(0)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(path)
            request = {"args": argv, "env": env, "cwd": os.getcwd()}
            fds = array.array("i", [given.fileno(), out.fileno(), err.fileno()])
            socket.send_fds(conn, [json.dumps(request).encode()], list(fds))
            conn.settimeout(timeout)
            reader = conn.makefile("r")
            pid = int(reader.readline())
            try:
                code = int(reader.readline())
            except (TimeoutError, ValueError):
                os.kill(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired([*argv], timeout) from None
        finally:
            conn.close()
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(
            [sys.executable, "-m", "rmqkit", *argv],
            code,
            _text(out.read()),
            _text(err.read()),
        )


def _text(data: bytes) -> str:
    """As ``subprocess.run(text=True)`` reads a pipe: UTF-8 here, universal newlines."""
    return data.decode(errors="replace").replace("\r\n", "\n").replace("\r", "\n")


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]))

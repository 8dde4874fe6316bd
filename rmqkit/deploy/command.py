"""The `rmqkit consume` command line a deployment runs, and how long its stop may take.

Shared by the Kubernetes and systemd artefacts, so both run the consumer the same way: the
vhost named explicitly (the one the manifests count messages in), the topology file given with
``--topology`` (never searched for), the grace of a graceful stop, and the health server when
the deployment probes it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from rmqkit.deploy.target import ConsumeTarget
from rmqkit.durations import format_duration_ms, parse_duration_ms
from rmqkit.errors import UsageError

# Past the grace, the consumer still acks what finished, closes its channels and connection,
# and its worker and supervisor processes exit: what this margin leaves time for before the
# platform kills what is left (SIGKILL: whatever was unacked is redelivered, nothing is lost).
STOP_MARGIN_S = 15

# `rmqkit consume`'s handler timeout when neither the file nor --handler-timeout sets one
# (rmqkit.consumer.config.DEFAULT_HANDLER_TIMEOUT_S; a unit test keeps the two equal).
CONSUME_HANDLER_TIMEOUT_S = 30.0

# The options the deployment sets itself; given again through --arg they would contradict it.
OWNED_OPTIONS = (
    "--queue",
    "-q",
    "--topology",
    "-t",
    "--no-topology",
    "--grace",
    "--metrics-port",
    "--vhost",
    "--url",
    "--management-url",
)
_CREDENTIALS = re.compile(r"://[^/@\s]*:[^/@\s]*@")
_HANDLER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*(?::[A-Za-z_]\w*)?")


@dataclass(frozen=True)
class ConsumeCommand:
    """How the consumer is started: what `rmqkit consume` gets besides its queue."""

    handler: str  # module:function, or a module of routed handlers
    grace_ms: int
    metrics_port: int | None = None  # serve /metrics, /healthz and /readyz there
    log_format: str | None = None  # "json" for a log collector
    extra: tuple[str, ...] = ()  # further `rmqkit consume` options, as given

    @property
    def grace_s(self) -> float:
        return self.grace_ms / 1000


def parse_grace(text: str) -> int:
    """``--grace`` in milliseconds (``30s``, ``2m``); a bad one is a UsageError (64)."""
    try:
        return parse_duration_ms(text)
    except ValueError as exc:
        raise UsageError(f"--grace: {exc}") from None


def check_handler(handler: str) -> str:
    """``module:function`` or ``module``, as `rmqkit consume` imports it."""
    if not _HANDLER.fullmatch(handler):
        raise UsageError(
            f"--handler {handler!r}: give module:function (e.g. app.handlers:handle) or a "
            "module of @rmqkit.handler functions"
        )
    return handler


def check_extra(extra: Sequence[str]) -> tuple[str, ...]:
    """The ``--arg`` values: `rmqkit consume` options the deployment does not set itself, and
    no credentials (a command line is visible to every process on the host and in the
    manifest: credentials go in the Secret or the EnvironmentFile)."""
    for arg in extra:
        option = arg.split("=", 1)[0]
        short = arg[:2] if re.fullmatch(r"-[A-Za-z].*", arg) else None
        if option in OWNED_OPTIONS or short in OWNED_OPTIONS:
            raise UsageError(
                f"--arg {arg!r}: the deployment sets {option if short is None else short} "
                "itself; use the deploy command's own option"
            )
        if _CREDENTIALS.search(arg):
            raise UsageError(
                "--arg: a URL with a password is refused on the command line (it would be "
                "in the manifest and in every `ps`): leave the password out of it and put it "
                "in the Secret or EnvironmentFile (PostgreSQL reads PGPASSWORD)"
            )
        if not arg or any(ord(c) < 0x20 or ord(c) == 0x7F for c in arg):
            raise UsageError(f"--arg {arg!r}: empty, or holds a control character")
    return tuple(extra)


def consume_args(target: ConsumeTarget, command: ConsumeCommand, topology_path: str) -> list[str]:
    """The arguments after ``rmqkit``: the vhost (the one the deployment counts messages in,
    whatever vhost the URL in the Secret names), then `consume` with the topology file where
    it runs (``topology_path``), given rather than searched for."""
    args = ["--vhost", target.vhost, "consume", command.handler, "--queue", target.queue]
    args += ["--topology", topology_path, "--grace", format_duration_ms(command.grace_ms)]
    if command.metrics_port is not None:
        args += ["--metrics-port", str(command.metrics_port)]
    if command.log_format is not None:
        args += ["--log-format", command.log_format]
    return [*args, *command.extra]


def stop_timeout_s(command: ConsumeCommand, before_s: int = 0) -> int:
    """Seconds the platform waits for the consumer to stop before it kills it: ``before_s``
    (a preStop hook, which counts against Kubernetes' grace period), the grace, the margin."""
    return before_s + math.ceil(command.grace_s) + STOP_MARGIN_S


def handler_timeout_s(target: ConsumeTarget, command: ConsumeCommand) -> float:
    """The handler timeout the consumer will run with: --handler-timeout given through --arg,
    else the file's, else consume's default."""
    for index, arg in enumerate(command.extra):
        value = None
        if arg.startswith("--handler-timeout="):
            value = arg.split("=", 1)[1]
        elif arg == "--handler-timeout" and index + 1 < len(command.extra):
            value = command.extra[index + 1]
        if value is not None:
            try:
                return parse_duration_ms(value) / 1000
            except ValueError:
                break  # consume itself will refuse it, with its own message
    if target.handler_timeout_s is not None:
        return target.handler_timeout_s
    return CONSUME_HANDLER_TIMEOUT_S


def stop_warnings(target: ConsumeTarget, command: ConsumeCommand) -> list[str]:
    """What the operator should know about stopping: a grace shorter than the handler timeout
    lets a stop (a deploy, a scale-down) cut handlers that would have finished."""
    timeout = handler_timeout_s(target, command)
    if command.grace_s >= timeout:
        return []
    return [
        f"--grace {format_duration_ms(command.grace_ms)} is shorter than the handler timeout "
        f"({timeout:g}s): a stop or scale-down cuts handlers still running at the end of the "
        "grace, and their messages are redelivered (a delivery attempt spent each) — give a "
        "grace at least as long as the handler timeout"
    ]

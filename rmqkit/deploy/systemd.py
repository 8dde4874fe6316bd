"""`rmqkit deploy systemd`: a service unit running `rmqkit consume` on one work queue.

How it stops: systemd sends SIGTERM to the supervisor alone (``KillMode=mixed``), which
forwards one SIGTERM to each worker: consumers cancelled, in-flight handlers finished within
``--grace`` and acked, exit 0. With the default ``KillMode=control-group`` every worker would
get systemd's SIGTERM *and* the supervisor's, and a worker takes a second signal as "stop now"
(its unacked messages are redelivered): the grace would be lost. ``TimeoutStopSec`` is the
grace plus a margin; SIGKILL (to every process of the unit) only after it.

Credentials come from ``EnvironmentFile=`` (read by systemd as root before it drops privileges,
so the file can be root's, mode 0600), never from the unit. The hardening keeps what the
consumer needs: network sockets, its working directory and topology file read-only, and, with
``--state-directory``, one writable directory (a SQLite dedupe store there).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rmqkit.deploy.command import (
    STOP_MARGIN_S,
    ConsumeCommand,
    consume_args,
    stop_timeout_s,
    stop_warnings,
)
from rmqkit.deploy.target import ConsumeTarget
from rmqkit.errors import UsageError

# Exit codes a restart cannot fix (docs/exit-codes.md): usage, bad data or topology, access
# refused, bad configuration. A restart loop would only hide them in the journal.
NO_RESTART_EXIT_CODES = (64, 65, 77, 78)
RESTART_SEC = 5
_SAFE_ARG = re.compile(r"[A-Za-z0-9_@+=:,./-]+")
_SHOWN = re.compile(r"[ -~]*")  # printable ASCII: shown in a comment as it is
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}|[0-9]+")
_UNIT_NAME = re.compile(r"[A-Za-z0-9:_.-]{1,200}")

HARDENING = (
    # No privilege gain (setuid binaries, file capabilities), no capabilities at all.
    ("NoNewPrivileges", "yes"),
    ("CapabilityBoundingSet", ""),
    # The whole file system read-only except the unit's own directories (StateDirectory),
    # /home readable (a working directory may be there); a private /tmp and /dev.
    ("ProtectSystem", "strict"),
    ("ProtectHome", "read-only"),
    ("PrivateTmp", "yes"),
    ("PrivateDevices", "yes"),
    ("ProtectKernelTunables", "yes"),
    ("ProtectKernelModules", "yes"),
    ("ProtectKernelLogs", "yes"),
    ("ProtectControlGroups", "yes"),
    ("ProtectClock", "yes"),
    ("ProtectHostname", "yes"),
    ("RestrictSUIDSGID", "yes"),
    ("RestrictRealtime", "yes"),
    ("RestrictNamespaces", "yes"),
    ("LockPersonality", "yes"),
    # TCP to the broker and the database; Unix sockets (a local PostgreSQL) and netlink
    # (the resolver asks the kernel for the host's addresses).
    ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX AF_NETLINK"),
    ("SystemCallArchitectures", "native"),
    ("SystemCallFilter", "@system-service"),
    ("UMask", "0077"),
    # Not MemoryDenyWriteExecute: libffi (cffi callbacks, ctypes) needs writable executable
    # memory on some systems, and a handler's libraries may use it.
)


@dataclass(frozen=True)
class SystemdOptions:
    """What `rmqkit deploy systemd` takes besides the topology and the queue."""

    name: str  # the unit's name, without .service
    executable: str  # absolute path of the rmqkit console script
    command: ConsumeCommand
    topology_path: str  # absolute path of the topology file on the host
    working_directory: str  # where the handler's module is imported from
    env_file: str  # RMQKIT_URL and friends
    user: str | None = None  # None: DynamicUser=yes (a transient user of its own)
    state_directory: bool = False  # StateDirectory=rmqkit/NAME, writable


@dataclass(frozen=True)
class Unit:
    """The unit file's text and what to tell the operator."""

    text: str
    warnings: list[str]


def exec_arg(arg: str) -> str:
    """One argument of ``ExecStart=`` as systemd reads it back: quoted when needed, ``%``
    (a specifier) and ``$`` (a variable) doubled, a lone ``;`` (a command separator)
    escaped."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in arg):
        raise UsageError(f"{arg!r}: a control character cannot be passed to ExecStart=")
    text = arg.replace("%", "%%").replace("$", "$$")
    if arg == ";":
        return "\\;"
    if _SAFE_ARG.fullmatch(arg):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _value(value: str, what: str) -> str:
    """A setting's value (a path, a user): one line (a trailing backslash would continue it),
    specifiers escaped."""
    if (
        value != value.strip()
        or value.endswith("\\")
        or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value)
    ):
        raise UsageError(
            f"{what} {value!r}: no control characters, surrounding spaces or trailing backslash"
        )
    return value.replace("%", "%%")


def _absolute(path: str, what: str) -> str:
    if not path.startswith("/"):
        raise UsageError(f"{what} {path!r}: systemd needs an absolute path")
    return _value(path, what)


def _shown(value: str) -> str:
    """A value quoted in a comment: as it is if plain, else escaped (a newline or a trailing
    backslash in it cannot turn the comment into a setting)."""
    return value if _SHOWN.fullmatch(value) and not value.endswith("\\") else repr(value)


def _comment(text: str) -> list[str]:
    return [f"# {line}".rstrip() for line in text.split("\n")]


def systemd_unit(target: ConsumeTarget, options: SystemdOptions) -> Unit:
    """The unit file `rmqkit deploy systemd` prints. UsageError (64) for a value systemd
    cannot take (a relative path, a bad unit or user name)."""
    if not _UNIT_NAME.fullmatch(options.name):
        raise UsageError(
            f"--name {options.name!r}: letters, digits and ':', '_', '.', '-' (a unit name)"
        )
    if options.user is not None and not _USER.fullmatch(options.user):
        raise UsageError(f"--user {options.user!r}: a user name or a numeric uid")
    command = options.command
    args = [options.executable, *consume_args(target, command, options.topology_path)]
    _absolute(options.executable, "--exec")
    _absolute(options.topology_path, "--topology-path")
    working = _absolute(options.working_directory, "--working-directory")
    env_file = _absolute(options.env_file, "--env-file")
    timeout = stop_timeout_s(command)
    description = _value(f"rmqkit consumer of {target.queue} (vhost {target.vhost})", "--queue")
    lines = _comment(
        f"rmqkit deploy systemd: `rmqkit consume` of queue {_shown(target.queue)} in vhost "
        f"{_shown(target.vhost)}, from {_shown(target.source)}.\n"
        f"Save as /etc/systemd/system/{options.name}.service. Put RMQKIT_URL "
        "(amqp://user:password@host:5672/vhost),\nand RMQKIT_MANAGEMENT_URL if the management "
        + (
            "API is elsewhere, and the key ring (RMQKIT_KEYRING or\nRMQKIT_KEYRING_FILE)"
            if target.needs_keyring
            else "API is elsewhere,"
        )
        + f" in {_shown(options.env_file)} (root's, mode 0600), then:\n"
        f"systemctl daemon-reload && systemctl enable --now {options.name}"
    )
    lines += [
        "",
        "[Unit]",
        f"Description={description}",
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=exec",
        "ExecStart=" + " ".join(exec_arg(arg) for arg in args),
        f"WorkingDirectory={working}",
        f"EnvironmentFile={env_file}",
    ]
    if options.user is None:
        lines += _comment("a transient user of the unit's own (no --user given)")
        lines.append("DynamicUser=yes")
    else:
        lines.append(f"User={_value(options.user, '--user')}")
    if options.state_directory:
        lines += _comment(
            f"writable, as /var/lib/rmqkit/{options.name} (e.g. a SQLite dedupe store: "
            f"--arg=--dedupe=sqlite:////var/lib/rmqkit/{options.name}/dedupe.db)"
        )
        lines.append(f"StateDirectory=rmqkit/{options.name}")
    lines += _comment(
        "SIGTERM to the supervisor alone: it forwards one to each worker (a second SIGTERM, "
        "which\nthe default control-group mode would send each worker too, stops a worker at "
        "once)"
    )
    lines += ["KillMode=mixed", "KillSignal=SIGTERM"]
    lines += _comment(
        f"--grace {command.grace_s:g}s for in-flight handlers to finish and be acked + "
        f"{STOP_MARGIN_S}s for the last acks and the exit;\nthen SIGKILL (what was still "
        "unacked is redelivered, never lost)"
    )
    lines.append(f"TimeoutStopSec={timeout}")
    lines += ["Restart=on-failure", f"RestartSec={RESTART_SEC}"]
    lines += _comment(
        "a restart cannot fix a usage error, a bad topology, a refused access or a bad "
        "configuration"
    )
    lines.append("RestartPreventExitStatus=" + " ".join(str(c) for c in NO_RESTART_EXIT_CODES))
    lines.append(f"SyslogIdentifier={options.name}")
    lines += ["", *_comment("Hardening (docs/deploy.md says what each allows the consumer)")]
    lines += [f"{key}={value}" for key, value in HARDENING]
    lines += ["", "[Install]", "WantedBy=multi-user.target"]
    return Unit("\n".join(lines) + "\n", stop_warnings(target, command))

"""`rmqkit deploy k8s | systemd`: deployment artefacts for `rmqkit consume` on one work queue.

Parse, read the topology file, one call into rmqkit.deploy, print: the manifests (or the unit)
on stdout and nothing else there, warnings on stderr. Nothing is applied and the broker is not
asked anything (docs/deploy.md).
"""

from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path

import typer

from rmqkit.cli.common import settings_from, topology_option
from rmqkit.cli.render import stderr
from rmqkit.deploy import (
    ConsumeCommand,
    ConsumeTarget,
    K8sOptions,
    SystemdOptions,
    check_extra,
    check_handler,
    check_name,
    consume_target,
    default_name,
    k8s_manifests,
    parse_grace,
    systemd_unit,
)
from rmqkit.durations import parse_delay_ms
from rmqkit.errors import UsageError
from rmqkit.topology import Topology, load_topology, parse_topology

app = typer.Typer(
    help="Deployment manifests for `rmqkit consume` on one work queue: Kubernetes with KEDA "
    "autoscaling, or a systemd unit.",
    no_args_is_help=True,
)

TOPOLOGY_ARG = typer.Argument(
    None,
    help="Topology file (TOML) declaring the queue; the same as --topology FILE.",
    show_default=False,
    metavar="TOPOLOGY",
)
TOPOLOGY_OPT = topology_option(
    "Topology file (TOML), as on every rmqkit command; may also be given as the first argument."
)
QUEUE_OPT = typer.Option(
    ...,
    "--queue",
    "-q",
    help="The work queue to consume (with its lanes or partitions), or one lane or partition.",
)
HANDLER_OPT = typer.Option(
    ...,
    "--handler",
    help="The handler as `rmqkit consume` takes it: module:function, or a module of "
    "@rmqkit.handler functions.",
)
GRACE_OPT = typer.Option(
    "30s",
    "--grace",
    help="consume's --grace: how long a stop waits for in-flight handlers. The stop timeout "
    "(terminationGracePeriodSeconds, TimeoutStopSec) is this plus 15s (and --pre-stop).",
)
ARG_OPT = typer.Option(
    [],
    "--arg",
    help="A further `rmqkit consume` option, as is (repeatable): --arg=--prefetch=50. Not the "
    "options deploy sets, and no URL with a password.",
)
TOPOLOGY_PATH_HELP = "Where the topology file is where the consumer runs; {default}."


def _topology(positional: Path | None, option: Path | None) -> tuple[Path, Topology, str]:
    """The topology file named either way, its validated model and its text (the same text:
    the ConfigMap holds what was checked)."""
    if positional is not None and option is not None and positional != option:
        raise UsageError(f"two topology files ({positional} and --topology {option}): give one")
    path = option or positional
    if path is None:
        raise UsageError("no topology file: give TOPOLOGY (or --topology FILE)")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        load_topology(path)  # the error every command reports for this file (65)
        raise
    return path, parse_topology(text, str(path)), text


def _target(ctx: typer.Context, topology: Topology, queue: str) -> ConsumeTarget:
    """The queue in the vhost the global --vhost (or RMQKIT_URL) names."""
    return consume_target(topology, queue, settings_from(ctx).vhost)


def _warn(warnings: list[str]) -> None:
    for warning in warnings:
        stderr.print(f"warning: {warning}", markup=False, highlight=False)


@app.command("k8s")
def k8s_cmd(
    ctx: typer.Context,
    file: Path | None = TOPOLOGY_ARG,
    topology_opt: Path | None = TOPOLOGY_OPT,
    queue: str = QUEUE_OPT,
    handler: str = HANDLER_OPT,
    image: str = typer.Option(
        ..., "--image", help="The container image: rmqkit and the handler's code installed."
    ),
    name: str | None = typer.Option(
        None, "--name", help="Name of every object, a DNS label (default: from the queue)."
    ),
    secret: str | None = typer.Option(
        None,
        "--secret",
        help="The Secret holding RMQKIT_URL and RMQKIT_MANAGEMENT_URL (default: NAME-rabbitmq).",
    ),
    grace: str = GRACE_OPT,
    pre_stop: str = typer.Option(
        "5s",
        "--pre-stop",
        help="preStop sleep before SIGTERM, so the pod leaves Service endpoints first; 0s: "
        "no hook.",
    ),
    metrics_port: int = typer.Option(
        9100,
        "--metrics-port",
        min=1,
        max=65535,
        help="consume's --metrics-port: /metrics, and /healthz and /readyz for the probes.",
    ),
    replicas_min: int = typer.Option(
        1,
        "--replicas-min",
        min=0,
        help="KEDA's minReplicaCount: 1 keeps a consumer waiting; 0 scales to zero when "
        "nothing is counted.",
    ),
    replicas_max: int = typer.Option(10, "--replicas-max", min=1, help="KEDA's maxReplicaCount."),
    messages_per_replica: int | None = typer.Option(
        None,
        "--messages-per-replica",
        min=1,
        help="KEDA's target: messages (ready + unacked + waiting for a retry) per replica "
        "(default: the prefetch of the queues served).",
    ),
    topology_path: str | None = typer.Option(
        None,
        "--topology-path",
        help=TOPOLOGY_PATH_HELP.format(
            default="given, the file is in the image there (no ConfigMap); default: a "
            "ConfigMap holding it"
        ),
    ),
    arg: list[str] = ARG_OPT,
) -> None:
    """Print Kubernetes manifests (YAML) running `rmqkit consume` on QUEUE, scaled by KEDA.

    A ConfigMap with the topology file, a Deployment (probes on /healthz and /readyz, a
    termination grace above --grace, credentials from the Secret), and a KEDA ScaledObject
    counting ready and unacked messages of the queue and its wait queues through the
    management API, with its TriggerAuthentication. Nothing is applied: pipe it to `kubectl
    apply -f -`. Unknown queue: exit 64, naming the file's work queues."""
    _, topology, text = _topology(file, topology_opt)
    command = ConsumeCommand(
        handler=check_handler(handler),
        grace_ms=parse_grace(grace),
        metrics_port=metrics_port,
        log_format="json",  # one object a line, for the cluster's log collector
        extra=check_extra(arg),
    )
    target = _target(ctx, topology, queue)
    chosen = check_name(name) if name is not None else default_name(queue)
    options = K8sOptions(
        name=chosen,
        image=image,
        secret=secret or f"{chosen}-rabbitmq",
        command=command,
        pre_stop_s=_whole_seconds(pre_stop, "--pre-stop"),
        replicas_min=replicas_min,
        replicas_max=replicas_max,
        messages_per_replica=messages_per_replica,
        topology_text=None if topology_path is not None else text,
        topology_in_image=topology_path,
    )
    manifests = k8s_manifests(target, options)
    _warn(manifests.warnings)
    sys.stdout.write(manifests.text)


@app.command("systemd")
def systemd_cmd(
    ctx: typer.Context,
    file: Path | None = TOPOLOGY_ARG,
    topology_opt: Path | None = TOPOLOGY_OPT,
    queue: str = QUEUE_OPT,
    handler: str = HANDLER_OPT,
    grace: str = GRACE_OPT,
    name: str | None = typer.Option(
        None, "--name", help="The unit's name, without .service (default: from the queue)."
    ),
    user: str | None = typer.Option(
        None,
        "--user",
        help="Run as this user (default: DynamicUser=yes, a transient user of the unit's own).",
    ),
    working_directory: Path | None = typer.Option(
        None,
        "--working-directory",
        help="Where the handler's module is imported from (default: the current directory).",
    ),
    env_file: str | None = typer.Option(
        None,
        "--env-file",
        help="EnvironmentFile= with RMQKIT_URL and other secrets (default: /etc/rmqkit/NAME.env).",
    ),
    executable: str | None = typer.Option(
        None,
        "--exec",
        help="Absolute path of the rmqkit executable (default: the one running this command).",
    ),
    metrics_port: int | None = typer.Option(
        None,
        "--metrics-port",
        min=1,
        max=65535,
        help="consume's --metrics-port: serve /metrics, /healthz and /readyz (default: none).",
    ),
    state_directory: bool = typer.Option(
        False,
        "--state-directory",
        help="A writable /var/lib/rmqkit/NAME (StateDirectory=), e.g. for a SQLite dedupe store.",
    ),
    topology_path: str | None = typer.Option(
        None,
        "--topology-path",
        help=TOPOLOGY_PATH_HELP.format(default="default: TOPOLOGY's absolute path"),
    ),
    arg: list[str] = ARG_OPT,
) -> None:
    """Print a systemd service unit running `rmqkit consume` on QUEUE.

    SIGTERM to the supervisor only (KillMode=mixed), a stop timeout above --grace,
    Restart=on-failure except for exit codes a restart cannot fix, credentials from an
    EnvironmentFile, and a hardened sandbox. Unknown queue: exit 64, naming the file's work
    queues."""
    path, topology, _ = _topology(file, topology_opt)
    command = ConsumeCommand(
        handler=check_handler(handler),
        grace_ms=parse_grace(grace),
        metrics_port=metrics_port,
        extra=check_extra(arg),
    )
    target = _target(ctx, topology, queue)
    chosen = name or f"rmqkit-{default_name(queue)}"
    options = SystemdOptions(
        name=chosen,
        executable=executable or _this_rmqkit(),
        command=command,
        topology_path=topology_path or str(path.resolve()),
        working_directory=str((working_directory or Path.cwd()).resolve()),
        env_file=env_file or f"/etc/rmqkit/{chosen}.env",
        user=user,
        state_directory=state_directory,
    )
    unit = systemd_unit(target, options)
    _warn(unit.warnings)
    sys.stdout.write(unit.text)


def _whole_seconds(text: str, flag: str) -> int:
    try:
        return math.ceil(parse_delay_ms(text) / 1000)
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}") from None


def _this_rmqkit() -> str:
    """The rmqkit console script beside the running interpreter (a virtualenv's), else the
    one on PATH."""
    beside = Path(sys.executable).parent / "rmqkit"
    if beside.is_file():
        return str(beside)
    found = shutil.which("rmqkit")
    if found is None:
        raise UsageError("no rmqkit executable found beside Python or on PATH: give --exec PATH")
    return str(Path(found).resolve())

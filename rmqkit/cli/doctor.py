"""`rmqkit doctor`: the reliability checklist against a live vhost (docs/doctor.md)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from rmqkit.cli.common import run_async, seconds, seconds_option, settings_from, topology_option
from rmqkit.cli.render import print_json, stdout
from rmqkit.cli.topology import ViaChoice
from rmqkit.durations import is_zero_duration
from rmqkit.errors import UsageError
from rmqkit.health.doctor import DoctorReport, run_doctor
from rmqkit.health.upgrade import parse_target
from rmqkit.topology import load_topology

_TOPOLOGY_HELP = (
    "Topology file: also report where the broker is out of sync with it (as `plan`), "
    "and take queue roles and handler timeouts from it."
)
# The idempotent-consumer store check (issue 13): off unless --dedupe names a store.
DEDUPE_OPT = typer.Option(
    None,
    "--dedupe",
    metavar="DSN",
    help="Also check this idempotent-consumer store (`consume --dedupe`): its window must "
    "outlast the longest retry path plus --replay-horizon.",
)
HORIZON_OPT = typer.Option(
    None,
    "--replay-horizon",
    help="With --dedupe: how long parked messages may wait before they are replayed, "
    "e.g. 3d (what your runbook promises).",
)
_STYLE = {"critical": "bold red", "warning": "yellow", "ok": "green", "skipped": "dim"}


def _sample_s(text: str) -> float:
    """--growth-sample in seconds; 0 (no second read) is allowed here, unlike other durations."""
    return 0.0 if is_zero_duration(text) else seconds(text, "--growth-sample")


def doctor(
    ctx: typer.Context,
    topology: Path | None = topology_option(_TOPOLOGY_HELP),
    via: ViaChoice = typer.Option(
        ViaChoice.policy,
        "--via",
        help="How the topology file was declared (`rmqkit declare --via`), for --topology.",
    ),
    handler_timeout: str | None = typer.Option(
        None,
        "--handler-timeout",
        help="The consumers' handler timeout, checked against each work queue's consumer "
        "timeout (default: the topology's handler_timeout, else the consumer default 30s).",
    ),
    growth_sample: str = typer.Option(
        "1s",
        "--growth-sample",
        help="Read idle queues' ready counts twice this far apart to see them grow "
        "(0: judge from management rates only).",
    ),
    dedupe: str | None = DEDUPE_OPT,
    replay_horizon: str | None = HORIZON_OPT,
    target: str | None = typer.Option(
        None,
        "--target",
        metavar="VERSION",
        help="Upgrade preflight instead of the checklist: what RabbitMQ VERSION (4.3) "
        "refuses or changes for this vhost.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Check the vhost against the reliability checklist: dead-letter wiring, parking queues,
    unroutable and transient messages, unbounded or unconsumed queues, timeouts.

    With --target 4.3: the upgrade preflight instead, what 4.3 refuses or changes here.

    Each finding names its check, severity, object, evidence and fix (docs/doctor.md).
    Exit codes follow the Nagios plugin convention: 0 ok · 1 warning · 2 critical.
    Failing to reach the broker keeps rmqkit's codes (69 unreachable, 77 access refused).
    Statistics the broker does not keep are tolerated: those checks are skipped.
    """
    settings = settings_from(ctx)
    if replay_horizon is not None and dedupe is None:
        raise UsageError("--replay-horizon goes with --dedupe DSN")
    upgrade_to = parse_target(target) if target is not None else None
    if upgrade_to is not None and (dedupe is not None or handler_timeout is not None):
        raise UsageError(
            "--target is the upgrade preflight: it takes no --dedupe or --handler-timeout"
        )
    spec = load_topology(topology) if topology is not None else None
    report = run_async(
        run_doctor(
            settings,
            topology=spec,
            via="policy" if via == ViaChoice.policy else "arguments",
            handler_timeout_s=seconds_option(handler_timeout, "--handler-timeout"),
            sample_interval_s=_sample_s(growth_sample),
            dedupe_dsn=dedupe,
            replay_horizon_s=seconds_option(replay_horizon, "--replay-horizon", days=True),
            target=upgrade_to,
        )
    )
    if as_json:
        print_json(report.as_dict())
    elif stdout.is_terminal:
        _print_table(report)
    else:
        _print_lines(report)
    raise typer.Exit(report.exit_code)


def _summary(report: DoctorReport) -> str:
    counts = report.counts()
    version = ".".join(map(str, report.broker_version))
    label = {"ok": "OK", "warning": "WARNING", "critical": "CRITICAL"}[report.status]
    detail = (
        f"{counts['critical']} critical, {counts['warning']} warning(s)"
        if report.findings
        else "no problems found"
    )
    upgrade = (
        "" if report.target is None else f", preflight for {'.'.join(map(str, report.target))}"
    )
    return f"DOCTOR {label}: {detail} — vhost {report.vhost!r}, RabbitMQ {version}{upgrade}"


def _skipped(report: DoctorReport) -> list[str]:
    return [f"{c.id}: {c.note}" for c in report.checks if c.status == "skipped"]


def _print_lines(report: DoctorReport) -> None:
    """Piped: the summary line, then one greppable line per finding, never wrapped.

    Nagios (NRPE) reads a plugin's FIRST line of stdout as its status: the summary leads."""
    print(_summary(report), flush=True)
    for f in report.findings:
        print(f"{f.severity.upper()}\t{f.check}\t{f.kind} {f.object}\t{f.evidence}\tfix: {f.fix}")
    for line in _skipped(report):
        print(f"SKIPPED\t{line}")


def _print_table(report: DoctorReport) -> None:
    style = _STYLE[report.status]
    stdout.print(f"[{style}]{_summary(report)}[/{style}]", highlight=False)  # first, as piped
    if report.findings:
        table = Table(title=f"vhost {report.vhost!r}", title_justify="left")
        table.add_column("severity")
        table.add_column("check")
        table.add_column("object", overflow="fold")
        table.add_column("evidence / fix", overflow="fold")
        for f in report.findings:
            style = _STYLE[f.severity]
            table.add_row(
                f"[{style}]{f.severity}[/{style}]",
                f.check,
                f"{f.kind} {f.object}",
                f"{f.evidence}\n[bold]fix:[/bold] {f.fix}",
            )
        stdout.print(table)
    checks = Table(title="checks", title_justify="left", show_header=False, box=None)
    for c in report.checks:
        style = _STYLE[c.status]
        checks.add_row(f"[{style}]{c.status}[/{style}]", c.id, c.note)
    stdout.print(checks)

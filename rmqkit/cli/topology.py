"""`rmqkit declare | plan | export`: topology files against the broker.

The file is named as on every other command, ``--topology/-t FILE``; these three also take it
as their first argument (the older form, kept so existing scripts and runbooks work).
"""

from __future__ import annotations

import asyncio
import json
import shlex
from collections import Counter
from enum import StrEnum
from pathlib import Path
from typing import Literal

import typer

from rmqkit.broker.amqp import connection, parse_version, server_version
from rmqkit.cli.common import run_async, settings_from, topology_option
from rmqkit.cli.render import (
    changes_summary_line,
    plan_dict,
    print_json,
    print_plan,
    print_work_queues,
    stderr,
    stdout,
    summary_line,
)
from rmqkit.errors import ConfigError, ExitCode, Interrupted, RmqkitError, UsageError
from rmqkit.fileout import check_output, output_mode, write_file
from rmqkit.settings import Settings
from rmqkit.topology import (
    Topology,
    declare_topology,
    export_definitions,
    load_topology,
    plan_topology,
)
from rmqkit.topology.progress import topology_presence

FILE_ARG = typer.Argument(
    None,
    help="Topology file (TOML), e.g. topologies/orders.toml; the same as --topology FILE.",
    show_default=False,
    metavar="FILE",
)
FILES_ARG = typer.Argument(
    None,
    help="Topology file(s) (TOML), e.g. topologies/orders.toml; the same as --topology FILE. "
    "Several files meant for one vhost are taken together: each file's objects are not the "
    "others' orphans.",
    show_default=False,
    metavar="FILE",
)
TOPOLOGIES_OPT = typer.Option(
    None,
    "--topology",
    "-t",
    help="Topology file (TOML), as on every rmqkit command; repeat it for several files meant "
    "for one vhost. The file may also be given as the first argument.",
    show_default=False,
    metavar="FILE",
)
TOPOLOGY_OPT = topology_option(
    "Topology file (TOML), as on every rmqkit command; may also be given as the first argument."
)


def topology_files(positional: list[Path] | None, option: list[Path] | None) -> list[Path]:
    """The files named positionally and with --topology/-t, in that order, each once."""
    files: list[Path] = []
    for path in [*(positional or []), *(option or [])]:
        if path not in files:
            files.append(path)
    if not files:
        raise UsageError("no topology file: give --topology FILE (or FILE as the first argument)")
    return files


def topology_file(positional: Path | None, option: Path | None) -> Path:
    """The one file ``export`` takes, named either way (both: they must be the same)."""
    if positional is not None and option is not None and positional != option:
        raise UsageError(
            f"two topology files ({positional} and --topology {option}): export takes one"
        )
    found = option or positional
    if found is None:
        raise UsageError("no topology file: give --topology FILE (or FILE as the first argument)")
    return found


class ViaChoice(StrEnum):
    policy = "policy"
    arguments = "arguments"


VIA_OPT = typer.Option(
    ViaChoice.policy,
    "--via",
    help="Where mutable settings go: 'policy' (default; changeable later without deleting "
    "queues) or 'arguments' (x-arguments, for brokers without the management plugin).",
)

VERSION_OPT = typer.Option(
    None,
    "--broker-version",
    help="Target RabbitMQ version, e.g. 3.13 or 4.1 (default: asked from the broker).",
)


def _via(value: ViaChoice) -> Literal["policy", "arguments"]:
    return "policy" if value == ViaChoice.policy else "arguments"


def declare(
    ctx: typer.Context,
    files: list[Path] | None = FILES_ARG,
    topology_opt: list[Path] | None = TOPOLOGIES_OPT,
    via: ViaChoice = VIA_OPT,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the actions, change nothing."),
    create_vhost: bool = typer.Option(
        False,
        "--create-vhost",
        help="Create the vhost RMQKIT_URL names if it does not exist (needs the administrator "
        "tag), then declare into it: a fresh environment in one command.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Make the broker match the topology file(s); nothing changes if a conflict exists (65).

    The file's [vhost.permissions] are applied last, after every object exists."""
    settings = settings_from(ctx)
    named = topology_files(files, topology_opt)
    topology = [load_topology(file) for file in named]
    try:
        result = run_async(
            declare_topology(
                settings, topology, via=_via(via), dry_run=dry_run, create_vhost=create_vhost
            )
        )
    except Interrupted:
        if dry_run:
            raise Interrupted(
                "interrupted: --dry-run changes nothing; nothing was changed"
            ) from None
        rerun = "rmqkit declare " + " ".join(shlex.quote(str(f)) for f in named)
        rerun += " --via arguments" if via == ViaChoice.arguments else ""
        raise Interrupted(_interrupted_declare(settings, topology, _via(via), rerun)) from None
    plan = result.plan
    if as_json:
        print_json({**plan_dict(plan), "dry_run": dry_run, "applied": len(result.applied)})
        return
    if not result.applied:
        stdout.print(
            f"No changes: the broker already matches {plan.source} "
            f"({len(plan.in_sync)} objects in sync).",
            highlight=False,
        )
    else:
        verb = "Would apply" if dry_run else "Applied"
        print_plan(plan, show_in_sync=False, title=f"{verb} to vhost {plan.vhost!r}:")
        stdout.print(f"{verb}: {summary_line(plan)}.", highlight=False)
    for change in plan.changes:
        if change.action == "orphan":
            stderr.print(f"note: {change.kind} {change.name}: {change.detail}", highlight=False)
    if not result.verified:
        stderr.print(
            "note: no management API — existing objects were redeclared and checked "
            "by the broker, not compared"
        )


def _interrupted_declare(
    settings: Settings, topology: list[Topology], via: Literal["policy", "arguments"], rerun: str
) -> str:
    """The line of a `declare` stopped by Ctrl-C: how many of the topology's objects the broker
    holds now and which it does not (by name, from the management API), and that a rerun is
    safe."""
    again = f"rerun `{rerun}`: it is idempotent, it declares only what is missing"
    try:
        found = run_async(asyncio.wait_for(topology_presence(settings, topology, via=via), 10))
    except (RmqkitError, TimeoutError, KeyboardInterrupt):  # no API, or Ctrl-C again
        return (
            "interrupted: part of the topology may be declared (exchanges, then policies, then "
            f"queues, then bindings) — {again}"
        )
    if not found.missing:
        return f"interrupted, after everything was declared: all {found.total} objects exist"
    counts = Counter(kind for kind, _ in found.missing)
    kinds = ", ".join(f"{n} {_plural(kind, n)}" for kind, n in counts.items())
    kind, name = found.missing[0]
    return (
        f"interrupted: {found.present} of the topology's {found.total} objects exist, not yet "
        f"declared: {kinds} (e.g. {kind} {name!r}) — {again}"
    )


def _plural(kind: str, n: int) -> str:
    if n == 1:
        return kind
    return kind[:-1] + "ies" if kind.endswith("y") else kind + "s"


def plan(
    ctx: typer.Context,
    files: list[Path] | None = FILES_ARG,
    topology_opt: list[Path] | None = TOPOLOGIES_OPT,
    via: ViaChoice = VIA_OPT,
    show_all: bool = typer.Option(
        False, "--all", help="List the objects already in sync too (default: changes only)."
    ),
    as_json: bool = typer.Option(
        False,
        "--json",
        help="Print the plan as JSON: every object and its action, in sync or not.",
    ),
) -> None:
    """Show what `declare` would do: the objects to create or change, conflicts, orphans.

    Several files meant for one vhost are planned together (their union is what rmqkit owns).
    Objects already in sync are counted on the last line; --all lists them too.
    Exit codes (like `terraform plan -detailed-exitcode`): 0 in sync · 2 changes pending ·
    65 conflicts (the broker would reject the change or silently ignore it).
    """
    settings = settings_from(ctx)
    topology = [load_topology(file) for file in topology_files(files, topology_opt)]
    result = run_async(plan_topology(settings, topology, via=_via(via)))
    if as_json:
        print_json(plan_dict(result))
    else:
        title = f"{result.source} against vhost {result.vhost!r}:"
        print_plan(result, show_in_sync=show_all, title=title)
        print_work_queues(result)
        last = summary_line(result) if show_all else changes_summary_line(result)
        stdout.print(last + ".", highlight=False)
    if result.conflicts:
        if not as_json:
            stderr.print(f"rmqkit: {len(result.conflicts)} conflict(s); see 'fix' above")
        raise typer.Exit(ExitCode.DATA)
    raise typer.Exit(ExitCode.CHANGES_PENDING if result.pending else ExitCode.OK)


def export(
    ctx: typer.Context,
    file: Path | None = FILE_ARG,
    topology_opt: Path | None = TOPOLOGY_OPT,
    via: ViaChoice = VIA_OPT,
    vhost: str | None = typer.Option(
        None, "--vhost", help="Vhost to put in the definitions (default: the one RMQKIT_URL names)."
    ),
    broker_version: str | None = VERSION_OPT,
    output: Path | None = typer.Option(None, "--output", "-o", help="Write to a file."),
    force: bool = typer.Option(False, "--force", help="Replace the --output file if it exists."),
) -> None:
    """Print the topology file as RabbitMQ definitions JSON for `rabbitmqctl import_definitions`.
    With --output an existing file is refused unless --force; the file appears complete or
    not at all (exit 74 if it cannot be written)."""
    path = topology_file(file, topology_opt)
    settings = settings_from(ctx)
    mode = output_mode(force=force, append=False)
    if output is not None:
        check_output(output, mode)  # before asking the broker anything
    elif force:
        raise UsageError("--force needs --output FILE")
    topology = load_topology(path)
    if broker_version is not None:
        version = parse_version(broker_version)
    else:
        version = run_async(_ask_version(settings))
    document = export_definitions(
        topology, vhost=vhost or settings.vhost, broker_version=version, via=_via(via)
    )
    text = json.dumps(document, indent=2) + "\n"
    if output is None:
        print(text, end="")
    else:
        write_file(output, text, mode)
        stderr.print(f"wrote {output}", highlight=False)


async def _ask_version(settings: object) -> tuple[int, int, int]:
    from rmqkit.settings import Settings

    assert isinstance(settings, Settings)
    try:
        async with connection(settings, name="rmqkit export") as conn:
            return server_version(conn)
    except RmqkitError as exc:
        raise ConfigError(
            f"cannot ask the broker its version ({exc}) — pass --broker-version, e.g. 4.1"
        ) from None

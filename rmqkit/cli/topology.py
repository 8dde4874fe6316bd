"""`rmqkit declare | plan | export`: topology files against the broker."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Literal

import typer

from rmqkit.broker.amqp import connection, parse_version, server_version
from rmqkit.cli.common import run_async, settings_from
from rmqkit.cli.render import (
    changes_summary_line,
    plan_dict,
    print_json,
    print_plan,
    stderr,
    stdout,
    summary_line,
)
from rmqkit.errors import ConfigError, ExitCode, RmqkitError, UsageError
from rmqkit.fileout import check_output, output_mode, write_file
from rmqkit.topology import declare_topology, export_definitions, load_topology, plan_topology

FILE_ARG = typer.Argument(..., help="Topology file (TOML), e.g. topologies/orders.toml.")
FILES_ARG = typer.Argument(
    ...,
    help="Topology file(s) (TOML), e.g. topologies/orders.toml. Several files meant for one "
    "vhost are taken together: each file's objects are not the others' orphans.",
)


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
    files: list[Path] = FILES_ARG,
    via: ViaChoice = VIA_OPT,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the actions, change nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Make the broker match FILE(s). Stops before changing anything if a conflict exists (65)."""
    settings = settings_from(ctx)
    topology = [load_topology(file) for file in files]
    result = run_async(declare_topology(settings, topology, via=_via(via), dry_run=dry_run))
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


def plan(
    ctx: typer.Context,
    files: list[Path] = FILES_ARG,
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
    """Show what `declare FILE` would do: the objects to create or change, conflicts, orphans.

    Several files meant for one vhost are planned together (their union is what rmqkit owns).
    Objects already in sync are counted on the last line; --all lists them too.
    Exit codes (like `terraform plan -detailed-exitcode`): 0 in sync · 2 changes pending ·
    65 conflicts (the broker would reject the change or silently ignore it).
    """
    settings = settings_from(ctx)
    topology = [load_topology(file) for file in files]
    result = run_async(plan_topology(settings, topology, via=_via(via)))
    if as_json:
        print_json(plan_dict(result))
    else:
        title = f"{result.source} against vhost {result.vhost!r}:"
        print_plan(result, show_in_sync=show_all, title=title)
        last = summary_line(result) if show_all else changes_summary_line(result)
        stdout.print(last + ".", highlight=False)
    if result.conflicts:
        if not as_json:
            stderr.print(f"rmqkit: {len(result.conflicts)} conflict(s); see 'fix' above")
        raise typer.Exit(ExitCode.DATA)
    raise typer.Exit(ExitCode.CHANGES_PENDING if result.pending else ExitCode.OK)


def export(
    ctx: typer.Context,
    file: Path = FILE_ARG,
    via: ViaChoice = VIA_OPT,
    vhost: str | None = typer.Option(
        None, "--vhost", help="Vhost to put in the definitions (default: the one RMQKIT_URL names)."
    ),
    broker_version: str | None = VERSION_OPT,
    output: Path | None = typer.Option(None, "--output", "-o", help="Write to a file."),
    force: bool = typer.Option(False, "--force", help="Replace the --output file if it exists."),
) -> None:
    """Print FILE as RabbitMQ definitions JSON for `rabbitmqctl import_definitions`.
    With --output an existing file is refused unless --force; the file appears complete or
    not at all (exit 74 if it cannot be written)."""
    settings = settings_from(ctx)
    mode = output_mode(force=force, append=False)
    if output is not None:
        check_output(output, mode)  # before asking the broker anything
    elif force:
        raise UsageError("--force needs --output FILE")
    topology = load_topology(file)
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

"""`rmqkit parking archive | restore`: set parked messages aside in the parking queue's
archive queue, and bring them back, each moved as a replay is (confirmed copy, then ack)."""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

import typer

from rmqkit.cli.common import run_async, settings_from
from rmqkit.cli.parking_options import Selection, explain_no_match, filtered, progress_bar
from rmqkit.cli.render import stderr
from rmqkit.errors import Interrupted, PartialSuccess
from rmqkit.names import archive_queue
from rmqkit.parking.archive import archive_parked, restore_archived
from rmqkit.parking.moves import MoveReport

LIMIT_OPT = typer.Option(None, "--limit", min=1, help="Move at most N.")
DRY_RUN_OPT = typer.Option(False, "--dry-run", help="Count what would move, change nothing.")
JSON_OPT = typer.Option(False, "--json", help="The counts as one JSON object on stdout.")


@filtered
def archive_cmd(
    ctx: typer.Context,
    sel: Selection,
    limit: int | None = LIMIT_OPT,
    dry_run: bool = DRY_RUN_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Move parked messages (all, or those matching the filters: e.g. --group ID) to the
    parking queue's archive queue (<parking>.archive, declared by the topology's
    `archive = "30d"`), each acked only after its copy is confirmed; they are kept there for
    the archive's retention. `parking restore` brings them back. Exit 3 if some could not be
    moved (they stay parked). Safe to interrupt and rerun."""
    _move(ctx, sel, archive_parked, "archived", archive_queue(sel.queue), limit, dry_run, as_json)


@filtered
def restore_cmd(
    ctx: typer.Context,
    sel: Selection,
    limit: int | None = LIMIT_OPT,
    dry_run: bool = DRY_RUN_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Move archived messages (all, or those matching the filters) from the parking queue's
    archive queue back into the parking queue, each acked only after its copy is confirmed.
    Give the parking queue, as to the other parking commands. Exit 3 if some could not be
    moved (they stay archived). Safe to interrupt and rerun."""
    _move(ctx, sel, restore_archived, "restored", sel.queue, limit, dry_run, as_json)


Mover = Callable[..., Coroutine[Any, Any, MoveReport]]


def _move(
    ctx: typer.Context,
    sel: Selection,
    mover: Mover,
    verb: str,
    target: str,
    limit: int | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    settings = settings_from(ctx)
    progress, update = progress_bar(verb.removesuffix("d") + "ing")
    report = MoveReport()
    with progress, _interrupted(report, verb, dry_run):
        run_async(
            mover(
                settings,
                sel.queue,
                sel.flt,
                dry_run=dry_run,
                limit=limit,
                progress=update,
                report=report,
            )
        )
    explain_no_match(sel, report.selected)
    count = len(report.plan) if dry_run else report.moved
    if as_json:
        print(json.dumps({**report.as_dict(verb), "dry_run": dry_run, "target": target}))
    else:
        done = f"would have {verb}" if dry_run else verb
        stderr.print(
            f"{done} {count} of {report.selected} selected into {target}; returned "
            f"{report.returned}, failed {report.failed}",
            highlight=False,
        )
        for problem, n in report.problems.items():
            stderr.print(f"  {n} x {problem}", highlight=False)
    if not dry_run and report.partial:
        raise PartialSuccess(
            f"{report.selected - report.moved} of {report.selected} message(s) could not be "
            f"{verb} and stay where they were — see the problems above"
        )


@contextmanager
def _interrupted(report: MoveReport, verb: str, dry_run: bool) -> Iterator[None]:
    """Ctrl-C: say what was done and that running it again continues."""
    try:
        yield
    except Interrupted:
        if dry_run:
            raise
        raise Interrupted(
            f"interrupted: {verb} {report.moved} (confirmed) of {report.selected} selected so "
            "far; the others stay where they were — run the same command again to move what is "
            "left"
        ) from None

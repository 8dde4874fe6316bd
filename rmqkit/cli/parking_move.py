"""`rmqkit parking replay | purge | export | import`: the commands that move parked messages
(out of the queue, into a file, or from a file into a queue), never losing one."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer

from rmqkit.cli.common import confirm, run_async, seconds_option, settings_from
from rmqkit.cli.completion import complete_queue
from rmqkit.cli.keyring_settings import require_keyring
from rmqkit.cli.parking_options import (
    Selection,
    explain_no_match,
    filtered,
    progress_bar,
    read_ids,
)
from rmqkit.cli.render import stderr
from rmqkit.errors import ExitCode, Interrupted, PartialSuccess, UsageError
from rmqkit.fileout import SafeOutput, check_output, output_mode
from rmqkit.parking.journal import ImportJournal
from rmqkit.parking.moves import MoveReport
from rmqkit.parking.ops import PurgeResult, purge_parked
from rmqkit.parking.replay import replay_parked
from rmqkit.parking.transfer import export_parked, import_records, read_export


@filtered
def replay_cmd(
    ctx: typer.Context,
    sel: Selection,
    to_exchange: str | None = typer.Option(
        None,
        "--to-exchange",
        help="Send to this exchange instead, routed with each message's original routing key "
        "(a message with none stays parked) unless --routing-key is given.",
    ),
    routing_key: str | None = typer.Option(
        None,
        "--routing-key",
        help="Route with this key (on the default exchange, a key is a queue name).",
    ),
    rate: float | None = typer.Option(None, "--rate", min=0.01, help="Messages per second."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Replay at most N."),
    batch: int | None = typer.Option(
        None, "--batch", min=1, help="In waves of N: each confirmed, then --pause."
    ),
    pause: str | None = typer.Option(
        None, "--pause", help="With --batch: the wait between waves, e.g. 30s."
    ),
    max_replays: int | None = typer.Option(
        None,
        "--max-replays",
        min=1,
        help="Leave parked (held back) the messages already replayed this many times.",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan, change nothing."),
    as_json: bool = typer.Option(
        False,
        "--json",
        help="The summary as one JSON object on stdout (with --dry-run, the plan in it).",
    ),
) -> None:
    """Send parked messages back to the queue they failed in, each acked only after the
    broker confirmed its copy. Attempts start afresh; the failure history is kept.
    Exit 3 if some could not be replayed (they stay parked). Safe to interrupt and rerun."""
    if pause is not None and batch is None:
        raise UsageError("--pause needs --batch N (the size of a wave)")
    pause_s = seconds_option(pause, "--pause") or 0.0
    settings = settings_from(ctx)
    progress, update = progress_bar("replaying")
    report = MoveReport()
    with progress, _interrupted_replay(report, sel.queue, dry_run):
        run_async(
            replay_parked(
                settings,
                sel.queue,
                sel.flt,
                to_exchange=to_exchange,
                routing_key=routing_key,
                dry_run=dry_run,
                rate=rate,
                limit=limit,
                progress=update,
                report=report,
                max_replays=max_replays,
                batch=batch,
                pause_s=pause_s,
            )
        )
    explain_no_match(sel, report.selected + report.held_back)
    if as_json:  # only JSON on stdout: a dry run's plan goes in it
        document = {**report.as_dict("replayed"), "dry_run": dry_run}
        if dry_run:
            document["plan"] = [
                {"message_id": message_id, "exchange": exchange, "routing_key": key}
                for message_id, exchange, key in report.plan
            ]
        print(json.dumps(document))
    else:
        for message_id, exchange, key in report.plan if dry_run else ():
            print(
                f"would replay {message_id or '-'} → exchange {exchange or '(default)'!s} key {key}"
            )
        verb = "would replay" if dry_run else "replayed"
        count = len(report.plan) if dry_run else report.moved
        stderr.print(
            f"{verb} {count} of {report.selected} selected; returned {report.returned}, "
            f"failed {report.failed}, skipped {report.skipped}"
            + (
                f"; held back {report.held_back} (replayed {max_replays} times already)"
                if report.held_back
                else ""
            ),
            highlight=False,
        )
        _print_problems(report.problems)
    if not dry_run and report.partial:
        raise PartialSuccess(
            f"{report.selected - report.moved} of {report.selected} message(s) could not be "
            "replayed and stay parked — see the problems above"
        )


@contextmanager
def _interrupted_replay(report: MoveReport, queue: str, dry_run: bool) -> Iterator[None]:
    """Ctrl-C during a replay: say what was done and what is left, not only "interrupted"."""
    try:
        yield
    except Interrupted:
        if dry_run:
            raise
        unseen = max(report.queue_total - report.seen, 0)
        raise Interrupted(
            f"interrupted: replayed {report.moved} (confirmed) of {report.selected} selected "
            f"so far; {report.selected - report.moved} selected not confirmed and "
            f"{unseen} of the {report.queue_total} message(s) in {queue!r} not looked at stay "
            "parked — run the same command again to replay what is left"
        ) from None


def _print_problems(problems: dict[str, int]) -> None:
    for problem, n in problems.items():
        stderr.print(f"  {n} x {problem}", highlight=False)


@filtered
def purge_cmd(
    ctx: typer.Context,
    sel: Selection,
    ids_from: Path | None = typer.Option(
        None,
        "--ids-from",
        help="Only these message_ids: a `list --json` output or one id a line ('-': stdin).",
    ),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Purge at most N."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Count what would be purged."),
) -> None:
    """Delete parked messages: all, or those matching the filters. Asks first unless --yes,
    and then deletes only the messages it counted: ones parked while it asked stay. Where it
    cannot ask (--non-interactive, RMQKIT_NON_INTERACTIVE=1, stdin not a terminal) it refuses
    without --yes (exit 64) and deletes nothing."""
    settings = settings_from(ctx)
    name, flt = sel.queue, sel.flt
    if ids_from is not None:
        flt = dataclasses.replace(flt, ids=flt.ids | read_ids(ids_from))
    if dry_run or not yes:
        counted = run_async(purge_parked(settings, name, flt, dry_run=True, limit=limit))
        explain_no_match(sel, counted.count)
        if dry_run:
            print(f"would purge {counted.count} message(s) from {name}")
            return
        if counted.count == 0:
            print(f"nothing to purge in {name}")
            return
        question = f"Purge {counted.count} message(s) from {name}?"
        if not confirm(ctx, question, f"purge {counted.count} message(s) from {name}"):
            raise typer.Exit(ExitCode.OK)
        purged = PurgeResult()
        with _interrupted_purge(purged, name):
            run_async(purge_parked(settings, name, flt, only=counted.identities, result=purged))
        gone = counted.count - purged.count
        print(
            f"purged {purged.count} message(s) from {name}"
            + (f" ({gone} of those counted were no longer there)" if gone else "")
        )
        return
    purged = PurgeResult()
    with _interrupted_purge(purged, name):
        run_async(purge_parked(settings, name, flt, limit=limit, result=purged))
    explain_no_match(sel, purged.count)
    print(f"purged {purged.count} message(s) from {name}")


@contextmanager
def _interrupted_purge(purged: PurgeResult, queue: str) -> Iterator[None]:
    """Ctrl-C during a purge: say how many were removed and that the rest stay parked."""
    try:
        yield
    except Interrupted:
        raise Interrupted(
            f"interrupted: purged {purged.count} message(s) from {queue!r} so far; the rest "
            f"stay parked (`rmqkit parking stats {queue}` counts them)"
        ) from None


@filtered
def export_cmd(
    ctx: typer.Context,
    sel: Selection,
    output: Path | None = typer.Option(None, "--output", "-o", help="Write to FILE, not stdout."),
    force: bool = typer.Option(False, "--force", help="Replace FILE if it exists."),
    append: bool = typer.Option(False, "--append", help="Add to the end of FILE."),
    remove: bool = typer.Option(
        False,
        "--remove",
        help="Remove each exported message, once its line is on disk (needs --output).",
    ),
    decrypt: bool = typer.Option(
        False,
        "--decrypt",
        help="Write encrypted fields decrypted (needs the key ring; the file then holds "
        "personal data). Default: the ciphertext as stored.",
    ),
) -> None:
    """Write parked messages as NDJSON that round-trips exactly (docs/export-format.md).
    The queue keeps them unless --remove. An existing FILE is refused unless --force or
    --append; FILE appears only when complete (with --remove: before the first removal).
    A write error (disk full): exit 74, the file holds exactly the removed messages.
    Encrypted fields are written as stored (ciphertext) unless --decrypt."""
    settings = settings_from(ctx)
    name, flt = sel.queue, sel.flt
    mode = output_mode(force=force, append=append)
    if output is None and (remove or force or append):
        raise UsageError("--remove, --force and --append need --output FILE")
    if decrypt and remove:
        # the file would be the only copy left, and in plaintext: an import would bring the
        # messages back without their encryption
        raise UsageError(
            "--decrypt with --remove would keep only a plaintext copy: export "
            "--decrypt without --remove, or --remove without --decrypt"
        )
    ring = require_keyring(settings, "--decrypt") if decrypt else None
    progress, update = progress_bar("exporting")
    if output is None:
        with progress:
            report = run_async(
                export_parked(settings, name, flt, sys.stdout, progress=update, keyring=ring)
            )
    else:
        check_output(output, mode)  # before touching the queue
        with SafeOutput(output, mode) as sink, progress:
            report = run_async(
                export_parked(
                    settings, name, flt, sink, remove=remove, progress=update, keyring=ring
                )
            )
    explain_no_match(sel, report.written)
    stderr.print(
        f"exported {report.written} message(s) from {name}"
        + (f" to {output}" if output is not None else "")
        + (f", removed {report.removed}" if remove else "; the queue keeps them"),
        highlight=False,
    )
    if decrypt:
        stderr.print(
            "warning: --decrypt: the export holds the encrypted fields in plaintext (personal "
            "data): keep it as you would the key ring, and delete it when done",
            highlight=False,
        )


def import_cmd(
    ctx: typer.Context,
    file: Path = typer.Argument(..., help="NDJSON written by `rmqkit parking export`."),
    queue: str = typer.Argument(
        ..., help="Queue to publish into (default exchange).", autocompletion=complete_queue
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Skip the records an earlier import confirmed (its journal)."
    ),
    again: bool = typer.Option(
        False, "--again", help="Publish every record, even ones imported before (duplicates)."
    ),
) -> None:
    """Publish an export file into QUEUE with confirms. The whole file is checked first,
    property values included (a bad line: exit 65 naming it, nothing published); exit 3 if
    some were not confirmed. Each confirmed record goes into a journal beside FILE, so an
    import that stopped is continued with --resume, without duplicates."""
    settings = settings_from(ctx)
    if resume and again:
        raise UsageError("give --resume or --again, not both")
    records = read_export(file)
    journal = ImportJournal(file, settings.vhost, queue)
    progress, update = progress_bar("importing")
    with progress:
        report = run_async(
            import_records(
                settings,
                records,
                queue,
                journal=journal,
                resume=resume,
                again=again,
                source=str(file),
                progress=update,
            )
        )
    stderr.print(
        f"imported {report.published} of {report.records} message(s) into {queue}"
        + (f" ({report.skipped} imported before, skipped)" if report.skipped else "")
        + (f"; returned {report.returned}, nacked {report.nacked}" if report.partial else ""),
        highlight=False,
    )
    _print_problems(report.problems)
    if report.partial:
        missing = report.records - report.published - report.skipped
        raise PartialSuccess(
            f"{missing} message(s) were not confirmed — fix the cause and run the same import "
            f"with --resume (the journal {journal.path} says what is in {queue} already)"
        )

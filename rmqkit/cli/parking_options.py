"""Options and helpers shared by the `rmqkit parking` commands (rmqkit/cli/parking*.py).

The one definition of the parking queue and filter options (``filtered``), the progress bar,
the browse warnings and the ``--ids-from`` reader."""

from __future__ import annotations

import functools
import inspect
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, get_type_hints

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rmqkit.cli.common import seconds_option, settings_from
from rmqkit.cli.completion import complete_queue, complete_reason
from rmqkit.cli.keyring_settings import require_keyring
from rmqkit.cli.render import stderr
from rmqkit.crypto import KeyRing, Matcher
from rmqkit.errors import ConfigError, DataError, UsageError
from rmqkit.parking.browse import BrowseStats
from rmqkit.parking.model import KNOWN_REASONS, ParkedFilter
from rmqkit.topology import load_topology

QUEUE_ARG = typer.Argument(
    None,
    help="Parking queue (or use --topology FILE --queue WORK).",
    autocompletion=complete_queue,
)
TOPOLOGY_OPT = typer.Option(None, "--topology", "-t", help="Topology file naming the queue.")
WORK_OPT = typer.Option(
    None,
    "--queue",
    "-q",
    help="Work queue whose parking queue to use.",
    autocompletion=complete_queue,
)
REASON_OPT = typer.Option(
    [],
    "--reason",
    help="permanent, exhausted, undecodable, delivery_limit, … (repeatable)",
    autocompletion=complete_reason,
)
ERROR_OPT = typer.Option(None, "--error-type", help="Error type glob, e.g. 'myapp.*Error'.")
ORIGIN_OPT = typer.Option(
    None, "--origin", help="Origin (work) queue.", autocompletion=complete_queue
)
OLDER_OPT = typer.Option(None, "--older-than", help="Last failure older than, e.g. 1h.")
NEWER_OPT = typer.Option(None, "--newer-than", help="Last failure newer than, e.g. 10m.")
HEADER_OPT = typer.Option([], "--header", help="Header equals value: K=V (repeatable).")
ID_OPT = typer.Option([], "--id", help="message_id (repeatable).")
GREP_OPT = typer.Option(None, "--grep", help="Body contains this text.")
GROUP_OPT = typer.Option(
    None, "--group", help="Failure group (`parking groups`): its id, or a prefix of it."
)
SINCE_OPT = typer.Option(
    None, "--since", help="Parked at or after: an ISO time (2026-12-01T09:00Z) or an age (2h)."
)
UNTIL_OPT = typer.Option(
    None, "--until", help="Parked before: an ISO time (2026-12-01T18:00Z) or an age (30m)."
)
MATCH_OPT = typer.Option(
    [],
    "--match",
    help="Encrypted (blind-indexed) or plain body field equals VALUE: FIELD=VALUE, e.g. "
    "tax_id=12345678901 (repeatable; compares blind indexes with the key ring, decrypts nothing).",
)
DECRYPT_OPT = typer.Option(
    False,
    "--decrypt",
    help="Show encrypted fields decrypted, with the key ring (RMQKIT_KEYRING_FILE / "
    "RMQKIT_KEYRING); default: [encrypted kid=…].",
)
REDACT_OPT = typer.Option(
    [], "--redact", help="Mask this field in bodies and headers (repeatable; case-insensitive)."
)


def parking_queue(
    name: str | None, topology: Path | None, work: str | None
) -> tuple[str, frozenset[str]]:
    """The parking queue name and the sensitive fields the topology declares for it."""
    if name and (topology or work):
        raise UsageError("give either a parking queue name or --topology FILE --queue WORK")
    if name:
        return name, frozenset()
    if topology is None or work is None:
        raise UsageError("name the parking queue, or give --topology FILE --queue WORK")
    spec = load_topology(topology)
    if work not in spec.model.queues:
        raise UsageError(f"{topology} has no work queue {work!r}")
    return spec.parking_name(work), frozenset(
        f.lower() for f in spec.model.queues[work].sensitive_fields
    )


def sensitive_for(topology: Path | None, parking: str) -> frozenset[str]:
    """The sensitive fields ``topology`` declares for the work queue whose parking queue is
    ``parking`` (none without a file); a file with no such parking queue is a usage error."""
    if topology is None:
        return frozenset()
    spec = load_topology(topology)
    for work, queue in spec.model.queues.items():
        if spec.parking_name(work) == parking:
            return frozenset(f.lower() for f in queue.sensitive_fields)
    raise UsageError(f"{topology} declares no work queue whose parking queue is {parking!r}")


def parked_filter(
    reason: list[str],
    error_type: str | None,
    origin: str | None,
    older_than: str | None,
    newer_than: str | None,
    header: list[str],
    ids: list[str],
    grep: str | None,
    match: list[str] = [],  # noqa: B006 - never mutated
    keyring: KeyRing | None = None,
    group: str | None = None,
    since: str | None = None,
    until: str | None = None,
) -> ParkedFilter:
    """The filter the options describe; an unknown ``--reason``, a bad ``--header`` or age is a
    usage error (exit 64), and so is a bad ``--match``."""
    unknown = sorted(set(reason) - KNOWN_REASONS)
    if unknown:
        raise UsageError(
            f"unknown --reason {', '.join(map(repr, unknown))}: use one of "
            + ", ".join(sorted(KNOWN_REASONS))
        )
    pairs = []
    for item in header:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--header wants K=V, got {item!r}")
        pairs.append((key, value))
    return ParkedFilter(
        reasons=frozenset(reason),
        error_type=error_type,
        origin=origin,
        older_than_s=seconds_option(older_than, "--older-than"),
        newer_than_s=seconds_option(newer_than, "--newer-than"),
        headers=tuple(pairs),
        ids=frozenset(ids),
        grep=grep.encode() if grep else None,
        match=tuple(_matcher(spec, keyring) for spec in match),
        group=_group(group),
        since=moment_option(since, "--since"),
        until=moment_option(until, "--until"),
    )


def _group(value: str | None) -> str | None:
    if value is None:
        return None
    if not re.fullmatch(r"[0-9a-fA-F]{1,12}", value):
        raise UsageError(f"--group wants a group id from `parking groups` (hex), got {value!r}")
    return value.lower()


def moment_option(value: str | None, option: str) -> datetime | None:
    """``value`` as a moment: an ISO-8601 time (UTC when it names no zone; a date is its
    midnight) or an age (``2h``: that long ago). A usage error (64) otherwise."""
    if value is None:
        return None
    text = value.strip()
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        try:
            seconds = seconds_option(text, option)
        except UsageError:
            raise UsageError(
                f"{option} wants an ISO time (2026-12-01T09:00Z) or an age (2h), got {value!r}"
            ) from None
        return datetime.now(UTC) - timedelta(seconds=seconds or 0.0)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _matcher(spec: str, keyring: KeyRing | None) -> Matcher:
    try:
        return Matcher.parse(spec, keyring)
    except ConfigError as exc:  # a mistyped option: a usage error (64), not a config one
        raise UsageError(str(exc)) from None


_FILTER_OPTIONS: tuple[tuple[str, Any, Any], ...] = (
    ("reason", list[str], REASON_OPT),
    ("error_type", str | None, ERROR_OPT),
    ("origin", str | None, ORIGIN_OPT),
    ("older_than", str | None, OLDER_OPT),
    ("newer_than", str | None, NEWER_OPT),
    ("header", list[str], HEADER_OPT),
    ("ids", list[str], ID_OPT),
    ("grep", str | None, GREP_OPT),
    ("match", list[str], MATCH_OPT),
    ("group", str | None, GROUP_OPT),
    ("since", str | None, SINCE_OPT),
    ("until", str | None, UNTIL_OPT),
)
_QUEUE_OPTIONS: tuple[tuple[str, Any, Any], ...] = (
    ("queue", str | None, QUEUE_ARG),
    ("topology", Path | None, TOPOLOGY_OPT),
    ("work", str | None, WORK_OPT),
)


@dataclass(frozen=True)
class Selection:
    """What a filtering command works on: the parking queue, the fields the topology marks
    sensitive in it, and the filter its messages must match."""

    queue: str
    sensitive: frozenset[str]
    flt: ParkedFilter


def _parameters(
    options: tuple[tuple[str, Any, Any], ...], kind: inspect._ParameterKind
) -> list[inspect.Parameter]:
    return [
        inspect.Parameter(name, kind, default=option, annotation=hint)
        for name, hint, option in options
    ]


def filtered(command: Callable[..., None]) -> Callable[..., None]:
    """Give ``command`` the parking queue (name, or --topology/--queue) and the shared filter
    options, the one definition of them; it receives them resolved as one ``sel: Selection``.

    The queue options take the place of ``sel`` in the command's signature (so in --help);
    the filter options come last.
    """
    hints = get_type_hints(command)
    own: list[inspect.Parameter] = []
    for p in inspect.signature(command).parameters.values():
        if p.name == "sel":
            own.extend(_parameters(_QUEUE_OPTIONS, p.kind))
        else:
            own.append(p.replace(annotation=hints[p.name]))
    every = own + _parameters(_FILTER_OPTIONS, inspect.Parameter.KEYWORD_ONLY)

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> None:
        options = {name: kwargs.pop(name) for name, _, _ in _FILTER_OPTIONS}
        if options["match"]:
            # A blind index is compared under the ring's index key: without it no encrypted
            # field could ever match, and "no match" would be a wrong answer, not an error.
            ctx = kwargs["ctx"] if "ctx" in kwargs else args[0]
            options["keyring"] = require_keyring(settings_from(ctx), "--match")
        flt = parked_filter(**options)
        where = {name: kwargs.pop(name) for name, _, _ in _QUEUE_OPTIONS}
        name, sensitive = parking_queue(where["queue"], where["topology"], where["work"])
        command(*args, sel=Selection(name, sensitive, flt), **kwargs)

    run.__signature__ = inspect.Signature(every)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in every}
    return run


def explain_no_match(sel: Selection, matched: int) -> None:
    """When filters matched nothing, say on stderr what the messages looked at do carry."""
    if matched or sel.flt.empty or not sel.flt.looked_at:
        return
    reasons = sorted({r for r, _ in sel.flt.looked_at if r is not None})
    types = sorted({t for _, t in sel.flt.looked_at if t is not None})
    stderr.print(
        f"no message in {sel.queue!r} matched the filters; present: reasons "
        f"{', '.join(reasons) or '(none)'}; error types {', '.join(types) or '(none)'}",
        highlight=False,
    )


def warn_browse(name: str, stats: BrowseStats) -> None:
    """Say on stderr which messages a browse could not show (held or taken by others)."""
    if stats.other_consumers:
        stderr.print(
            f"warning: {name!r} had {stats.other_consumers} other consumer(s) when the browse "
            "started: the messages they hold unacked are not shown",
            highlight=False,
        )
    if stats.missed:
        stderr.print(
            f"warning: {stats.missed} of the {stats.queue_count} message(s) in {name!r} at the "
            "start were taken by another consumer during the browse and not shown",
            highlight=False,
        )
    if not stats.settled:
        stderr.print(
            f"warning: the broker had not yet put back every browsed message of {name!r}; "
            "a command run right now may see fewer",
            highlight=False,
        )


def progress_bar(label: str) -> tuple[Progress, Any]:
    """A progress bar on stderr (hidden when it is not a terminal) and its update callback."""
    progress = Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=stderr,
        transient=True,
        disable=not stderr.is_terminal,
    )
    task = progress.add_task(label, total=None)

    def update(seen: int, total: int) -> None:
        progress.update(task, completed=seen, total=total)

    return progress, update


def read_ids(path: Path) -> frozenset[str]:
    """message_ids from a `list --json` output (or an export) or one id a line; exit 65 if
    a line names none: an empty id set would select every message."""
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot be read: {exc}") from None
    ids: set[str] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        found: object = line
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise DataError(f"{path}:{number}: not valid JSON ({exc})") from None
            found = obj.get("message_id") or (obj.get("properties") or {}).get("message_id")
        if not isinstance(found, str) or not found:
            raise DataError(f"{path}:{number}: no message_id (id-less messages cannot be named)")
        ids.add(found)
    if not ids:
        raise DataError(f"{path}: no message_id in it — nothing would be selected")
    return frozenset(ids)

"""`rmqkit status`: queue depths, consumers and rates, grouped per work queue."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.console import Group, JustifyMethod, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from rmqkit.broker.management import management
from rmqkit.cli.common import run_async, seconds, settings_from, topology_option
from rmqkit.cli.render import print_json, stderr, stdout
from rmqkit.durations import age_text
from rmqkit.errors import Interrupted
from rmqkit.health.status import (
    AGED_ROLES,
    QueueStatus,
    StatusReport,
    read_status,
    read_status_once,
)
from rmqkit.settings import Settings
from rmqkit.topology import Topology, load_topology

# Below the table when a row's oldest is "n/a": why, honestly, and what does give it.
OLDEST_NA = (
    "oldest n/a: the broker keeps no head-message timestamp for that queue (quorum queues never "
    "do; classic ones only for messages published with a timestamp), and reading the head "
    "message instead would spend a delivery attempt; --parking-age browses parking queues for it"
)

_TOPOLOGY_HELP = (
    "Show the topology's work, wait and parking queues, grouped per work queue "
    "(default: every queue of the vhost, grouped by their dead-letter wiring)."
)


def status(
    ctx: typer.Context,
    topology: Path | None = topology_option(_TOPOLOGY_HELP),
    as_json: bool = typer.Option(
        False, "--json", help="Print JSON (with --watch: one line per reading)."
    ),
    watch: bool = typer.Option(
        False,
        "--watch",
        "-w",
        help="Redraw until Ctrl-C (not on a terminal: one JSON line per reading).",
    ),
    interval: str = typer.Option("2s", "--interval", help="Time between --watch readings."),
    parking_age: bool = typer.Option(
        False,
        "--parking-age",
        help="Browse each non-empty parking queue for its oldest message's age (reads every "
        "parked message and returns them all in order; slow on a big queue).",
    ),
) -> None:
    """Per queue: ready, unacked, consumers, publish and deliver rates; parking size and
    (with --parking-age) the age of the oldest parked message. Rates need the broker's
    message stats; where it keeps none, they show as '-'."""
    settings = settings_from(ctx)
    spec = load_topology(topology) if topology is not None else None
    if not watch:
        report = run_async(read_status_once(settings, topology=spec, parking_age=parking_age))
        table = not as_json and stdout.is_terminal
        _warn(report, alarms=not table)  # the table shows the banners in its title
        if as_json:
            print_json(report.as_dict())
        elif stdout.is_terminal:
            stdout.print(status_table(report))
        else:
            _print_lines(report)
        return
    every_s = seconds(interval, "--interval")
    try:
        run_async(_watch(settings, spec, every_s, as_json=as_json, parking_age=parking_age))
    except Interrupted:
        return  # Ctrl-C is how --watch is meant to end: exit 0, no error line


async def _watch(
    settings: Settings,
    topology: Topology | None,
    every_s: float,
    *,
    as_json: bool,
    parking_age: bool,
) -> None:
    """Read and redraw until interrupted; Ctrl-C ends it (exit 0: its documented way out).

    Not on a terminal (a pipe, a file), a redrawn table would show nothing until the end:
    there each reading is one JSON line, flushed, as with --json."""
    async with management(settings) as api:
        first = True

        async def reading() -> StatusReport:
            nonlocal first
            report = await read_status(
                api,
                topology=topology,
                settings=settings,
                parking_age=parking_age,
                check_broker=first,
            )
            if first:
                _warn(report, alarms=False)  # every reading carries the banners
            first = False
            return report

        if as_json or not stdout.is_terminal:
            while True:
                print(json.dumps((await reading()).as_dict(), default=str), flush=True)
                await asyncio.sleep(every_s)
        with Live(console=stdout, auto_refresh=False) as live:
            while True:
                live.update(status_table(await reading(), every_s=every_s), refresh=True)
                await asyncio.sleep(every_s)


def _warn(report: StatusReport, *, alarms: bool = True) -> None:
    if report.broker_warning:
        stderr.print(f"warning: {report.broker_warning}", highlight=False)
    for view in report.delayed:
        if view.stuck:
            stderr.print(
                f"warning: {view.stuck} delayed message(s) in {view.name} are due but their "
                "target did not take them (no exit binding, nothing routes the key, or the "
                "queue is full): docs/delay.md",
                highlight=False,
            )
    if alarms:  # (the table shows these in its title)
        for line in held_lines(report):
            stderr.print(f"warning: {line}", highlight=False)
        for line in banner_lines(report):
            stderr.print(line, style="bold red", highlight=False)


def held_lines(report: StatusReport) -> list[str]:
    """One line per queue (a wait tier's slots together) holding dead letters that its target
    has not taken: where they are, for whom, why, and where to read on."""
    return [
        f"{row.name}: {row.held_note} (not ready, no consumer sees them; `rmqkit doctor`, "
        "docs/runbooks/queue-backing-up.md)"
        for section in display_rows(report)
        for row in section
        if row.held and row.role != "delayed"
    ]


def banner_lines(report: StatusReport) -> list[str]:
    """One line per node and resource in alarm (publishers are blocked) and per quorum queue
    without a majority of its members online (no leader: the queue stops)."""
    lines = [f"ALARM: {alarm.text}" for alarm in report.alarms or []]
    lines += [f"NO MAJORITY: {state.problem}" for state in report.without_majority]
    return lines


@dataclass(frozen=True)
class _Row:
    name: str
    role: str
    ready: int | None
    unacked: int | None
    consumers: int | None
    publish_rate: float | None
    deliver_rate: float | None
    messages: int | None
    oldest_age_s: float | None
    note: str
    leader: str = ""  # quorum queues: the leader's node ("none" without one)
    members: str = ""  # quorum queues: "3/3", "2/3 (offline: n)", "1/3 NO MAJORITY (…)"
    held: int | None = None  # dead letters held for a target that has not taken them
    held_note: str = ""  # "24 dead letters held for hb.work: hb.work full (…)"


def _total(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _rate_total(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def display_rows(report: StatusReport) -> list[list[_Row]]:
    """Rows per group; a wait tier's jitter slots collapse into one row."""
    sections: list[list[_Row]] = []
    current: list[_Row] = []
    owner: str | None = None
    tiers: dict[str, list[QueueStatus]] = {}

    stuck = {view.name: view.stuck for view in report.delayed}

    def flush_tiers() -> None:
        for tier, members in tiers.items():
            slots = len(members) - 1
            held, held_note = _held([m for m in members if m.role != "delay"])
            notes = {m.note for m in members if m.note and not m.held_cause}
            if held_note:
                notes.add(held_note)
            if members[0].role == "delay":  # a delay ladder: one row, "delayed"
                label = f"{tier} ({len(members)} rung{'s' if len(members) != 1 else ''})"
                role = "delayed"
                if stuck.get(tier):
                    notes.add(f"{stuck[tier]} stuck")  # due, not taken: see the warning
            else:
                label = tier + (f" (+{slots} slot{'s' if slots != 1 else ''})" if slots else "")
                role = "wait"
            current.append(
                _Row(
                    label,
                    role,
                    _total([m.ready for m in members]),
                    _total([m.unacked for m in members]),
                    _total([m.consumers for m in members]),
                    _rate_total([m.publish_rate for m in members]),
                    _rate_total([m.deliver_rate for m in members]),
                    _total([m.messages for m in members]),
                    None,
                    "; ".join(sorted(notes)),
                    *_quorum_cells(members),
                    held=held,
                    held_note=held_note,
                )
            )
        tiers.clear()

    for q in report.queues:
        if q.owner != owner:
            flush_tiers()
            if current:
                sections.append(current)
            current, owner = [], q.owner
        if q.role in ("wait", "delay") and q.tier is not None:
            tiers.setdefault(q.tier, []).append(q)
            continue
        flush_tiers()
        current.append(
            _Row(
                q.name,
                q.role,
                q.ready,
                q.unacked,
                q.consumers,
                q.publish_rate,
                q.deliver_rate,
                q.messages,
                q.oldest_age_s,
                q.note,
                *_quorum_cells([q]),
                held=q.dead_letter_held,
                held_note=_held([q])[1],
            )
        )
    flush_tiers()
    if current:
        sections.append(current)
    return sections


def _held(queues: list[QueueStatus]) -> tuple[int | None, str]:
    """The dead letters a row's queues hold together, and one note saying for whom and why
    (a tier's slots share their target, so their causes read alike)."""
    total = _total([q.dead_letter_held for q in queues])
    holding = [q for q in queues if q.dead_letter_held and q.held_cause]
    if not holding:
        return total, ""
    targets = sorted({t for q in holding for t in q.held_for})
    causes = sorted({q.held_cause for q in holding})
    where = f" for {', '.join(targets)}" if targets else ""
    return total, f"{total} dead letters held{where}: {'; '.join(causes)}"


def _quorum_cells(queues: list[QueueStatus]) -> tuple[str, str]:
    """Leader and members of quorum queues (a wait tier's slots: one leader if they agree,
    the members of the worst-off slot)."""
    states = [q.quorum for q in queues if q.quorum is not None]
    if not states:
        return "", ""
    leaders = {state.leader or "none" for state in states}
    worst = min(states, key=lambda s: (s.has_majority, len(s.members) - len(s.offline)))
    members = worst.members_text.replace(" online", "", 1)
    return (leaders.pop() if len(leaders) == 1 else "(several)"), members


def _num(value: int | None) -> str:
    return "-" if value is None else str(value)


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _cells(row: _Row, *, blank: str, short: bool = False) -> tuple[str, ...]:
    """A row's columns as text; ``blank`` stands for an empty note or a non-parking age.
    ``short`` (the terminal table): a held backlog's note names only its target; the
    table's title says why and what to do."""
    note = row.note
    if short and row.held_note:
        target = row.held_note.partition(" for ")[2].partition(":")[0]
        brief = f"held for {target} (see above)" if target else "held (see above)"
        note = note.replace(row.held_note, brief)
    return (
        row.name,
        row.role,
        _num(row.ready),
        _num(row.unacked),
        _num(row.consumers),
        _num(row.held),
        _rate(row.publish_rate),
        _rate(row.deliver_rate),
        oldest_text(row, blank),
        note or blank,
    )


def oldest_text(row: _Row, blank: str) -> str:
    """A row's oldest age; ``n/a`` where the queue holds messages and the broker keeps no age
    for them (see OLDEST_NA); ``blank`` for an empty queue and for wait and delay rows."""
    if row.oldest_age_s is not None:
        return age_text(row.oldest_age_s)
    if row.role in AGED_ROLES and (row.messages or row.ready):
        return "n/a"
    return blank


def status_table(report: StatusReport, every_s: float | None = None) -> RenderableType:
    """The status as a rich table, one section per work queue; below it, when there are
    quorum queues, their leaders and members (``quorum_table``)."""
    title = f"vhost {report.vhost!r} at {report.taken_at:%H:%M:%S}"
    if report.source:
        title += f" — {report.source}"
    if every_s is not None:
        title += f" (every {every_s:g}s, Ctrl-C to stop)"
    for line in banner_lines(report):
        title += f"\n[bold red]{escape(line)}[/bold red]"
    for line in held_lines(report):
        title += f"\n[yellow]{escape(line)}[/yellow]"
    if report.delayed:
        title += f"\n{delayed_line(report)}"
    table = Table(title=title, title_justify="left")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("queue", "left"),
        ("role", "left"),
        ("ready", "right"),
        ("unacked", "right"),
        ("consumers", "right"),
        ("held", "right"),
        ("in/s", "right"),
        ("out/s", "right"),
        ("oldest", "right"),
        ("note", "left"),
    )
    for column, justify in columns:
        # Queue names stay whole (no_wrap): a name folded over two lines at 80 columns is
        # copied wrong; the other columns give way instead.
        table.add_column(column, justify=justify, overflow="fold", no_wrap=column == "queue")
    for index, section in enumerate(display_rows(report)):
        if index:
            table.add_section()
        for row in section:
            table.add_row(*_cells(row, blank="", short=True))
    captions = []
    if not report.rates_kept:
        captions.append("the broker keeps no message rates: in/s and out/s are unknown")
    if any(oldest_text(row, "") == "n/a" for section in display_rows(report) for row in section):
        captions.append(OLDEST_NA)
    if captions:
        table.caption = "\n".join(captions)
        table.caption_justify = "left"
    quorum = quorum_table(report)
    return table if quorum is None else Group(table, quorum)


def quorum_table(report: StatusReport) -> Table | None:
    """Quorum queues (a wait tier's slots as one row): leader node, members online, and the
    offline ones; None when there are none (or the broker does not say)."""
    table = Table(title="quorum queues", title_justify="left")
    table.add_column("queue", no_wrap=True)
    table.add_column("leader", overflow="fold")
    table.add_column("online", justify="right")
    table.add_column("offline", overflow="fold")
    for section in display_rows(report):
        for row in section:
            if row.members:
                online, _, rest = row.members.partition(" ")
                offline = rest.split("offline: ", 1)[1].rstrip(")") if "offline: " in rest else ""
                flag = " [bold red]NO MAJORITY[/bold red]" if "NO MAJORITY" in rest else ""
                table.add_row(row.name, row.leader, online.rstrip(",") + flag, escape(offline))
    return table if table.row_count else None


def delayed_line(report: StatusReport) -> str:
    """``delayed: 5 (sf.work 2, shared 3)``: the messages waiting in delay ladders."""
    delayed = report.delayed_dict()
    parts = [f"{v.target or v.name} {v.waiting + v.stuck}" for v in report.delayed]
    stuck = f", {delayed['stuck']} stuck" if delayed["stuck"] else ""
    return f"delayed: {delayed['total']}{stuck} ({', '.join(parts)})"


def _print_lines(report: StatusReport) -> None:
    """Piped: one tab-separated line per row, never wrapped."""
    print(
        "queue\trole\tready\tunacked\tconsumers\theld\tin/s\tout/s\toldest\tnote\tleader\tmembers"
    )
    for section in display_rows(report):
        for row in section:
            quorum = (row.leader or "-", row.members or "-")
            print("\t".join((*_cells(row, blank="-"), *quorum)))

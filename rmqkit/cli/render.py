"""Rendering helpers shared by the commands: results to stdout, messages to stderr."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:  # every command imports this module: the topology package is not cheap
    from rmqkit.topology.plan import Plan

stdout = Console(soft_wrap=True)
stderr = Console(stderr=True, soft_wrap=True)

_STYLE = {
    "create": "green",
    "change": "yellow",
    "in-sync": "dim",
    "conflict": "bold red",
    "orphan": "magenta",
}


def print_json(data: Any) -> None:
    """Machine-readable output: plain JSON on stdout, no colour or wrapping."""
    print(json.dumps(data, indent=2, sort_keys=False, default=str))


def plan_dict(plan: Plan) -> dict[str, Any]:
    """A plan for ``--json``: every object with its action, in sync or not, whatever ``--all``
    says (scripts read the broker's state from it; the text view only trims what it prints)."""
    return {
        "source": plan.source,
        "vhost": plan.vhost,
        "via": plan.desired.via,
        "summary": plan.summary(),
        "work_queues": [w.as_dict() for w in plan.desired.work_queues],
        "delay_ladder": ladder_dict(plan),
        "changes": [c.as_dict() for c in plan.changes],
    }


def print_work_queues(plan: Plan) -> None:
    """One line per work queue of the file: its retries, retention and parking queue, lanes,
    partitions, default delay and encryption, so what happens to a failing or waiting message is
    stated even when nothing changes; and the delay ladder, if the file declares it."""
    lines = [f"work queue {work.text()}" for work in plan.desired.work_queues]
    ladder = ladder_dict(plan)
    if ladder is not None:
        exits = ", ".join(
            f"queue {key}" if not exchange else f"exchange {exchange}"
            for exchange, key in plan.desired.ladder_targets
        )
        lines.append(
            f"delay ladder {ladder['name']}: {ladder['rungs']} rungs, exits to {exits} "
            "(for the queues with a delay; docs/delay.md)"
        )
    for line in lines:
        if stdout.is_terminal:
            stdout.print(line, highlight=False)
        else:
            print(line)


def ladder_dict(plan: Plan) -> dict[str, Any] | None:
    """The delay ladder a plan declares (None: no queue has a ``delay``)."""
    desired = plan.desired
    if desired.ladder is None:
        return None
    return {
        "name": desired.ladder,
        "rungs": len(desired.fixed_queues),
        "exits": [{"exchange": e, "routing_key": k} for e, k in desired.ladder_targets],
    }


Row = tuple[str, str, str, str, str]  # kind, name, action, detail, fix


def plan_rows(plan: Plan, *, show_in_sync: bool = True) -> list[Row]:
    """The lines a plan prints. Without ``show_in_sync`` (plan's default, declare), a delay
    ladder that is new as a whole (every object of it to create: a few hundred exchanges,
    queues and bindings) is one line; any other action on a ladder object lists it as usual,
    so nothing but plain creation is ever summed up. ``--all`` and ``--json`` list every one."""
    changes = [c for c in plan.changes if show_in_sync or c.action != "in-sync"]
    base = plan.desired.ladder
    if show_in_sync or base is None:
        return [(c.kind, c.name, c.action, c.detail, c.fix) for c in changes]

    def of_ladder(name: str) -> bool:
        return name == base or name.startswith((base + ".", base + " "))

    ladder = [c for c in plan.changes if of_ladder(c.name)]
    if not ladder or any(c.action != "create" for c in ladder):
        return [(c.kind, c.name, c.action, c.detail, c.fix) for c in changes]
    counts: dict[str, int] = {}
    for change in ladder:
        counts[change.kind] = counts.get(change.kind, 0) + 1
    sizes = ", ".join(f"{n} {kind}{'s' if n != 1 else ''}" for kind, n in counts.items())
    rows: list[Row] = []
    for change in changes:
        if not of_ladder(change.name):
            rows.append((change.kind, change.name, change.action, change.detail, change.fix))
        elif change is ladder[0]:
            detail = f"a new delay ladder: {sizes} (plan --all lists each)"
            rows.append(("ladder", base, "create", detail, ""))
    return rows


def print_plan(plan: Plan, *, show_in_sync: bool = True, title: str | None = None) -> None:
    """A table on a terminal; one line per object when piped (greppable, never wrapped)."""
    rows = plan_rows(plan, show_in_sync=show_in_sync)
    if stdout.is_terminal:
        if rows:
            stdout.print(plan_table(rows, title=title))
        elif title:
            stdout.print(title, highlight=False)
        return
    if title:
        print(title)
    for kind, name, action, detail, fix in rows:
        line = f"{action:<9} {kind:<8} {name}"
        if detail:
            line += f" — {detail}"
        if fix:
            line += f" — fix: {fix}"
        print(line)


def plan_table(rows: list[Row], *, title: str | None = None) -> Table:
    """``plan_rows`` as a table (a terminal's view)."""
    table = Table(title=title, title_justify="left", expand=False)
    table.add_column("object")
    table.add_column("name", overflow="fold")
    table.add_column("action")
    table.add_column("detail / fix", overflow="fold")
    for kind, name, action, detail, fix in rows:
        text = detail
        if fix:
            text += f"\n[bold]fix:[/bold] {fix}"
        style = _STYLE[action]
        table.add_row(kind, name, f"[{style}]{action}[/{style}]", text)
    return table


def summary_line(plan: Plan) -> str:
    """Every action's count: ``1 change, 2 create, 43 in-sync``."""
    counts = plan.summary()
    parts = [f"{n} {k}" for k, n in counts.items() if n]
    return ", ".join(parts) if parts else "nothing declared"


def changes_summary_line(plan: Plan) -> str:
    """The last line of a plan that lists changes only (kubectl diff / terraform plan style):
    the counts of what is listed, then how many objects are in sync and were left out.

    ``1 change, 2 create; 43 objects in sync; --all to list them``; with nothing to do
    ``no changes; 46 objects in sync; --all to list them``.
    """
    counts = plan.summary()
    in_sync = counts.pop("in-sync")
    parts = [f"{n} {k}" for k, n in counts.items() if n]
    head = ", ".join(parts) if parts else "no changes"
    if not in_sync:
        return head if parts else "nothing declared"
    noun = "object" if in_sync == 1 else "objects"
    return f"{head}; {in_sync} {noun} in sync; --all to list them"

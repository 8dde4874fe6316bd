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
    return {
        "source": plan.source,
        "vhost": plan.vhost,
        "via": plan.desired.via,
        "summary": plan.summary(),
        "changes": [c.as_dict() for c in plan.changes],
    }


def print_plan(plan: Plan, *, show_in_sync: bool = True, title: str | None = None) -> None:
    """A table on a terminal; one line per object when piped (greppable, never wrapped)."""
    if stdout.is_terminal:
        stdout.print(plan_table(plan, show_in_sync=show_in_sync, title=title))
        return
    if title:
        print(title)
    for change in plan.changes:
        if change.action == "in-sync" and not show_in_sync:
            continue
        line = f"{change.action:<9} {change.kind:<8} {change.name}"
        if change.detail:
            line += f" — {change.detail}"
        if change.fix:
            line += f" — fix: {change.fix}"
        print(line)


def plan_table(plan: Plan, *, show_in_sync: bool = True, title: str | None = None) -> Table:
    table = Table(title=title, title_justify="left", expand=False)
    table.add_column("object")
    table.add_column("name", overflow="fold")
    table.add_column("action")
    table.add_column("detail / fix", overflow="fold")
    for change in plan.changes:
        if change.action == "in-sync" and not show_in_sync:
            continue
        text = change.detail
        if change.fix:
            text += f"\n[bold]fix:[/bold] {change.fix}"
        style = _STYLE[change.action]
        table.add_row(change.kind, change.name, f"[{style}]{change.action}[/{style}]", text)
    return table


def summary_line(plan: Plan) -> str:
    counts = plan.summary()
    parts = [f"{n} {k}" for k, n in counts.items() if n]
    return ", ".join(parts) if parts else "nothing declared"

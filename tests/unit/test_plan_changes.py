"""The text plan lists changes only; its last line counts what it left out (issue 14)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rmqkit.cli.render import changes_summary_line, print_plan, summary_line
from rmqkit.topology.expand import expand
from rmqkit.topology.model import load_topology
from rmqkit.topology.plan import Change, Plan

ROOT = Path(__file__).resolve().parents[2]
DESIRED = expand(load_topology(ROOT / "topologies" / "orders.toml"))


def _plan(*actions: str) -> Plan:
    changes = [Change("queue", f"q{i}", action, "why") for i, action in enumerate(actions)]  # type: ignore[arg-type]
    return Plan(source="f.toml", vhost="v", desired=DESIRED, changes=changes)


def test_in_sync_only() -> None:
    plan = _plan("in-sync", "in-sync", "in-sync")
    assert changes_summary_line(plan) == "no changes; 3 objects in sync; --all to list them"


def test_changes_and_in_sync() -> None:
    plan = _plan("change", "create", "create", "in-sync", "orphan")
    assert changes_summary_line(plan) == (
        "2 create, 1 change, 1 orphan; 1 object in sync; --all to list them"
    )
    assert summary_line(plan) == "2 create, 1 change, 1 in-sync, 1 orphan"


def test_nothing_in_sync_has_no_hint() -> None:
    assert changes_summary_line(_plan("create")) == "1 create"
    assert changes_summary_line(_plan()) == "nothing declared"


def test_piped_plan_skips_in_sync_lines(capsys: pytest.CaptureFixture[str]) -> None:
    plan = _plan("in-sync", "change", "in-sync")
    print_plan(plan, show_in_sync=False, title="t:")
    assert capsys.readouterr().out.splitlines() == ["t:", "change    queue    q1 — why"]
    print_plan(plan, show_in_sync=True)
    assert len(capsys.readouterr().out.splitlines()) == 3

"""`rmqkit plan` against the real broker: changes only by default (issue 14), several topology
files in one vhost, and the file named the same way on every command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rmqkit.topology import declare_topology, load_topology
from tests import broker

ROOT = Path(__file__).resolve().parents[2]
ORDERS = ROOT / "topologies" / "orders.toml"


@pytest.fixture(scope="module")
def declared(vhost: str) -> str:
    """orders.toml declared (the library call `rmqkit declare` makes: a CLI start costs ~1 s)."""
    broker.run(declare_topology(broker.settings_for(vhost), load_topology(ORDERS)))
    return vhost


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_plan_in_sync_lists_nothing_and_counts_what_it_left_out(declared: str) -> None:
    result = broker.cli("plan", str(ORDERS), vhost=declared)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = _lines(result.stdout)
    # The title and one summary line, not 46 `in-sync` lines.
    assert not [line for line in lines if line.startswith("in-sync")], result.stdout
    assert len(lines) == 2, result.stdout
    assert lines[-1] == "no changes; 46 objects in sync; --all to list them.", result.stdout


def test_plan_all_lists_every_object(declared: str) -> None:
    result = broker.cli("plan", str(ORDERS), "--all", vhost=declared)
    assert result.returncode == 0, result.stdout + result.stderr
    in_sync = [line for line in result.stdout.splitlines() if line.startswith("in-sync")]
    assert len(in_sync) == 46
    assert result.stdout.rstrip().endswith("46 in-sync.")


def test_plan_json_keeps_every_object_with_its_action(declared: str) -> None:
    result = broker.cli("plan", str(ORDERS), "--json", vhost=declared)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert len(data["changes"]) == 46
    assert {c["action"] for c in data["changes"]} == {"in-sync"}
    assert data["summary"]["in-sync"] == 46


def test_plan_lists_only_the_changes_and_exits_2(declared: str, tmp_path: Path) -> None:
    edited = tmp_path / "orders.toml"
    edited.write_text(ORDERS.read_text().replace("max_length = 100000", "max_length = 5000"))
    result = broker.cli("plan", str(edited), vhost=declared)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = _lines(result.stdout)
    assert len(lines) == 3, result.stdout  # title, the one change, the summary
    assert lines[1].startswith("change    policy   rmqkit.orders.work")
    assert "max-length=100000" in lines[1] and "max-length=5000" in lines[1]
    assert lines[-1] == "1 change; 45 objects in sync; --all to list them."

"""`rmqkit plan` against the real broker: changes only by default (issue 14), several topology
files in one vhost, and the file named the same way on every command."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from rmqkit.errors import ExitCode
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
    # The title, what the work queue does, one summary line: not 46 `in-sync` lines.
    assert not [line for line in lines if line.startswith("in-sync")], result.stdout
    assert len(lines) == 3, result.stdout
    assert lines[1] == (
        "work queue orders.work: retries 1s, 5s, 30s, 2m, max_attempts 5; no retention limit; "
        "parks in orders.work.parking"
    )
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
    assert len(lines) == 4, result.stdout  # title, the one change, the work queue, the summary
    assert lines[1].startswith("change    policy   rmqkit.orders.work")
    assert "max-length=100000" in lines[1] and "max-length=5000" in lines[1]
    assert lines[-1] == "1 change; 45 objects in sync; --all to list them."


A_TOML = """
[exchanges.shop]
type = "topic"

[queues."a.work"]
bind = [{ exchange = "shop", routing_key = "a.*" }]
retry_delays = ["1s", "5s"]
jitter_slots = 1
"""

B_TOML = """
[exchanges.shop]
type = "topic"

[queues."b.work"]
bind = [{ exchange = "shop", routing_key = "b.*" }]
retry_delays = ["2s"]
jitter_slots = 1
"""


@pytest.fixture
def two_files(tmp_path: Path, fresh_vhost: Callable[[], str]) -> tuple[str, Path, Path]:
    """a.toml and b.toml (different work queues, one shared exchange) declared into one vhost,
    each by its own `rmqkit declare`, as two teams would."""
    vhost = fresh_vhost()
    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    a.write_text(A_TOML)
    b.write_text(B_TOML)
    for path in (a, b):
        result = broker.cli("declare", str(path), vhost=vhost)
        assert result.returncode == 0, result.stdout + result.stderr
    return vhost, a, b


def test_another_files_objects_are_not_orphans(two_files: tuple[str, Path, Path]) -> None:
    vhost, a, b = two_files
    assert {"b.work", "b.work.wait.2s", "b.work.parking"} <= broker.queue_names(vhost)
    result = broker.cli("plan", str(a), "--json", vhost=vhost)
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(result.stdout)
    assert data["summary"]["orphan"] == 0, [c for c in data["changes"] if c["action"] == "orphan"]
    text = broker.cli("plan", str(a), vhost=vhost)
    assert text.returncode == 0 and "b.work" not in text.stdout, text.stdout
    # Declaring one file does not point at the other's objects either.
    again = broker.cli("declare", str(b), vhost=vhost)
    assert again.returncode == 0 and "No changes" in again.stdout
    assert "a.work" not in again.stderr, again.stderr


def test_several_files_are_planned_as_their_union(two_files: tuple[str, Path, Path]) -> None:
    vhost, a, b = two_files
    result = broker.cli("plan", str(a), str(b), "--json", vhost=vhost)
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(result.stdout)
    names = {c["name"] for c in data["changes"]}
    assert {"a.work", "b.work", "b.work.wait.2s", "rmqkit.a.work.wait.5s"} <= names
    assert {c["action"] for c in data["changes"]} == {"in-sync"}


def test_a_removed_tier_is_still_an_orphan_of_its_own_file(
    two_files: tuple[str, Path, Path], tmp_path: Path
) -> None:
    vhost, _, _ = two_files
    smaller = tmp_path / "a-smaller.toml"
    smaller.write_text(A_TOML.replace('["1s", "5s"]', '["1s"]'))
    result = broker.cli("plan", str(smaller), "--json", vhost=vhost)
    orphans = {c["name"] for c in json.loads(result.stdout)["changes"] if c["action"] == "orphan"}
    assert orphans == {"a.work.wait.5s", "rmqkit.a.work.wait.5s"}


def test_files_that_disagree_on_an_object_are_refused(
    two_files: tuple[str, Path, Path], tmp_path: Path
) -> None:
    vhost, a, _ = two_files
    other = tmp_path / "c.toml"
    other.write_text(A_TOML.replace("jitter_slots = 1", "jitter_slots = 1\nmax_length = 10"))
    result = broker.cli("declare", str(a), str(other), vhost=vhost)
    assert result.returncode == 65, result.stdout + result.stderr
    assert "a.work" in result.stderr and str(a) in result.stderr, result.stderr


def test_topology_option_names_the_file_on_plan_declare_and_export(
    two_files: tuple[str, Path, Path],
) -> None:
    """`--topology/-t FILE` as on every other command; the positional form still works."""
    vhost, a, b = two_files
    plan = broker.cli("plan", "--topology", str(a), "-t", str(b), "--json", vhost=vhost)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    names = {c["name"] for c in json.loads(plan.stdout)["changes"]}
    assert {"a.work", "b.work"} <= names
    declared = broker.cli("declare", "-t", str(a), vhost=vhost)
    assert declared.returncode == 0 and "No changes" in declared.stdout, declared.stderr
    exported = broker.cli("export", "-t", str(b), "--broker-version", "3.10", vhost=vhost)
    assert exported.returncode == 0, exported.stderr
    assert "b.work" in {q["name"] for q in json.loads(exported.stdout)["queues"]}
    positional = broker.cli("export", str(b), "--broker-version", "3.10", vhost=vhost)
    assert positional.stdout == exported.stdout


def test_a_missing_or_doubled_file_is_a_usage_error(two_files: tuple[str, Path, Path]) -> None:
    vhost, a, b = two_files
    usage = int(ExitCode.USAGE)
    for command in ("plan", "declare", "export"):
        result = broker.cli(command, vhost=vhost)
        assert result.returncode == usage, (command, result.stderr)
        assert "--topology FILE" in result.stderr
    both = broker.cli("export", str(a), "-t", str(b), "--broker-version", "3.10", vhost=vhost)
    assert both.returncode == usage and "export takes one" in both.stderr, both.stderr


DELAYED = """
[exchanges.orders]
type = "direct"

[queues."orders.work"]
bind = [{ exchange = "orders", routing_key = "order" }]
delay = "5s"
"""


def test_a_new_delay_ladder_is_one_line_until_part_of_it_exists(
    fresh_vhost: Callable[[], str], tmp_path: Path
) -> None:
    """A fresh vhost's plan named ~270 ladder objects one per line; now the ladder is one line,
    `--all` and `--json` still list each, and once part of it exists every change is listed."""
    vhost = fresh_vhost()
    topology = tmp_path / "delayed.toml"
    topology.write_text(DELAYED)
    result = broker.cli("plan", str(topology), vhost=vhost)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = _lines(result.stdout)
    ladder = [line for line in lines if "rmqkit.delay." in line and line.startswith("create")]
    assert len(ladder) == 1, result.stdout
    assert ladder[0].startswith("create    ladder   rmqkit.delay.100ms — a new delay ladder: ")
    assert "20 queues" in ladder[0] and "(plan --all lists each)" in ladder[0]
    assert len(lines) < 60, result.stdout
    every = broker.cli("plan", str(topology), "--all", vhost=vhost)
    listed = [line for line in every.stdout.splitlines() if "rmqkit.delay." in line]
    assert len(listed) > 250, every.stdout
    data = json.loads(broker.cli("plan", str(topology), "--json", vhost=vhost).stdout)
    assert len([c for c in data["changes"] if "rmqkit.delay." in c["name"]]) == len(listed) - 1
    # Declared, then one rung's binding removed: that create is listed, not summed up.
    broker.run(declare_topology(broker.settings_for(vhost), load_topology(topology)))
    src, dst = "rmqkit.delay.100ms", "rmqkit.delay.100ms.00-100ms"
    bindings = broker.api("GET", f"/bindings/{broker.q(vhost)}/e/{src}/q/{dst}").json()
    for binding in bindings:
        path = f"/bindings/{broker.q(vhost)}/e/{src}/q/{dst}/{binding['properties_key']}"
        assert broker.api("DELETE", path).status_code in (200, 204)
    again = broker.cli("plan", str(topology), vhost=vhost)
    changed = [line for line in _lines(again.stdout) if line.startswith("create")]
    assert changed == [f"create    binding  {src} → {dst} (rmqkit-delay-top=0)"], again.stdout

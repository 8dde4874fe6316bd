"""Archive and restore on the real broker, counted by message id: `parking archive --group`
moves exactly that group's messages into the archive queue the topology declares (its
retention in effect), `restore` brings exactly them back with their headers as they were
parked, neither loses a message under kill -9 mid-run, and a lane without an archive is
refused with the fix."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from rmqkit import headers as h
from rmqkit.topology import declare_topology, load_topology
from tests import broker

pytestmark = pytest.mark.semantics("4.3")

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = """
[exchanges."arc"]
type = "direct"

[queues."arc.work"]
bind = [{ exchange = "arc", routing_key = "job" }]
retry_delays = []
archive = "7d"

[queues."arc.plain"]
bind = [{ exchange = "arc", routing_key = "plain" }]
retry_delays = []
"""
WORK, PARKING, ARCHIVE = "arc.work", "arc.work.parking", "arc.work.parking.archive"
PUBLISH_WINDOW = 1000  # rmqkit.parking.ops: the most copies unconfirmed at a kill


@pytest.fixture(scope="module")
def declared(vhost: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    spec = tmp_path_factory.mktemp("arc") / "arc.toml"
    spec.write_text(TOPOLOGY, encoding="utf-8")
    broker.run(declare_topology(broker.settings_for(vhost), load_topology(spec)))
    return vhost


@pytest.fixture
def empty(declared: str) -> str:
    for name in (PARKING, ARCHIVE, WORK):
        broker.api("DELETE", f"/queues/{broker.q(declared)}/{broker.q(name)}/contents")
    return declared


def _park(vhost: str, errors: list[str]) -> dict[str, str]:
    """One parked message per entry (its error type), as the consumer parks them; id → type."""
    now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    messages = [(uuid.uuid4().hex, f'{{"n": {i}}}'.encode()) for i in range(len(errors))]

    def headers(i: int) -> dict[str, Any]:
        return {
            "rmqkit-park-reason": "exhausted",
            "rmqkit-error-type": errors[i],
            "rmqkit-error-message": f"order {i} failed with code {i * 7}",
            "rmqkit-origin-queue": WORK,
            "rmqkit-last-failed-at": now,
            "rmqkit-attempt": 3,
            "app-tenant": "acme",
        }

    broker.publish_with_ids(vhost, "", PARKING, messages, headers=headers)
    return {m: errors[i] for i, (m, _) in enumerate(messages)}


def _listed(vhost: str, queue: str, *filters: str) -> list[dict[str, Any]]:
    return broker.cli_json_lines("parking", "list", queue, "--json", *filters, vhost=vhost)


def _ids(vhost: str, queue: str, *filters: str) -> list[str]:
    return [str(row["message_id"]) for row in _listed(vhost, queue, *filters)]


def test_a_group_is_archived_and_restored_exactly(empty: str) -> None:
    v = empty
    parked = _park(v, ["ValueError"] * 120 + ["KeyError"] * 80)
    before = {r["message_id"]: r for r in _listed(v, PARKING)}
    groups = broker.cli("parking", "groups", PARKING, "--json", vhost=v)
    assert groups.returncode == 0, groups.stderr
    by_type = {g["error_type"]: g["group"] for g in json.loads(groups.stdout)["groups"]}
    assert set(by_type) == {"ValueError", "KeyError"}

    archived = broker.cli(
        "parking", "archive", PARKING, "--group", by_type["KeyError"][:6], "--json", vhost=v
    )
    assert archived.returncode == 0, archived.stderr
    assert json.loads(archived.stdout)["archived"] == 80
    keys = {m for m, t in parked.items() if t == "KeyError"}
    assert sorted(_ids(v, ARCHIVE)) == sorted(keys)
    assert sorted(_ids(v, PARKING)) == sorted(set(parked) - keys)
    rows = {r["message_id"]: r for r in _listed(v, ARCHIVE)}
    sample = next(iter(keys))
    assert "rmqkit-archived-at" in rows[sample]["headers"]
    assert rows[sample]["headers"]["app-tenant"] == "acme"
    assert rows[sample]["error_type"] == "KeyError"  # its failure history goes with it

    # the archive is the queue the topology declared: kept for the retention, then dropped
    info = broker.mgmt_queue(v, ARCHIVE)
    assert info is not None and info["arguments"]["x-queue-type"] == "quorum"
    effective = broker.wait_for(
        lambda: (broker.mgmt_queue(v, ARCHIVE) or {}).get("effective_policy_definition") or None
    )
    assert effective["message-ttl"] == 7 * 86_400_000
    status = broker.cli("status", "--json", vhost=v)
    assert status.returncode in (0, 1, 2), status.stderr
    assert '"archived"' in status.stdout

    # a dry run moves nothing; restore brings back exactly the group, headers as parked
    dry = broker.cli("parking", "restore", PARKING, "--dry-run", "--json", vhost=v)
    assert json.loads(dry.stdout)["selected"] == 80
    assert broker.depths(v, [PARKING, ARCHIVE]) == {PARKING: 120, ARCHIVE: 80}
    restored = broker.cli("parking", "restore", PARKING, "--json", vhost=v)
    assert restored.returncode == 0, restored.stderr
    assert json.loads(restored.stdout)["restored"] == 80
    assert broker.depths(v, [PARKING, ARCHIVE]) == {PARKING: 200, ARCHIVE: 0}
    after = {r["message_id"]: r for r in _listed(v, PARKING)}
    assert set(after) == set(parked)

    def own(headers: dict[str, Any]) -> dict[str, Any]:  # not the queue's delivery counters
        return {k: v for k, v in headers.items() if k not in h.DELIVERY_COUNTERS}

    for message_id in keys:
        assert own(after[message_id]["headers"]) == own(before[message_id]["headers"])


def test_a_lane_without_an_archive_is_refused_with_the_fix(declared: str) -> None:
    v = declared
    broker.publish(v, "", "arc.plain.parking", [b"{}"])
    for command in ("archive", "restore"):
        result = broker.cli("parking", command, "arc.plain.parking", vhost=v)
        assert result.returncode == 65, (command, result.stdout, result.stderr)
        assert 'archive = "30d"' in result.stderr, result.stderr
    assert broker.depths(v, ["arc.plain.parking"]) == {"arc.plain.parking": 1}


def _kill_mid_run(vhost: str, command: str, source: str, target: str, total: int) -> None:
    """Start `parking COMMAND`, kill -9 it once the target holds some but not all of the
    messages, and wait until the broker has returned what the dead process held."""
    cmd = [sys.executable, "-m", "rmqkit", "parking", command, PARKING]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=broker.cli_env(vhost), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            moved = broker.depths(vhost, [target])[target] or 0
            if 0 < moved < total:
                break
            time.sleep(0.01)
        assert proc.poll() is None, f"{command} ended before the kill: raise the count"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    broker.wait_for(
        lambda: sum(n or 0 for n in broker.depths(vhost, [source, target]).values()) >= total,
        timeout_s=30,
    )


@pytest.mark.parametrize("count", [3000])
def test_kill_9_of_archive_and_of_restore_loses_nothing(empty: str, count: int) -> None:
    v = empty
    parked = set(_park(v, ["ValueError"] * count))
    for command, source, target in (
        ("archive", PARKING, ARCHIVE),
        ("restore", ARCHIVE, PARKING),
    ):
        _kill_mid_run(v, command, source, target, count)
        here, there = _ids(v, source), _ids(v, target)
        assert parked <= set(here) | set(there), f"{command}: a message is in neither queue"
        # running it again continues; copies of the unconfirmed window are the only duplicates
        again = broker.cli("parking", command, PARKING, vhost=v, timeout=300)
        assert again.returncode == 0, again.stderr
        assert broker.depths(v, [source]) == {source: 0}
        moved = Counter(_ids(v, target))
        assert set(moved) == parked
        assert sum(moved.values()) - count <= PUBLISH_WINDOW
        # the duplicates, identifiable by message id, are dropped before the way back
        if command == "archive":
            broker.api("DELETE", f"/queues/{broker.q(v)}/{broker.q(ARCHIVE)}/contents")
            broker.publish_with_ids(v, "", ARCHIVE, [(m, b"{}") for m in sorted(parked)])

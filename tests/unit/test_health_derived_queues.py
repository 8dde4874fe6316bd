"""doctor's handler timeouts and the dedupe check's retry paths cover every queue a consumer
serves: a file's work queues, their lane (``W.lane.L``) and partition (``W.pI``) queues — not a
partitioned parent, which is no queue on the broker (topologies/flow.toml)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from rmqkit.health.dedupe import retry_paths
from rmqkit.health.doctor import topology_handler_timeouts
from rmqkit.topology import load_topology

FLOW = Path(__file__).resolve().parents[2] / "topologies" / "flow.toml"
SERVED = {
    "media.work",
    "media.work.lane.large",
    "media.work.lane.bulk",
    *(f"accounts.work.p{i}" for i in range(4)),
    "ledger.work",
}


def test_flow_toml_serves_what_these_tests_expect() -> None:
    assert set(load_topology(FLOW).work_queue_names()) == SERVED


def test_retry_paths_cover_lanes_and_partitions_not_a_partitioned_parent() -> None:
    topology = load_topology(FLOW)
    # With a topology the snapshot and roles are not read.
    paths = retry_paths(cast(Any, None), {}, topology)
    assert set(paths) == SERVED
    # A lane's and a partition's path are their parent's: 4 retries (max_attempts 5, the
    # default) up to the longest tier, 10 s.
    assert paths["media.work.lane.large"] == paths["media.work"]
    assert paths["accounts.work.p3"][0] == 40.0
    assert "max_attempts 5 in the topology" in paths["accounts.work.p0"][1]


def test_handler_timeouts_cover_lanes_and_partitions(tmp_path: Path) -> None:
    text = FLOW.read_text(encoding="utf-8")
    text = text.replace("prefetch = 50\n", 'prefetch = 50\nhandler_timeout = "2m"\n', 1)
    text = text.replace(
        'partition_key = "account_id"\n',
        'partition_key = "account_id"\nhandler_timeout = "45s"\n',
        1,
    )
    path = tmp_path / "flow.toml"
    path.write_text(text, encoding="utf-8")
    timeouts = topology_handler_timeouts(load_topology(path))
    assert set(timeouts) == SERVED - {"ledger.work"}  # ledger.work has none: the default
    assert timeouts["media.work.lane.large"] == (120.0, "topology handler_timeout")
    assert timeouts["accounts.work.p2"] == (45.0, "topology handler_timeout")
    assert "accounts.work" not in timeouts

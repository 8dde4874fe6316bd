"""The upgrade preflight's checks that need a cluster or a release this machine does not run
(a 2- or 3-node cluster with a node down, a release with stable flags disabled): pure checks
over a hand-made snapshot. What each refusal looks like on 4.3 is shown against the real
brokers in tests/integration/test_doctor_upgrade.py."""

from __future__ import annotations

import pytest

from rmqkit.broker.snapshot import NodeView, Snapshot
from rmqkit.errors import UsageError
from rmqkit.health.checks.upgrade import feature_flags, khepri_majority, upgrade_path
from rmqkit.health.findings import CheckSkipped, DoctorInput, UpgradeFacts
from rmqkit.health.upgrade import parse_target


def inp(
    version: tuple[int, int, int] = (4, 2, 3),
    nodes: list[NodeView] | None = None,
    flags: dict[str, tuple[str, str]] | None = None,
) -> DoctorInput:
    snapshot = Snapshot("/", version, {}, {}, [], [], [], None, nodes=nodes)
    return DoctorInput(snapshot, {}, upgrade=UpgradeFacts((4, 3), None, flags))


def nodes(*running: bool) -> list[NodeView]:
    return [NodeView(f"rabbit@n{i}", up) for i, up in enumerate(running)]


@pytest.mark.parametrize(
    ("running", "expected"),
    [
        ((True,), []),
        ((True, True, True), []),
        ((True, True), ["warning"]),
        ((True, True, False), ["warning"]),
        ((True, False, False), ["critical"]),
        ((True, False), ["critical"]),
    ],
)
def test_khepri_majority(running: tuple[bool, ...], expected: list[str]) -> None:
    assert [f.severity for f in khepri_majority(inp(nodes=nodes(*running)))] == expected


def test_khepri_majority_without_the_nodes_is_skipped_not_passed() -> None:
    with pytest.raises(CheckSkipped, match="monitoring tag"):
        khepri_majority(inp(nodes=None))


def test_only_4_2_upgrades_in_place() -> None:
    assert [f.severity for f in upgrade_path(inp((4, 1, 7)))] == ["critical"]
    assert upgrade_path(inp((4, 2, 0))) == []


def test_disabled_stable_and_required_flags_and_khepri_are_critical() -> None:
    flags = {
        "quorum_queue": ("enabled", "required"),
        "stream_filtering": ("disabled", "stable"),
        "message_containers_deaths_v2": ("disabled", "experimental"),
        "some_experiment": ("disabled", "experimental"),
        "khepri_db": ("disabled", "experimental"),
    }
    found = feature_flags(inp(flags=flags))
    assert [f.severity for f in found] == ["critical", "critical"]
    assert "message_containers_deaths_v2, stream_filtering" in found[0].evidence
    assert "some_experiment" not in found[0].evidence
    assert "khepri_db is disabled" in found[1].evidence
    assert feature_flags(inp(flags={"khepri_db": ("enabled", "stable")})) == []


def test_unknown_targets_are_a_usage_error() -> None:
    assert parse_target("4.3") == (4, 3)
    with pytest.raises(UsageError, match=r"knows 4\.3"):
        parse_target("5.0")

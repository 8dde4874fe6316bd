"""Fault-suite options: `--soak` (or RMQKIT_SOAK=1) runs the cluster scenarios with 100,000
messages each; the ledger tables of every scenario are printed together at the end of the run."""

from __future__ import annotations

import os

import pytest

from tests.faults import ledger

SOAK_TIMEOUT_S = 3600


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak",
        action="store_true",
        default=False,
        help="fault suite: run the cluster scenarios with 100,000 messages each (RMQKIT_SOAK=1)",
    )


def soak_enabled(config: pytest.Config) -> bool:
    try:
        flag = bool(config.getoption("soak"))
    except ValueError:  # this conftest was not loaded at startup: the option does not exist
        flag = False
    return flag or os.environ.get("RMQKIT_SOAK") == "1"


def pytest_configure(config: pytest.Config) -> None:
    if soak_enabled(config):
        os.environ["RMQKIT_SOAK"] = "1"  # the scenario module reads its counts from here


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Larger counts get a per-test timeout to match (300 s per 2,000 messages, at most 1 h)."""
    count = int(os.environ.get("RMQKIT_FAULT_COUNT", 0)) or (100_000 if soak_enabled(config) else 0)
    if count <= 2_000:
        return
    timeout = min(SOAK_TIMEOUT_S, max(300, 300 * count // 2_000))
    for item in items:
        if "test_cluster_scenarios" in item.nodeid:
            item.add_marker(pytest.mark.timeout(timeout))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not ledger.TABLES:
        return
    terminalreporter.section("fault-suite ledger")
    terminalreporter.write_line(ledger.render(ledger.TABLES))
    for report in ledger.TABLES:
        extra = []
        if report.parked_by_reason:
            extra.append(f"parked by reason {report.parked_by_reason}")
        extra += report.notes
        if extra:
            terminalreporter.write_line(f"{report.scenario}: " + "; ".join(extra))

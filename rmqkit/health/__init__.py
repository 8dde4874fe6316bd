"""Broker health: `rmqkit status` (queue depths and rates) and `rmqkit doctor` (the
reliability checklist against a live vhost).

``roles`` (which queue is work, wait or parking), ``status`` (depths and rates per lane),
``findings`` (what a check reads and produces), ``checks`` (the checklist), ``dedupe`` (what
``doctor --dedupe`` reads from the idempotent-consumer store) and ``doctor`` (fetch once, run
the checks, the report)."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rmqkit.broker.snapshot import QueueView, Snapshot, read_snapshot
    from rmqkit.health.checks import CHECKS, Check, CheckSkipped, DoctorInput, Finding
    from rmqkit.health.doctor import CheckResult, DoctorReport, run_checks, run_doctor
    from rmqkit.health.findings import Severity
    from rmqkit.health.roles import classify
    from rmqkit.health.status import (
        GroupStatus,
        QueueStatus,
        StatusReport,
        build_status,
        read_status,
        read_status_once,
    )

# Loaded on first use (PEP 562): `rmqkit status` imports rmqkit.health.status, and with it
# this package, so importing the whole checklist here cost every status start-up ~30 ms.
_HOMES = {
    "QueueView": "rmqkit.broker.snapshot",
    "Snapshot": "rmqkit.broker.snapshot",
    "read_snapshot": "rmqkit.broker.snapshot",
    "CHECKS": "rmqkit.health.checks",
    "Check": "rmqkit.health.checks",
    "CheckSkipped": "rmqkit.health.checks",
    "DoctorInput": "rmqkit.health.checks",
    "Finding": "rmqkit.health.checks",
    "CheckResult": "rmqkit.health.doctor",
    "DoctorReport": "rmqkit.health.doctor",
    "run_checks": "rmqkit.health.doctor",
    "run_doctor": "rmqkit.health.doctor",
    "Severity": "rmqkit.health.findings",
    "classify": "rmqkit.health.roles",
    "GroupStatus": "rmqkit.health.status",
    "QueueStatus": "rmqkit.health.status",
    "StatusReport": "rmqkit.health.status",
    "build_status": "rmqkit.health.status",
    "read_status": "rmqkit.health.status",
    "read_status_once": "rmqkit.health.status",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'rmqkit.health' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(home), name)


__all__ = [
    "CHECKS",
    "Check",
    "CheckResult",
    "CheckSkipped",
    "DoctorInput",
    "DoctorReport",
    "Finding",
    "GroupStatus",
    "QueueStatus",
    "QueueView",
    "Severity",
    "Snapshot",
    "StatusReport",
    "build_status",
    "classify",
    "read_snapshot",
    "read_status",
    "read_status_once",
    "run_checks",
    "run_doctor",
]

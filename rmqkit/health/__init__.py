"""Broker health: `rmqkit status` (queue depths and rates) and `rmqkit doctor` (the
reliability checklist against a live vhost)."""

from rmqkit.broker.snapshot import QueueView, Snapshot, read_snapshot
from rmqkit.health.checks import CHECKS, Check, CheckSkipped, DoctorInput, Finding, Severity
from rmqkit.health.doctor import CheckResult, DoctorReport, run_checks, run_doctor
from rmqkit.health.roles import classify
from rmqkit.health.status import (
    GroupStatus,
    QueueStatus,
    StatusReport,
    build_status,
    read_status,
    read_status_once,
)

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

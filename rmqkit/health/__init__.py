"""Broker health: `rmqkit status` (queue depths and rates) and `rmqkit doctor` (the
reliability checklist against a live vhost).

``roles`` (which queue is work, wait or parking), ``status`` (depths and rates per lane),
``findings`` (what a check reads and produces), ``checks`` (the checklist), ``dedupe`` (what
``doctor --dedupe`` reads from the idempotent-consumer store) and ``doctor`` (fetch once, run
the checks, the report)."""

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

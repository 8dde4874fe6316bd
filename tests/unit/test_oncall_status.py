"""`rmqkit status` at 80 columns keeps queue names whole (issue 14): a name folded over two
lines is copied wrong into the next command. On 19871ec the names were folded."""

from __future__ import annotations

from datetime import UTC, datetime

from rich.console import Console

from rmqkit.cli.status import status_table
from rmqkit.health.status import QueueStatus, StatusReport

NAMES = (
    "payments.settlement.work",
    "payments.settlement.work.parking",
    "notifications.email.outbound",
)


def test_queue_names_stay_whole_at_80_columns() -> None:
    queues = [
        QueueStatus(name=name, role="work", owner=name, ready=12345, unacked=0, consumers=3)
        for name in NAMES
    ]
    report = StatusReport("orders", (3, 10, 8), datetime.now(UTC), queues)
    console = Console(width=80, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(status_table(report))
    text = console.export_text()
    assert all(len(line) <= 80 for line in text.splitlines())
    for name in NAMES:
        assert name in text, text

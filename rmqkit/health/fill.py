"""What `rmqkit status` reads besides the management snapshot, where the snapshot lacks it.

- Ready counts: the management API's stats lag (by its stats interval, 5 s by default): a
  queue that just got its first messages has no ``messages_ready`` yet (``-`` in the table
  right after a publish; 3.10) or still shows 0 (4.x quorum queues). ``with_amqp_counts`` asks
  the broker itself for those, by passive declare: immediate, and it touches no message. A
  non-zero count that lags stays as the API gives it (it does not say "empty" wrongly), and
  at most ``MAX_DECLARED`` queues are asked per reading (a vhost of thousands of empty queues).
- Parking ages: ``with_parking_ages`` browses each non-empty parking queue (`--parking-age`).
"""

from __future__ import annotations

from dataclasses import replace

from rmqkit.broker.session import session
from rmqkit.errors import DataError, RmqkitError
from rmqkit.health.status import GroupStatus, QueueStatus, StatusReport
from rmqkit.parking.model import ParkedFilter
from rmqkit.parking.ops import parking_stats
from rmqkit.settings import Settings

MAX_DECLARED = 200  # passive declares per reading, at most


def with_rows(report: StatusReport, rows: list[QueueStatus]) -> StatusReport:
    """``report`` with its rows replaced (same names, same order), groups included."""
    by_name = {r.name: r for r in rows}
    groups = [GroupStatus(g.work, [by_name[q.name] for q in g.queues]) for g in report.groups]
    return replace(report, queues=rows, groups=groups)


async def with_amqp_counts(settings: Settings, report: StatusReport) -> StatusReport:
    """Fill the ready counts (and consumers) the management API has none of yet, or shows as
    0, from a passive declare of each such queue. No such queue: no connection. AMQP
    unreachable: the rows stay as they are (the report's broker warning says why)."""
    missing = sorted(r.name for r in report.queues if r.exists and not r.ready)[:MAX_DECLARED]
    if not missing:
        return report
    found: dict[str, tuple[int, int]] = {}
    try:
        async with session(settings, name="rmqkit status") as probes:
            for name in missing:
                try:
                    depth = await probes.queue_depth(name)
                except DataError:  # deleted since the snapshot
                    continue
                found[name] = (depth.ready, depth.consumers)
    except RmqkitError:
        return report
    rows = [
        replace(
            row,
            ready=found[row.name][0],
            consumers=row.consumers if row.consumers is not None else found[row.name][1],
            ready_from="passive declare",
        )
        if row.name in found
        else row
        for row in report.queues
    ]
    return with_rows(report, rows)


async def with_parking_ages(settings: Settings, report: StatusReport) -> StatusReport:
    """Each non-empty parking queue's oldest age, by browsing it (reads every message)."""
    rows: list[QueueStatus] = []
    for row in report.queues:
        if row.role != "parking" or not row.exists or not (row.messages or row.ready):
            rows.append(row)
            continue
        try:
            stats = await parking_stats(settings, row.name, ParkedFilter())
        except RmqkitError as exc:  # e.g. a delivery limit makes browsing unsafe: say so
            rows.append(replace(row, note=f"age not read: {exc}"))
            continue
        rows.append(replace(row, oldest_age_s=stats.oldest_age_s, oldest_age_from="browse"))
    return with_rows(report, rows)


__all__ = ["with_amqp_counts", "with_parking_ages", "with_rows"]

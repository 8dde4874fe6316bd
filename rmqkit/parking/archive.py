"""Archive and restore: parked messages set aside in the parking queue's archive queue
(``P.archive``, declared by a topology's ``archive = "30d"``) and brought back, each moved as a
replay is (confirmed copy, then ack), so that clearing the lane no longer means purging it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from rmqkit import headers as h
from rmqkit.names import archive_queue, archived_from
from rmqkit.parking.model import ParkedFilter, ParkedMessage
from rmqkit.parking.moves import MoveReport, move_parked
from rmqkit.parking.ops import Progress
from rmqkit.settings import Settings


def archived_headers(message: ParkedMessage, now: datetime) -> dict[str, Any]:
    """An archived copy's headers: the parked message's own (its failure history and
    fingerprint are what a later restore or audit needs) and when it was archived.

    The broker's headers do not travel with a copy (rmqkit publishes none of them, and 4.0+
    ignores a client's x-death), so when the broker's dead-lettering is what parked the message
    (a delivery limit, a retention), what the parking views read from x-death is written into
    rmqkit's own headers: the archived copy lists, filters and groups as the parked one did.
    """
    out = h.strip_broker_headers(message.headers)
    if not message.own_parking:
        # The broker's death is the newest: rmqkit's error fields (if any) are older and
        # the views do not show them; the same goes for the copy.
        for stale in (h.ERROR_TYPE, h.ERROR_MESSAGE, h.TRACEBACK, h.FINGERPRINT):
            out.pop(stale, None)
        derived: dict[str, Any] = {
            h.PARK_REASON: message.reason,
            h.ORIGIN_QUEUE: message.origin_queue,
            h.ORIGINAL_ROUTING_KEY: message.original_routing_key,
            h.ATTEMPT: message.attempts,
            h.FIRST_FAILED_AT: _moment(message.first_failed_at),
            h.LAST_FAILED_AT: _moment(message.last_failed_at),
        }
        out.update({k: v for k, v in derived.items() if v is not None})
    out[h.ARCHIVED_AT] = h.format_timestamp(now)
    return out


def restored_headers(message: ParkedMessage, now: datetime) -> dict[str, Any]:
    """A restored copy's headers: as it was archived, the archive time dropped."""
    out = h.strip_broker_headers(message.headers)
    out.pop(h.ARCHIVED_AT, None)
    return out


def _moment(value: datetime | None) -> str | None:
    return None if value is None else h.format_timestamp(value)


def _archive_advice(parking: str) -> str:
    return (
        f'give the work queue `archive = "30d"` (how long to keep archived messages) in the '
        f"topology file and run `rmqkit declare`: parking queue {parking!r} has no archive"
    )


async def archive_parked(
    settings: Settings,
    queue: str,
    flt: ParkedFilter,
    *,
    dry_run: bool = False,
    limit: int | None = None,
    progress: Progress | None = None,
    report: MoveReport | None = None,
) -> MoveReport:
    """Move matching messages of parking queue ``queue`` to its archive queue, each acked only
    after its copy is confirmed: a crash leaves each in parking, in the archive, or (within
    the confirm window) in both, never in neither. Run again, it continues with what is left."""
    archive = archive_queue(queue)

    def route(message: ParkedMessage) -> tuple[str, str]:
        return "", archive

    return await move_parked(
        settings,
        queue,
        flt,
        route=route,
        rewrite=archived_headers,
        require_queue=(archive, _archive_advice(queue)),
        dry_run=dry_run,
        limit=limit,
        progress=progress,
        report=report,
    )


async def restore_archived(
    settings: Settings,
    queue: str,
    flt: ParkedFilter,
    *,
    dry_run: bool = False,
    limit: int | None = None,
    progress: Progress | None = None,
    report: MoveReport | None = None,
) -> MoveReport:
    """Move matching messages of parking queue ``queue``'s archive back into ``queue``, as
    ``archive_parked`` moves them (never lost, at worst in both). Parked again, a message can
    be replayed, exported or archived once more."""
    archive = archive_queue(queue)
    advice = _archive_advice(queue)
    if archived_from(queue) is not None:
        advice += f" (give the parking queue, not the archive: {archived_from(queue)!r}?)"

    def route(message: ParkedMessage) -> tuple[str, str]:
        return "", queue

    return await move_parked(
        settings,
        archive,
        flt,
        route=route,
        rewrite=restored_headers,
        source_missing=advice,
        dry_run=dry_run,
        limit=limit,
        progress=progress,
        report=report,
    )

"""Export parked messages to NDJSON and import them back, exactly (typed field values)."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import aiormq

from rmqkit.broker.amqp import connect
from rmqkit.broker.confirms import ConfirmedPublisher, Outcome, outcome_of
from rmqkit.errors import DataError
from rmqkit.parking.browse import Verdict, browse
from rmqkit.parking.model import ParkedFilter, ParkedMessage
from rmqkit.parking.ops import PUBLISH_WINDOW, Progress, parking_session
from rmqkit.parking.records import dumps_record, loads_record, message_to_record, record_to_message
from rmqkit.settings import Settings

FSYNC_EVERY = 1000  # with --remove: messages written between an fsync and their acks


@dataclass
class ExportReport:
    written: int = 0
    removed: int = 0


async def export_parked(
    settings: Settings,
    queue: str,
    flt: ParkedFilter,
    out: TextIO,
    *,
    remove: bool = False,
    progress: Progress | None = None,
) -> ExportReport:
    """Write matching messages to ``out`` as NDJSON; the queue keeps them unless ``remove``.

    With ``remove`` a message is acked only after its line was written, flushed and fsynced
    (``out`` must then be a real file).
    """
    report = ExportReport()
    now = datetime.now(UTC)
    batch: list[asyncio.Future[bool]] = []
    loop = asyncio.get_running_loop()
    seen = 0

    def sync_to_disk() -> None:
        out.flush()
        os.fsync(out.fileno())
        for future in batch:
            future.set_result(True)
        report.removed += len(batch)
        batch.clear()

    async with parking_session(settings, queue) as session:
        total = 0

        async def visit(message: ParkedMessage) -> Verdict | asyncio.Future[bool]:
            nonlocal seen
            seen += 1
            if progress is not None:
                progress(seen, total)
            if not flt.matches(message, now):
                return Verdict.KEEP
            record = message_to_record(
                message.properties, message.body, delivery_info={"queue": queue}
            )
            out.write(dumps_record(record) + "\n")
            report.written += 1
            if not remove:
                return Verdict.KEEP
            future: asyncio.Future[bool] = loop.create_future()
            batch.append(future)
            if len(batch) >= FSYNC_EVERY:
                sync_to_disk()
            return future

        async def settle() -> None:
            if batch:
                sync_to_disk()
            out.flush()

        channel = await session.raw.channel()
        declared = await channel.queue_declare(queue, passive=True)
        total = int(declared.message_count or 0)
        await channel.close()
        await browse(session.raw, queue, visit, settle=settle)
    return report


@dataclass
class ImportReport:
    records: int = 0
    published: int = 0
    returned: int = 0
    nacked: int = 0
    problems: Counter[str] = field(default_factory=Counter)

    @property
    def partial(self) -> bool:
        return self.published < self.records

    def as_dict(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "published": self.published,
            "returned": self.returned,
            "nacked": self.nacked,
        }


def read_export(path: Path) -> list[dict[str, Any]]:
    """Every record of an export file, validated before anything is published (exit 65)."""
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        raise DataError(f"{path}: cannot be read: {exc}") from None
    with handle:
        return [
            loads_record(line, number, source=str(path))
            for number, line in enumerate(handle, start=1)
            if line.strip()
        ]


async def import_records(
    settings: Settings,
    records: list[dict[str, Any]],
    queue: str,
    *,
    progress: Progress | None = None,
) -> ImportReport:
    """Publish ``records`` to ``queue`` (default exchange), confirmed and mandatory."""
    report = ImportReport(records=len(records))
    conn = await connect(settings, name=f"rmqkit import {queue}")
    try:
        raw: aiormq.abc.AbstractConnection = conn.transport.connection  # type: ignore[union-attr]
        probe = await raw.channel()
        try:
            await probe.queue_declare(queue, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            raise DataError(f"queue {queue!r} does not exist — declare it first") from None
        await probe.close()
        channel = await raw.channel(publisher_confirms=True)
        publisher = ConfirmedPublisher(channel, window=PUBLISH_WINDOW)
        done = 0

        def count(settled: asyncio.Future[Outcome]) -> None:
            nonlocal done
            done += 1
            if progress is not None:
                progress(done, report.records)
            outcome = outcome_of(settled)
            if isinstance(outcome, str):
                report.nacked += 1
                report.problems[f"publish failed: {outcome}"] += 1
            elif outcome is Outcome.CONFIRMED:
                report.published += 1
            elif outcome is Outcome.NACKED:
                report.nacked += 1
                report.problems["nacked by the broker (queue full?)"] += 1
            else:
                report.returned += 1
                report.problems["returned: unroutable"] += 1

        futures = []
        try:
            for index, record in enumerate(records):
                properties, body = record_to_message(record)
                try:
                    settled = await publisher.publish(
                        body, exchange="", routing_key=queue, properties=properties
                    )
                except Exception as exc:  # the channel is gone: the rest cannot be sent
                    unsent = report.records - index
                    report.nacked += unsent
                    report.problems[f"publish failed: {type(exc).__name__}"] += unsent
                    break
                settled.add_done_callback(count)
                futures.append(settled)
            await asyncio.gather(*futures, return_exceptions=True)
        finally:
            await publisher.close()
        await channel.close()
    finally:
        await conn.close()
    return report

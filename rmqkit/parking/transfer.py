"""Export parked messages to NDJSON and import them back, exactly (typed field values)."""

from __future__ import annotations

import asyncio
import functools
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import unquote, urlsplit

from rmqkit import headers as h
from rmqkit.broker.management import management
from rmqkit.broker.session import Outcome, Session, open_session, outcome_of
from rmqkit.crypto import KeyRing
from rmqkit.errors import BrokerUnavailable, DataError, UsageError
from rmqkit.fileout import OutputError, SafeOutput
from rmqkit.names import is_parking_name, parking_queue
from rmqkit.parking.browse import Verdict, browse
from rmqkit.parking.guards import check_import_target
from rmqkit.parking.journal import ImportJournal, record_digest
from rmqkit.parking.model import ParkedFilter, ParkedMessage, decrypted_body
from rmqkit.parking.ops import PUBLISH_WINDOW, Progress, parking_session, ready_count
from rmqkit.parking.records import dumps_record, loads_record, message_to_record, record_to_message
from rmqkit.settings import Settings

FSYNC_EVERY = 1000  # with --remove: messages written between an fsync and their acks


@dataclass
class ExportReport:
    written: int = 0  # lines in the output (with remove: each one durable, its message acked)
    removed: int = 0


async def export_parked(
    settings: Settings,
    queue: str,
    flt: ParkedFilter,
    out: TextIO | SafeOutput,
    *,
    remove: bool = False,
    progress: Progress | None = None,
    keyring: KeyRing | None = None,
) -> ExportReport:
    """Write matching messages to ``out`` as NDJSON; the queue keeps them unless ``remove``.

    Bodies are written as stored (encrypted fields as their envelopes); with ``keyring``
    (``export --decrypt``) with every envelope opened, bad ones marked (``decrypted_body``).

    With ``remove`` (``out`` must then be a ``SafeOutput``) a message is acked only after its
    line was written, fsynced and the file put under its name. A write error stops the export
    at once (OutputError, exit 74): the file then holds exactly the removed messages, one
    complete line each, and every other message stays parked.
    """
    if remove and not isinstance(out, SafeOutput):
        raise TypeError("export_parked(remove=True) needs a SafeOutput")
    report = ExportReport()
    now = datetime.now(UTC)
    batch: list[asyncio.Future[bool]] = []
    loop = asyncio.get_running_loop()
    seen = 0
    failure: list[OutputError] = []

    def settle_batch(ok: bool) -> None:
        for future in batch:
            future.set_result(ok)
        if ok:
            report.removed += len(batch)
        batch.clear()

    def sync_to_disk() -> None:
        """fsync what was written, then let the browse ack it; on an error, ack nothing more."""
        try:
            if isinstance(out, SafeOutput):
                out.sync(publish=True)
            else:
                out.flush()
        except OutputError as exc:
            failure.append(exc)
        except OSError as exc:  # stdout (a pipe, or a redirect to a full disk)
            failure.append(OutputError(f"writing the export failed: {exc.strerror or exc}"))
        settle_batch(not failure)

    def write(line: str) -> bool:
        try:
            out.write(line)
        except OutputError as exc:
            failure.append(exc)
        except OSError as exc:
            failure.append(OutputError(f"writing the export failed: {exc.strerror or exc}"))
        if failure:
            settle_batch(False)
        return not failure

    async with parking_session(settings, queue) as session:
        total = 0

        async def visit(message: ParkedMessage) -> Verdict | asyncio.Future[bool]:
            nonlocal seen
            seen += 1
            if progress is not None:
                progress(seen, total)
            if failure:
                return Verdict.STOP
            if not flt.matches(message, now):
                return Verdict.KEEP
            body = message.body if keyring is None else decrypted_body(message.body, keyring)
            record = message_to_record(message.properties, body, delivery_info={"queue": queue})
            if not write(dumps_record(record) + "\n"):
                return Verdict.STOP
            report.written += 1
            if not remove:
                return Verdict.KEEP
            future: asyncio.Future[bool] = loop.create_future()
            batch.append(future)
            if len(batch) >= FSYNC_EVERY:
                sync_to_disk()
            return future

        async def settle() -> None:
            # Called by the browse before it acks or returns anything: never raises, or the
            # acks of lines already durable would not be sent.
            if failure:
                return
            # stdout is flushed now; a SafeOutput without remove is committed by the caller
            if (remove and batch) or not isinstance(out, SafeOutput):
                sync_to_disk()

        total = await ready_count(session)
        await browse(session.amqp, queue, visit, settle=settle)
    if failure:
        if remove:
            report.written = report.removed
            raise OutputError(
                f"{failure[0]} — {report.removed} message(s) were exported and removed before "
                "it (each a complete line in the file); every other message stays parked"
            )
        raise OutputError(f"{failure[0]} — the export is incomplete; the queue keeps every message")
    return report


@dataclass
class ImportReport:
    records: int = 0
    published: int = 0
    skipped: int = 0  # confirmed by an earlier run, per the journal (--resume)
    returned: int = 0
    nacked: int = 0
    problems: Counter[str] = field(default_factory=Counter)
    journal: Path | None = None

    @property
    def partial(self) -> bool:
        return self.published + self.skipped < self.records

    def as_dict(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "published": self.published,
            "skipped": self.skipped,
            "returned": self.returned,
            "nacked": self.nacked,
            "journal": None if self.journal is None else str(self.journal),
        }


@dataclass(frozen=True)
class ExportLine:
    """One record of an export file and the line it is on."""

    number: int
    record: dict[str, Any]


def read_export(path: Path) -> list[ExportLine]:
    """Every record of an export file, validated before anything is published (exit 65)."""
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        raise DataError(f"{path}: cannot be read: {exc}") from None
    with handle:
        return [
            ExportLine(number, loads_record(line, number, source=str(path)))
            for number, line in enumerate(handle, start=1)
            if line.strip()
        ]


def _login_user(settings: Settings) -> str | None:
    username = urlsplit(settings.amqp_urls[0]).username
    return None if username is None else unquote(username)


def check_publishable(lines: Sequence[ExportLine], user: str | None, source: str) -> None:
    """Refuse (exit 65, file:line) what the broker would refuse by closing the channel and
    that a record cannot know alone: a ``user_id`` other than the importing user's."""
    if user is None:  # no user in the URL (EXTERNAL auth): the broker decides
        return
    for line in lines:
        user_id = line.record.get("properties", {}).get("user_id")
        if user_id is not None and user_id != user:
            raise DataError(
                f"{source}:{line.number}: properties.user_id {user_id!r} is not the importing "
                f"user {user!r}: RabbitMQ refuses it (only a user tagged impersonator may "
                "publish it) — remove the field, or import as that user"
            )


async def import_records(
    settings: Settings,
    records: Sequence[ExportLine | Mapping[str, Any]],
    queue: str,
    *,
    journal: ImportJournal | None = None,
    resume: bool = False,
    again: bool = False,
    source: str = "records",
    progress: Progress | None = None,
) -> ImportReport:
    """Publish ``records`` to ``queue`` (default exchange), confirmed and mandatory.

    With a ``journal`` each confirmed record is recorded; a journal from an earlier run is
    refused unless ``resume`` (skip what it holds) or ``again`` (publish everything anew).
    """
    lines = [
        r if isinstance(r, ExportLine) else ExportLine(i, dict(r))
        for i, r in enumerate(records, start=1)
    ]
    check_publishable(lines, _login_user(settings), source)
    report = ImportReport(records=len(lines))
    skip: Counter[str] = Counter()
    amqp = await open_session(settings, name=f"rmqkit import {queue}")
    try:
        await amqp.require_queue(queue, DataError, "declare it first")
        await _refuse_work_queue(settings, amqp, queue)
        if journal is not None:
            # What this broker holds, not another one with the same vhost and queue names.
            journal.for_broker(amqp.cluster_name or _hosts(settings))
            report.journal = journal.path
            done_before = journal.confirmed()
            if done_before.total() and not (resume or again):
                raise UsageError(
                    f"{source} was imported into {queue!r} before: {done_before.total()} of "
                    f"{len(lines)} record(s) confirmed (journal {journal.path}) — --resume to "
                    "publish only the others, --again to publish every record again "
                    "(duplicates)"
                )
            if resume:
                skip = done_before
            journal.start(fresh=again)
        try:
            await _publish_lines(amqp, lines, queue, report, skip, journal, progress)
        finally:
            if journal is not None:
                journal.close()
    finally:
        await amqp.close()
    return report


def _hosts(settings: Settings) -> str:
    """The AMQP ``host:port`` list: a broker's name when it reports no cluster name."""
    return ",".join(
        f"{parts.hostname}:{parts.port or (5671 if parts.scheme == 'amqps' else 5672)}"
        for parts in map(urlsplit, settings.amqp_urls)
    )


async def _refuse_work_queue(settings: Settings, amqp: Session, queue: str) -> None:
    """DataError (65) if ``queue`` is a work queue (its parking queue is the target the
    runbook means). Through the management API, as the other parking commands check; if
    that is out of reach, a queue with a ``<queue>.parking`` beside it is taken as one."""
    try:
        async with management(settings) as api:
            await check_import_target(api, queue, amqp.server_version)
        return
    except BrokerUnavailable:
        pass
    parking = parking_queue(queue)
    if not is_parking_name(queue) and await amqp.queue_exists(parking):
        raise DataError(
            f"{queue!r} is a work queue ({parking!r} is beside it), not a parking queue — "
            f"did you mean {parking!r}?"
        )


async def _publish_lines(
    amqp: Session,
    lines: list[ExportLine],
    queue: str,
    report: ImportReport,
    skip: Counter[str],
    journal: ImportJournal | None,
    progress: Progress | None,
) -> None:
    channel = await amqp.channel(confirms=True, window=PUBLISH_WINDOW)
    publisher = channel.publisher
    done = 0
    journal_error: list[OSError] = []
    unjournaled = 0
    add_failed = False

    def count(slot: int, digest: str, settled: asyncio.Future[Outcome]) -> None:
        nonlocal done, unjournaled, add_failed
        done += 1
        if progress is not None:
            progress(done, report.records)
        outcome = outcome_of(settled)
        if isinstance(outcome, str):
            report.nacked += 1
            report.problems[f"publish failed: {outcome}"] += 1
        elif outcome is Outcome.CONFIRMED:
            report.published += 1
            if journal is not None and not add_failed:
                try:
                    journal.add(slot, digest)  # into its reserved line: needs no new space
                except OSError as exc:
                    journal_error.append(exc)
                    add_failed = True
            if add_failed:
                unjournaled += 1
        elif outcome is Outcome.NACKED:
            report.nacked += 1
            report.problems["nacked by the broker (queue full?)"] += 1
        else:
            report.returned += 1
            report.problems["returned: unroutable"] += 1

    futures = []
    unsent = 0
    try:
        for index, line in enumerate(lines):
            digest = record_digest(line.record)
            if skip[digest] > 0:
                skip[digest] -= 1
                report.skipped += 1
                continue
            slot = 0
            if journal is not None and not journal_error:
                try:
                    slot = journal.reserve()
                except OSError as exc:
                    journal_error.append(exc)
            if journal_error:  # a confirm could not be recorded: stop publishing
                unsent = len(lines) - index
                report.problems["not published: the journal could not be written"] += unsent
                break
            properties, body = record_to_message(line.record)
            if properties.headers and not h.DELIVERY_COUNTERS.isdisjoint(properties.headers):
                # The exporting queue's delivery counts: the target queue keeps its own (a
                # classic queue would otherwise hand the stale numbers to consumers as content).
                properties.headers = {
                    k: v for k, v in properties.headers.items() if k not in h.DELIVERY_COUNTERS
                }
            try:
                settled = await publisher.publish(
                    body, exchange="", routing_key=queue, properties=properties
                )
            except Exception as exc:  # the channel is gone: the rest cannot be sent
                unsent = len(lines) - index
                report.nacked += unsent
                report.problems[f"line {line.number} and after not published: {exc}"] += unsent
                break
            settled.add_done_callback(functools.partial(count, slot, digest))
            futures.append(settled)
        await asyncio.gather(*futures, return_exceptions=True)
    finally:
        await publisher.close()
    await channel.close()
    if journal_error and journal is not None:
        raise OutputError(
            f"writing the import journal {journal.path} failed: "
            f"{journal_error[0].strerror or journal_error[0]} — {report.published} record(s) "
            f"confirmed in {queue!r}"
            + (
                f", {unjournaled} of them not in the journal (a --resume would publish those "
                "again: duplicates, never loss)"
                if unjournaled
                else ""
            )
            + f"; {unsent} not published: free space, then run the import with --resume"
        )

"""The import journal: which records of an export file a queue has already confirmed.

``rmqkit parking import FILE QUEUE`` keeps a journal in ``FILE.imported-<tag>`` (``<tag>``: a
digest of broker, vhost and queue, so imports of one file into two queues keep separate
journals, and an import into the wrong broker first — staging and production have the same
vhost and queue names — does not make the right one skip the records). The broker is the
cluster name the AMQP connection reports, else the AMQP ``host:port`` list.
Before a record is published its line is reserved (64 dashes); once the broker confirmed it,
the line is overwritten with the record's digest (``record_digest``: its properties and body,
what the import publishes). Reserving first means a full disk stops the import before a
publish whose confirm could not be recorded.

An import that stopped part way (a refused record, a lost connection, Ctrl-C, a full disk) is
continued with ``--resume``: records whose digest the journal holds are skipped, as many times
as it holds them (a file may hold identical records). A crash between a confirm and its
journal line can only cause a duplicate on resume, never a skipped record.

Format: a first line
``{"rmqkit_import_journal": 1, "vhost": …, "queue": …, "file": …, "broker": …}``,
then one line per published record: its 64-character hex digest, or dashes while (or if
never) confirmed. An incomplete last line (a crash mid-write) is ignored.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import json
import os
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rmqkit.errors import DataError
from rmqkit.fileout import OutputError

JOURNAL_VERSION = 1
SYNC_EVERY = 1000  # journal lines between fsyncs (a lost tail means duplicates, never loss)
_PLACEHOLDER = "-" * 64 + "\n"  # a reserved line: its record is not confirmed (yet)


def record_digest(record: Mapping[str, Any]) -> str:
    """The identity of what an export record publishes: its properties and body."""
    body = record.get("body")
    if body is None:  # body_text only (a hand-written record)
        body = base64.b64encode(str(record.get("body_text", "")).encode("utf-8")).decode()
    canonical = json.dumps(
        {"properties": record.get("properties"), "body": body},
        sort_keys=True,
        ensure_ascii=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def journal_path(file: Path, vhost: str, queue: str, broker: str = "") -> Path:
    """Where the journal of importing ``file`` into ``queue`` of ``vhost`` on ``broker``
    lives (an empty ``broker``: the tag of vhost and queue alone)."""
    key = f"{broker}\0{vhost}\0{queue}" if broker else f"{vhost}\0{queue}"
    tag = hashlib.sha256(key.encode()).hexdigest()[:12]
    return file.with_name(f"{file.name}.imported-{tag}")


class ImportJournal:
    """Read and append the journal of one (file, broker, vhost, queue).

    The broker is known once connected: ``for_broker`` sets it before the journal is read.
    """

    def __init__(self, file: Path, vhost: str, queue: str, broker: str = "") -> None:
        self.file = file
        self.path = journal_path(file, vhost, queue, broker)
        self.header = {
            "rmqkit_import_journal": JOURNAL_VERSION,
            "vhost": vhost,
            "queue": queue,
            "file": file.name,
            "broker": broker,
        }
        self._fd: int | None = None
        self._end = 0  # where the next line goes (we are the journal's only writer)
        self._unsynced = 0

    def for_broker(self, broker: str) -> None:
        """Key the journal on ``broker`` too (a cluster name, or the AMQP host:port list)."""
        self.header["broker"] = broker
        self.path = journal_path(
            self.file, str(self.header["vhost"]), str(self.header["queue"]), broker
        )

    def confirmed(self) -> Counter[str]:
        """Digest → how many records with it were confirmed (empty if there is no journal)."""
        try:
            text = self.path.read_text(encoding="ascii")
        except FileNotFoundError:
            return Counter()
        except (OSError, UnicodeDecodeError) as exc:
            raise DataError(f"{self.path}: cannot read the import journal: {exc}") from None
        lines = text.split("\n")
        complete = lines[:-1]  # what follows the last newline is a crash's partial line
        if not complete:
            return Counter()
        try:
            header = json.loads(complete[0])
        except ValueError:
            header = None
        if not isinstance(header, dict) or header.get("rmqkit_import_journal") != JOURNAL_VERSION:
            raise DataError(f"{self.path}: not an rmqkit import journal — move it away")
        if (
            header.get("vhost") != self.header["vhost"]
            or header.get("queue") != (self.header["queue"])
        ):
            raise DataError(
                f"{self.path}: journal of an import into {header.get('queue')!r} "
                f"(vhost {header.get('vhost')!r}), not this one — move it away"
            )
        return Counter(line for line in complete[1:] if len(line) == 64)

    def start(self, *, fresh: bool) -> None:
        """Open for appending (``fresh``: begin a new journal, replacing an old one)."""
        flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if fresh else 0)
        try:
            self._fd = os.open(self.path, flags, 0o666)
            self._end = os.fstat(self._fd).st_size
            if self._end == 0:
                self._append(json.dumps(self.header, separators=(",", ":")) + "\n")
            elif not self.path.read_bytes().endswith(b"\n"):
                self._append("\n")  # end a line that a crash cut short
            os.fsync(self._fd)
            directory = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        except OSError as exc:
            self.close()
            raise OutputError(
                f"cannot write the import journal {self.path}: {exc.strerror or exc} — "
                "nothing was published (the journal lets a rerun skip what was imported; "
                "copy FILE to a writable directory)"
            ) from None

    def reserve(self) -> int:
        """Make room for one record's line before it is published; returns where it is.

        The space is taken now, so a full disk stops the import before a publish whose
        confirm could not be recorded (a resume would then publish it twice).
        """
        slot = self._end
        self._append(_PLACEHOLDER)
        return slot

    def add(self, slot: int, digest: str) -> None:
        """Record one confirmed record in its reserved line (raises OSError)."""
        assert self._fd is not None
        os.pwrite(self._fd, digest.encode("ascii"), slot)  # overwrites: needs no new space
        self._unsynced += 1
        if self._unsynced >= SYNC_EVERY:
            self.sync()

    def sync(self) -> None:
        if self._fd is not None and self._unsynced:
            os.fsync(self._fd)
            self._unsynced = 0

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                self._unsynced += 1
                self.sync()
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def _append(self, text: str) -> None:
        assert self._fd is not None
        data = text.encode("ascii")
        written = os.pwrite(self._fd, data, self._end)
        if written != len(data):  # a size limit reached midway: take the part back
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._end)
            raise OSError(errno.EFBIG, "File too large")
        self._end += written

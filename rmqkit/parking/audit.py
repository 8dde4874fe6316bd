"""The audit log of `rmqkit parking edit`: one JSON line per edit, fsynced before it matters.

Each line says who edited which parked message, when, and what the bodies' SHA-256 digests
were before and after — never the bodies: they may hold personal data (sensitive fields), and
an audit log is kept, copied and read far more widely than a parking queue. The log is
appended through ``rmqkit.fileout.SafeOutput`` (``APPEND``): complete lines only, each fsynced
with the directory before the caller goes on, and a write error (disk full, a file size limit,
no permission) is ``OutputError`` (exit 74) with the file left holding its complete lines.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final
from urllib.parse import unquote, urlsplit

from rmqkit.errors import OutputError
from rmqkit.fileout import OutputMode, SafeOutput
from rmqkit.settings import Settings

DEFAULT_AUDIT_LOG: Final = Path("rmqkit-edits.log")
"""Where edits are logged unless ``--audit-log`` says otherwise (the current directory)."""


def body_digest(body: bytes) -> str:
    """The hex SHA-256 of ``body``: what the log records instead of the body itself."""
    return hashlib.sha256(body).hexdigest()


def amqp_user(settings: Settings) -> str:
    """The AMQP user the broker sees: the URL's (percent-decoded), else the client's default
    ``guest`` (aio-pika logs in as guest when the URL names no user)."""
    username = urlsplit(settings.amqp_urls[0]).username
    return "guest" if username is None else unquote(username)


def os_user() -> str:
    """The operating-system user running the command (a container without a passwd entry for
    the uid: the uid, so the line still says who)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # getpwuid fails for a uid with no entry
        return str(os.getuid())


@dataclass(frozen=True, slots=True)
class EditRecord:
    """One edit as the log records it (``event`` = ``edit``)."""

    at: str  # ISO-8601 UTC, as rmqkit's timestamp headers
    amqp_user: str
    os_user: str
    vhost: str
    queue: str  # the parking queue the original was in
    work_queue: str  # the topology's work queue that allows editing it
    message_id: str  # the original's
    new_message_id: str  # the edited copy's
    exchange: str  # where the copy was published ("" = the default exchange)
    routing_key: str
    body_sha256_before: str
    body_sha256_after: str
    handler: str | None  # the --handler the edited body was validated against, if any

    def as_dict(self) -> dict[str, Any]:
        return {"event": "edit", **asdict(self)}


class AuditLog:
    """The audit log file, open for appending; ``append`` returns once the line is durable.

    Opened before anything is published: a log that cannot be opened (a missing directory, a
    directory given as the file, a file with a cut last line) stops the edit with nothing done.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._out: SafeOutput | None = None

    def open(self) -> AuditLog:
        """Open (create if missing) the log; OutputError (74) or UsageError (64) if it cannot be."""
        self._out = SafeOutput(self.path, OutputMode.APPEND).open()
        return self

    def append(self, entry: Mapping[str, Any]) -> None:
        """Write ``entry`` as one JSON line and fsync it; OutputError (74) if it cannot be, the
        file then holding only its earlier complete lines (and the log closed)."""
        if self._out is None:
            raise OutputError(f"the audit log {self.path} is not open (an earlier write failed)")
        line = json.dumps(dict(entry), ensure_ascii=False, sort_keys=False)
        out = self._out
        try:
            out.write(line + "\n")
            out.sync(publish=True)
        except OutputError:
            self._out = None  # SafeOutput abandoned it: the fd is closed
            raise

    def close(self) -> None:
        """Close the log (everything appended is already durable)."""
        out, self._out = self._out, None
        if out is not None:
            with contextlib.suppress(OutputError):
                out.commit()

    def __enter__(self) -> AuditLog:
        return self.open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


__all__ = [
    "DEFAULT_AUDIT_LOG",
    "AuditLog",
    "EditRecord",
    "amqp_user",
    "body_digest",
    "os_user",
]

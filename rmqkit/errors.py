"""One exception tree for rmqkit; each error knows the process exit code the CLI maps it to.

Library code raises these and never exits; ``rmqkit.cli`` turns them into one line on stderr
and the exit code below (documented in docs/exit-codes.md; runbooks depend on them).
"""

from __future__ import annotations


class ExitCode:
    """Process exit codes, fixed by the design brief (sysexits-style where one exists)."""

    OK = 0
    BUG = 1
    USAGE = 64  # sysexits EX_USAGE; 2 is "changes pending" (plan) and "critical" (checks)
    PARTIAL = 3
    DATA = 65
    UNAVAILABLE = 69
    IO = 74  # a file could not be written (sysexits' EX_IOERR)
    ACCESS = 77
    CONFIG = 78
    INTERRUPTED = 130
    PIPE_CLOSED = 141  # stdout's reader went away (`| head`): 128 + SIGPIPE, as a shell reports it
    # `rmqkit plan` follows `terraform plan -detailed-exitcode`: 2 means "changes pending".
    CHANGES_PENDING = 2


class RmqkitError(Exception):
    """Base of every error rmqkit raises on purpose.

    ``str(error)`` is the one line shown to a user: what failed, then what to do about it.
    """

    exit_code: int = ExitCode.BUG


class UsageError(RmqkitError):
    """The command line was wrong in a way the parser could not see."""

    exit_code = ExitCode.USAGE


class PartialSuccess(RmqkitError):
    """Some of the work was done and some was not; the message says which."""

    exit_code = ExitCode.PARTIAL


class OutputError(RmqkitError):
    """A file could not be written (disk full, file size limit, permissions): exit 74."""

    exit_code = ExitCode.IO


class DataError(RmqkitError):
    """Bad input data: a topology file, a message, an export file."""

    exit_code = ExitCode.DATA


class TopologyFileError(DataError):
    """A topology file cannot be read or does not validate; names the file, key path and line."""

    def __init__(self, path: str, detail: str, *, key: str | None = None, line: int | None = None):
        self.path = path
        self.detail = detail
        self.key = key
        self.line = line
        where = path if line is None else f"{path}:{line}"
        what = f"{key}: {detail}" if key else detail
        super().__init__(f"{where}: {what}")


class TopologyConflict(DataError):
    """The broker holds objects that the topology cannot be applied over without loss.

    Also raised for PRECONDITION_FAILED (406) from the broker.
    """


class BrokerError(RmqkitError):
    """The broker answered in a way rmqkit did not expect (not a connectivity problem)."""

    exit_code = ExitCode.UNAVAILABLE


class BrokerUnavailable(BrokerError):
    """The broker (AMQP or management API) cannot be reached or is unhealthy."""

    exit_code = ExitCode.UNAVAILABLE


class DatabaseUnavailable(RmqkitError):
    """The database of a store (outbox, idempotency) cannot be reached or opened: exit 69."""

    exit_code = ExitCode.UNAVAILABLE


class AccessRefused(RmqkitError):
    """Wrong credentials, or the user lacks a permission it needs."""

    exit_code = ExitCode.ACCESS


class VhostRefused(AccessRefused):
    """The broker refused the vhost: it does not exist, or the user has no permissions on it.
    ``listed`` is set once the message names the vhosts the user can see."""

    listed: bool = False


class PermissionMissing(AccessRefused):
    """The login succeeded but the user lacks a tag or a vhost permission that one request
    needs; the message names which, on which resource (docs/permissions.md has the table)."""


class ConfigError(RmqkitError):
    """Settings are missing or invalid (environment, .env, flags), or a handler cannot be loaded."""

    exit_code = ExitCode.CONFIG


class UnsupportedDependency(ConfigError):
    """An installed client library (aio-pika, aiormq, pamqp) does not behave as rmqkit needs.

    Raised before anything is published: on such a version a returned message could be counted
    confirmed and its original acked (lost). The message names the installed and supported
    versions.
    """


class PublishFailed(RmqkitError):
    """Some messages of a ``rmqkit.Publisher`` call were not confirmed by the broker.

    ``results`` holds one ``rmqkit.PublishResult`` per message of the call, in order:
    ``confirmed`` ones are in their queues; the others (``unconfirmed``) were returned, refused
    or their fate is unknown (their ``outcome`` says which). Publishing the unconfirmed ones
    again with the same message_ids is safe for an idempotent consumer. The subclasses say
    why, and carry the exit code of that reason (the subclass order matters: the reason's
    class decides the code).
    """

    def __init__(self, message: str, results: tuple[object, ...] = ()) -> None:
        super().__init__(message)
        self.results = results

    @property
    def confirmed(self) -> tuple[object, ...]:
        """The results of the messages the broker confirmed."""
        return tuple(r for r in self.results if getattr(r, "confirmed", False))

    @property
    def unconfirmed(self) -> tuple[object, ...]:
        """The results of the messages the broker did not confirm."""
        return tuple(r for r in self.results if not getattr(r, "confirmed", False))


class Unroutable(PublishFailed, DataError):
    """A published message reached no queue (``mandatory``: returned): exit 65."""


class MessageTooLarge(PublishFailed, DataError):
    """The broker refused a message larger than its ``max_message_size`` (RabbitMQ 4.x: 16 MiB
    by default) by closing the channel: sending it again cannot help (exit 65)."""


class PublisherBusy(PublishFailed, BrokerUnavailable):
    """The broker refused messages (``basic.nack``), typically a bounded queue with
    ``overflow = reject-publish`` that is full: retry later (exit 69)."""


class PublishInterrupted(PublishFailed, BrokerUnavailable):
    """The connection was lost (and not re-established), the channel failed, or the broker
    confirmed nothing for the timeout: the unconfirmed messages' fate is unknown (exit 69)."""


class PublisherClosed(UsageError):
    """A ``rmqkit.Publisher`` was used after ``close()`` (or before it was opened)."""


class Interrupted(RmqkitError):
    """The user interrupted the command (Ctrl-C / SIGINT)."""

    exit_code = ExitCode.INTERRUPTED


class PublishStopped(Interrupted):
    """`rmqkit publish` was interrupted (Ctrl-C): the message says how many messages were
    published and confirmed, which were sent without a confirm, and how to resume; ``report``
    is the run's ``PublishReport`` (exit 130)."""

    def __init__(self, message: str, report: object) -> None:
        super().__init__(message)
        self.report = report


__all__ = [
    "AccessRefused",
    "BrokerError",
    "BrokerUnavailable",
    "ConfigError",
    "DataError",
    "DatabaseUnavailable",
    "ExitCode",
    "Interrupted",
    "PartialSuccess",
    "PublishFailed",
    "PublishInterrupted",
    "PublishStopped",
    "PublisherBusy",
    "PublisherClosed",
    "RmqkitError",
    "TopologyConflict",
    "TopologyFileError",
    "Unroutable",
    "UnsupportedDependency",
    "UsageError",
]

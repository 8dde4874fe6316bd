"""rmqkit: RabbitMQ consumers that lose nothing and never loop on poison."""

from rmqkit import outbox  # rmqkit.outbox.add(conn, ...): the transactional outbox
from rmqkit._version import __version__
from rmqkit.consumer.message import Message, Permanent, Retry
from rmqkit.errors import (
    AccessRefused,
    BrokerError,
    BrokerUnavailable,
    ConfigError,
    DatabaseUnavailable,
    DataError,
    ExitCode,
    OutputError,
    PartialSuccess,
    RmqkitError,
    TopologyConflict,
    TopologyFileError,
    UnsupportedDependency,
    UsageError,
)
from rmqkit.idempotency.record import Transaction
from rmqkit.settings import Settings, load_settings

__all__ = [
    "AccessRefused",
    "BrokerError",
    "BrokerUnavailable",
    "ConfigError",
    "DataError",
    "DatabaseUnavailable",
    "ExitCode",
    "Message",
    "OutputError",
    "PartialSuccess",
    "Permanent",
    "Retry",
    "RmqkitError",
    "Settings",
    "TopologyConflict",
    "TopologyFileError",
    "Transaction",
    "UnsupportedDependency",
    "UsageError",
    "__version__",
    "load_settings",
    "outbox",
]

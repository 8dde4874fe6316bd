"""rmqkit: RabbitMQ consumers that lose nothing and never loop on poison.

The public names below load on first use (PEP 562): ``import rmqkit`` stays cheap, so the CLI
starts fast (`rmqkit --help`) and a web app that only calls ``rmqkit.outbox.add``
does not import the consumer. ``from rmqkit import X`` and ``rmqkit.X`` work as usual.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rmqkit._version import __version__
from rmqkit.errors import (
    AccessRefused,
    BrokerError,
    BrokerUnavailable,
    ConfigError,
    DatabaseUnavailable,
    DataError,
    ExitCode,
    MessageTooLarge,
    OutputError,
    PartialSuccess,
    PublisherBusy,
    PublisherClosed,
    PublishFailed,
    PublishInterrupted,
    RmqkitError,
    TopologyConflict,
    TopologyFileError,
    Unroutable,
    UnsupportedDependency,
    UsageError,
)

if TYPE_CHECKING:
    from rmqkit import outbox
    from rmqkit.consumer.embedded import Consumer
    from rmqkit.consumer.hook_events import OutcomeEvent
    from rmqkit.consumer.hooks import Hooks
    from rmqkit.consumer.message import DecodeError, Message, Permanent, Retry
    from rmqkit.consumer.routing import Router, handler
    from rmqkit.crypto.model import Sensitive
    from rmqkit.idempotency.record import Transaction
    from rmqkit.publishing import Publisher, PublishMessage, PublishResult, SyncPublisher
    from rmqkit.settings import Settings, load_settings

# public name -> (module, attribute); attribute None: the module itself
_LAZY: dict[str, tuple[str, str | None]] = {
    "outbox": ("rmqkit.outbox", None),  # rmqkit.outbox.add(conn, ...): the transactional outbox
    # rmqkit.Consumer(handler, queue=...): `rmqkit consume` in the app's event loop (docs/api.md)
    "Consumer": ("rmqkit.consumer.embedded", "Consumer"),
    "DecodeError": ("rmqkit.consumer.message", "DecodeError"),
    "Message": ("rmqkit.consumer.message", "Message"),
    "Permanent": ("rmqkit.consumer.message", "Permanent"),
    "Retry": ("rmqkit.consumer.message", "Retry"),
    # @rmqkit.handler("order.created"): one of a module's routed handlers (docs/api.md)
    "handler": ("rmqkit.consumer.routing", "handler"),
    "Router": ("rmqkit.consumer.routing", "Router"),  # the same routes, built in code
    # rmqkit.Hooks(on_park=...): called after each outcome is settled (docs/hooks.md)
    "Hooks": ("rmqkit.consumer.hooks", "Hooks"),
    "OutcomeEvent": ("rmqkit.consumer.hook_events", "OutcomeEvent"),
    # Annotated[str, rmqkit.Sensitive()] on a pydantic model field: encrypted (docs/encryption.md)
    "Sensitive": ("rmqkit.crypto.model", "Sensitive"),
    "Transaction": ("rmqkit.idempotency.record", "Transaction"),
    # async with rmqkit.Publisher.connect(settings) as pub: confirmed publishing (docs/api.md)
    "Publisher": ("rmqkit.publishing.publisher", "Publisher"),
    "SyncPublisher": ("rmqkit.publishing.sync", "SyncPublisher"),
    "PublishMessage": ("rmqkit.publishing.prepare", "PublishMessage"),
    "PublishResult": ("rmqkit.publishing.results", "PublishResult"),
    "Settings": ("rmqkit.settings", "Settings"),
    "load_settings": ("rmqkit.settings", "load_settings"),
}


def __getattr__(name: str) -> Any:
    try:
        module_name, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'rmqkit' has no attribute {name!r}") from None
    module = importlib.import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "AccessRefused",
    "BrokerError",
    "BrokerUnavailable",
    "ConfigError",
    "Consumer",
    "DataError",
    "DatabaseUnavailable",
    "DecodeError",
    "ExitCode",
    "Hooks",
    "Message",
    "MessageTooLarge",
    "OutcomeEvent",
    "OutputError",
    "PartialSuccess",
    "Permanent",
    "PublishFailed",
    "PublishInterrupted",
    "PublishMessage",
    "PublishResult",
    "Publisher",
    "PublisherBusy",
    "PublisherClosed",
    "Retry",
    "RmqkitError",
    "Router",
    "Sensitive",
    "Settings",
    "SyncPublisher",
    "TopologyConflict",
    "TopologyFileError",
    "Transaction",
    "Unroutable",
    "UnsupportedDependency",
    "UsageError",
    "__version__",
    "handler",
    "load_settings",
    "outbox",
]

"""Testing handlers: ``run_handler`` (no broker) and the ``rmqkit_broker`` pytest fixture.

``from rmqkit.testing import run_handler`` runs a handler on one message through the consumer's
own decision code and returns what the consumer would do (ack, retry at a tier, park with a
reason). The ``rmqkit_broker`` fixture (rmqkit.testing.plugin, registered with pytest when rmqkit
is installed) declares a topology in a throwaway vhost of a real broker and runs the real
consumer in the test's process. See docs/testing.md.

The names load on first use, so that pytest loading the plugin imports nothing heavy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rmqkit.testing.broker import RmqkitBroker
    from rmqkit.testing.handlers import (
        HandlerAborted,
        UnawaitedResult,
        run_handler,
        run_handler_async,
        run_retries,
    )
    from rmqkit.testing.result import HandlerResult

_LAZY: dict[str, str] = {
    "HandlerAborted": "rmqkit.testing.handlers",
    "HandlerResult": "rmqkit.testing.result",
    "UnawaitedResult": "rmqkit.testing.handlers",
    "run_handler": "rmqkit.testing.handlers",
    "run_handler_async": "rmqkit.testing.handlers",
    "run_retries": "rmqkit.testing.handlers",
    "RmqkitBroker": "rmqkit.testing.broker",
}

__all__ = [
    "HandlerAborted",
    "HandlerResult",
    "RmqkitBroker",
    "UnawaitedResult",
    "run_handler",
    "run_handler_async",
    "run_retries",
]


def __getattr__(name: str) -> Any:
    try:
        module_name = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'rmqkit.testing' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])

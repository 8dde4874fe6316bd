"""Publishing: ``rmqkit.Publisher`` (async), ``rmqkit.SyncPublisher`` (its own loop in a
thread, for WSGI), ``PublishMessage`` (one message of ``publish_many``), ``PublishResult`` (how
the broker settled one message); and `rmqkit publish`'s parts: ``ids`` (stable message_ids),
``inputs`` (lines, --body, NDJSON), ``engine`` (the streaming confirmed publish), ``stream``
(``publish_input``: the command's one call — its topology edge, then the engine), ``edge``
(encrypt, then lane and delay, and the sensitive-id refusal — shared by both). See docs/api.md.

The names load on first use, as ``rmqkit``'s do: `rmqkit publish` without a topology imports
neither the crypto library nor the topology model.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rmqkit.publishing.prepare import PublishMessage
    from rmqkit.publishing.publisher import Publisher
    from rmqkit.publishing.results import PublishResult
    from rmqkit.publishing.sync import SyncPublisher

_LAZY = {
    "PublishMessage": "rmqkit.publishing.prepare",
    "Publisher": "rmqkit.publishing.publisher",
    "PublishResult": "rmqkit.publishing.results",
    "SyncPublisher": "rmqkit.publishing.sync",
}


def __getattr__(name: str) -> Any:
    try:
        module = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'rmqkit.publishing' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = ["PublishMessage", "PublishResult", "Publisher", "SyncPublisher"]

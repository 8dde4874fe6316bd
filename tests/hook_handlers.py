"""A handler module with ``rmqkit_hooks`` for tests/integration/test_hooks.py.

``handle``: body (JSON) ``{"kind": "ok" | "transient" | "permanent", "secret": ...}``; a
transient one fails its first attempt, a permanent one always; both errors quote the body's
``customer.name`` (decrypted for the handler on an encrypting queue: the hooks must not see it).
Each hook appends one JSON line per event to RMQKIT_TEST_HOOKS_OUT, or, under the consumer
harness (which passes only RMQKIT_TEST_LEDGER), to the ledger's path with ``.hooks.jsonl``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import rmqkit
from rmqkit.consumer.hooks import Hooks, OutcomeEvent


def _customer(job: dict[str, Any]) -> str:
    customer = job.get("customer")
    return str(customer.get("name")) if isinstance(customer, dict) else "-"


async def handle(message: rmqkit.Message) -> None:
    job = message.json()
    kind = job.get("kind")
    if kind == "permanent":
        raise rmqkit.Permanent(f"customer {_customer(job)} can never be billed")
    if kind == "transient" and message.attempt == 1:
        raise ConnectionError(f"billing down for customer {_customer(job)}")


def out_path() -> Path:
    explicit = os.environ.get("RMQKIT_TEST_HOOKS_OUT")
    if explicit:
        return Path(explicit)
    return Path(os.environ["RMQKIT_TEST_LEDGER"]).with_suffix(".hooks.jsonl")


def as_line(event: OutcomeEvent) -> str:
    """Every field of the event, its repr and its exception's text, as one JSON line."""
    fields: dict[str, Any] = {
        f.name: getattr(event, f.name) for f in dataclasses.fields(event) if f.name != "exception"
    }
    exception = event.exception
    fields["exception"] = None if exception is None else f"{type(exception).__name__}: {exception}"
    fields["repr"] = repr(event)
    return json.dumps(fields, default=str)


def record(event: OutcomeEvent) -> None:
    with out_path().open("a", encoding="utf-8") as out:
        out.write(as_line(event) + "\n")


def read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


rmqkit_hooks = Hooks(on_success=record, on_retry=record, on_park=record, timeout_s=2.0)

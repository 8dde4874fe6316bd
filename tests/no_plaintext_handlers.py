"""Handlers for tests/integration/test_no_plaintext.py (issue 16's sentinel test).

``handle`` appends the body it received (decrypted by the consumer) to RMQKIT_TEST_OUT — the
handler's own output, the one place besides ``--decrypt`` where the planted value may appear —
then fails as the body's ``kind`` asks: ``permanent`` (parked at once), ``transient`` (retried
through the wait tier until the attempts run out, then parked ``exhausted``), else succeeds.
``quoting`` fails with an error whose text quotes a decrypted field, as careless handlers do.
"""

from __future__ import annotations

import json
import os
from typing import Any

import rmqkit


def _append(row: dict[str, Any]) -> None:
    line = (json.dumps(row, sort_keys=True) + "\n").encode()
    fd = os.open(os.environ["RMQKIT_TEST_OUT"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


async def handle(message: rmqkit.Message) -> None:
    """Record the decrypted body, then fail as its ``kind`` says."""
    body = message.json()
    _append({"id": message.message_id, "attempt": message.attempt, "body": body})
    kind = body.get("kind") if isinstance(body, dict) else None
    if kind == "permanent":
        raise rmqkit.Permanent("order refused by the test")
    if kind == "transient":
        raise rmqkit.Retry(reason="downstream unavailable (test)")


async def quoting(message: rmqkit.Message) -> None:
    """Fail permanently with the customer's (decrypted) name in the error text."""
    body = message.json()
    _append({"id": message.message_id, "attempt": message.attempt, "body": body})
    raise rmqkit.Permanent(f"no such customer: {body['customer']['name']}")

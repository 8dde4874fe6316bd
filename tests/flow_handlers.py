"""Handlers for the lanes, partitions and encrypted-consume tests (and bench/lanes.py).

Each appends one JSON line per call to the file RMQKIT_TEST_OUT (O_APPEND: whole lines from
several processes and threads), so a test reads what the handlers saw and when. Started by
tests.consumer_harness.ConsumerProcess (which passes RMQKIT_TEST_LEDGER only), the file is the
ledger's path plus ``.jsonl``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import rmqkit
from rmqkit.store import dialect_of


def _append(row: dict[str, Any]) -> None:
    line = (json.dumps(row, sort_keys=True) + "\n").encode()
    path = os.environ.get("RMQKIT_TEST_OUT") or os.environ["RMQKIT_TEST_LEDGER"] + ".jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The rows the handlers appended to ``path`` (none yet: [])."""
    try:
        with open(path) as lines:
            return [json.loads(line) for line in lines if line.strip()]
    except FileNotFoundError:
        return []


async def seen(message: rmqkit.Message) -> None:
    """Record the body the handler received (decrypted by the consumer); ``{"permanent":
    true}`` in it: raise rmqkit.Permanent after recording (the message is parked)."""
    body = message.json()
    _append({"id": message.message_id, "body": body, "exchange": message.exchange})
    if isinstance(body, dict) and body.get("permanent"):
        raise rmqkit.Permanent("the test asked for it")


async def timed(message: rmqkit.Message) -> None:
    """Sleep ``{"sleep": seconds}``, then record the message's id, its ``sent`` time (epoch
    seconds in the body) and when the handler started and ended."""
    body = message.json()
    started = time.time()
    await asyncio.sleep(float(body.get("sleep", 0)))
    _append(
        {
            "id": message.message_id,
            "sent": body.get("sent"),
            "start": started,
            "end": time.time(),
            "kind": body.get("kind"),
        }
    )


async def apply_version(message: rmqkit.Message, tx: rmqkit.Transaction) -> None:
    """Partitioned ordering: record (key, version) as applied, in the message's transaction
    (after the consumer's ordering guard let it through). The first attempt of every version
    whose number is 3 mod 7 fails transiently (rmqkit.Retry), so it comes back after newer
    versions of its key and must be skipped as stale."""
    key, version = str(message.headers["key"]), int(message.headers["version"])
    if version % 7 == 3 and message.attempt == 1:
        raise rmqkit.Retry(reason=f"version {version} of {key}: injected failure")
    q = dialect_of(tx).q
    await tx.execute(
        q("INSERT INTO applied (k, version, pid) VALUES (?, ?, ?)"), (key, version, os.getpid())
    )

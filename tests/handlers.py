"""Handlers for consumer tests. Each records what it saw in a SQLite ledger (RMQKIT_TEST_LEDGER).

Body (JSON): {"id": str, "fail": N (fail transiently on attempts 1..N), "permanent": bool,
"crash": bool (os._exit(1) every time), "sleep": seconds}. A body that is not JSON is undecodable.
Rows: (message_id, attempt, kind, t) with kind 'attempt' when handling starts and 'effect' when
the side effect is applied (success only).
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import threading
import time
from typing import Any

import rmqkit
from rmqkit.headers import LAST_FAILED_AT, parse_timestamp

_local = threading.local()  # one connection per thread: sync handlers run in several


def ledger() -> sqlite3.Connection:
    db: sqlite3.Connection | None = getattr(_local, "db", None)
    if db is None:
        db = sqlite3.connect(os.environ["RMQKIT_TEST_LEDGER"], timeout=30, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=OFF")
        db.execute(
            "CREATE TABLE IF NOT EXISTS events (message_id TEXT, attempt INT, kind TEXT, t REAL)"
        )
        _local.db = db
    return db


def record(message_id: str | None, attempt: int, kind: str) -> None:
    ledger().execute(
        "INSERT INTO events VALUES (?, ?, ?, ?)", (message_id, attempt, kind, time.time())
    )


async def handle(message: rmqkit.Message) -> None:
    record(message.message_id, message.attempt, "attempt")
    failed_at = parse_timestamp(message.headers.get(LAST_FAILED_AT))
    if failed_at is not None:  # when the consumer decided on the retry that brought it back
        ledger().execute(
            "INSERT INTO events VALUES (?, ?, ?, ?)",
            (message.message_id, message.attempt, "failed_at", failed_at.timestamp()),
        )
    order: dict[str, Any] = message.json()
    if order.get("crash"):
        os._exit(1)
    if order.get("sleep"):
        await asyncio.sleep(float(order["sleep"]))
    if order.get("raise"):
        raise {"KeyError": KeyError, "LookupError": LookupError, "TypeError": TypeError}[
            order["raise"]
        ](f"job {order['id']} failed")
    if order.get("permanent"):
        raise rmqkit.Permanent(f"job {order['id']} is invalid")
    if int(order.get("fail", 0)) >= message.attempt:
        raise ConnectionError(f"downstream timed out on attempt {message.attempt}")
    record(message.message_id, message.attempt, "effect")


async def noop(message: rmqkit.Message) -> None:
    """For throughput: does nothing."""


def body(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


async def handle_by_body_id(message: rmqkit.Message) -> None:
    """``handle`` for messages whose message_id is missing or shared: rows carry the body's id."""
    order: dict[str, Any] = message.json()
    key = str(order["id"])
    record(key, message.attempt, "attempt")
    if int(order.get("fail", 0)) >= message.attempt:
        raise ConnectionError(f"downstream timed out on attempt {message.attempt}")
    record(key, message.attempt, "effect")


_never = threading.Event()  # never set: a handler that waits on it never returns


def handle_sync(message: rmqkit.Message) -> None:
    """A plain ``def`` handler (runs in the handler threads). Body {"id", "hang": bool,
    "sleep": seconds}: ``hang`` blocks its thread for good (a stuck call that ignores timeouts)."""
    order: dict[str, Any] = message.json()
    record(message.message_id, message.attempt, "attempt")
    if order.get("hang"):
        _never.wait()
    if order.get("sleep"):
        time.sleep(float(order["sleep"]))
    record(message.message_id, message.attempt, "effect")

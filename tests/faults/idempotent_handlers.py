"""An idempotent test handler for the fault suite: the side effect is applied once per message_id.

Body (JSON): {"id": str, "sleep": seconds, "fail": N (fail transiently on attempts 1..N),
"permanent_until_fixed": bool (raise rmqkit.Permanent until the scenario marks the downstream
fixed, then succeed — for parking replays)}. A body that is not JSON is undecodable (parked).
While the scenario sets the ``brake`` switch every handling takes BRAKE_S longer, mostly after
the side effect: consumption is slow until the fault has landed (a `rabbitmqctl` call alone takes
seconds), fast afterwards, and a fault that lands while it is on finds messages applied but not
yet acked (they come back: duplicates for the idempotency to absorb) as well as not yet applied.

SQLite ledger (RMQKIT_TEST_LEDGER), shared by every worker process:

* ``deliveries``  one row per handler call (message_id, attempt, redelivered, pid, t): counts
  deliveries, so a redelivery loop shows;
* ``effects``     UNIQUE message_id: the idempotency key, checked in the same transaction that
  applies the effect (INSERT OR IGNORE: inserted → apply, ignored → a duplicate, skip);
* ``effect_log``  the side effect itself, appended only when the key was new: more than one row
  for an id means an effect applied twice (the suite asserts there is none);
* ``completions`` one row per successful handling (message_id, attempt, applied 0/1): the
  "applies" — more than one for an id is a duplicate delivery the idempotency absorbed;
* ``switches``    scenario switches (``fixed``, ``brake``) the test sets while consumers run.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import rmqkit

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS deliveries"
    " (message_id TEXT, attempt INT, redelivered INT, pid INT, t REAL)",
    "CREATE TABLE IF NOT EXISTS effects (message_id TEXT PRIMARY KEY, pid INT, t REAL)",
    "CREATE TABLE IF NOT EXISTS effect_log (message_id TEXT, pid INT, t REAL)",
    "CREATE TABLE IF NOT EXISTS completions"
    " (message_id TEXT, attempt INT, applied INT, pid INT, t REAL)",
    "CREATE TABLE IF NOT EXISTS switches (name TEXT PRIMARY KEY)",
)

_db: sqlite3.Connection | None = None
BRAKE_S = 0.5
BRAKE_APPLIED_S = 0.4  # of which after the side effect (before the handler returns and the ack)


def connect(path: str | Path) -> sqlite3.Connection:
    db = sqlite3.connect(str(path), timeout=60, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    for statement in SCHEMA:
        db.execute(statement)
    return db


def ledger() -> sqlite3.Connection:
    global _db
    if _db is None:
        _db = connect(os.environ["RMQKIT_TEST_LEDGER"])
    return _db


def set_switch(path: str | Path, name: str) -> None:
    db = connect(path)
    try:
        db.execute("INSERT OR IGNORE INTO switches VALUES (?)", (name,))
    finally:
        db.close()


def clear_switch(path: str | Path, name: str) -> None:
    db = connect(path)
    try:
        db.execute("DELETE FROM switches WHERE name = ?", (name,))
    finally:
        db.close()


def _switch(name: str) -> bool:
    return ledger().execute("SELECT 1 FROM switches WHERE name = ?", (name,)).fetchone() is not None


def apply_once(message_id: str, attempt: int) -> bool:
    """Apply the side effect unless this message_id already had it; True if applied now."""
    db = ledger()
    pid, now = os.getpid(), time.time()
    db.execute("BEGIN IMMEDIATE")
    try:
        inserted = db.execute(
            "INSERT OR IGNORE INTO effects VALUES (?, ?, ?)", (message_id, pid, now)
        ).rowcount
        if inserted == 1:
            db.execute("INSERT INTO effect_log VALUES (?, ?, ?)", (message_id, pid, now))
        db.execute(
            "INSERT INTO completions VALUES (?, ?, ?, ?, ?)",
            (message_id, attempt, inserted, pid, now),
        )
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return inserted == 1


async def handle_idempotent(message: rmqkit.Message) -> None:
    if not message.message_id:
        raise rmqkit.Permanent("no message_id: cannot be idempotent")
    ledger().execute(
        "INSERT INTO deliveries VALUES (?, ?, ?, ?, ?)",
        (message.message_id, message.attempt, int(message.redelivered), os.getpid(), time.time()),
    )
    job: dict[str, Any] = message.json()  # not JSON: DecodeError, parked as undecodable
    if job.get("sleep"):
        await asyncio.sleep(float(job["sleep"]))
    braked = _switch("brake")  # the scenario holds consumption slow until its fault has landed
    if braked:
        await asyncio.sleep(BRAKE_S - BRAKE_APPLIED_S)
    if job.get("permanent_until_fixed") and not _switch("fixed"):
        raise rmqkit.Permanent(f"job {job.get('id')} needs a fix downstream")
    if int(job.get("fail", 0)) >= message.attempt:
        raise ConnectionError(f"downstream timed out on attempt {message.attempt}")
    apply_once(message.message_id, message.attempt)
    if braked:  # the rest after the effect: a fault now finds it applied, not yet acked
        await asyncio.sleep(BRAKE_APPLIED_S)

"""Handlers for the `consume --dedupe` tests: each writes business rows in the transaction
rmqkit gives it (tables made by tests.dedupe_harness.business_tables), so the database shows
how many times each message took effect.

Body (JSON): {"fail_once": bool} — raise a transient error on the first attempt, after the
write (which must then be rolled back); {"crash_after_write": bool} is not used: kill -9 comes
from the tests. The ordering handlers read the key and version from the headers.
"""

from __future__ import annotations

import contextlib
import json

import rmqkit
from rmqkit.store import dialect_of


def _fail_once(message: rmqkit.Message) -> bool:
    return bool(message.body and json.loads(message.body).get("fail_once"))


async def apply(message: rmqkit.Message, tx: rmqkit.Transaction) -> None:
    """One business row per message, in the message's transaction."""
    q = dialect_of(tx).q
    await tx.execute(
        q("INSERT INTO business (message_id, attempt) VALUES (?, ?)"),
        (message.message_id, message.attempt),
    )
    if _fail_once(message) and message.attempt == 1:
        raise ConnectionError("downstream timed out (first attempt)")


def apply_sync(message: rmqkit.Message, tx: rmqkit.Transaction) -> None:
    """``apply`` as a plain def (runs in a thread, on a sync connection)."""
    q = dialect_of(tx).q
    tx.execute(
        q("INSERT INTO business (message_id, attempt) VALUES (?, ?)"),
        (message.message_id, message.attempt),
    )
    if _fail_once(message) and message.attempt == 1:
        raise ConnectionError("downstream timed out (first attempt)")


async def set_state(message: rmqkit.Message, tx: rmqkit.Transaction) -> None:
    """The latest state per key (the consumer's ordering guard skips stale versions)."""
    q = dialect_of(tx).q
    key, version = str(message.headers["k"]), int(message.headers["v"])
    await tx.execute(
        q(
            "INSERT INTO state (k, version) VALUES (?, ?) "
            "ON CONFLICT (k) DO UPDATE SET version = excluded.version"
        ),
        (key, version),
    )
    await tx.execute(q("INSERT INTO applied (k, version) VALUES (?, ?)"), (key, version))


async def noop(message: rmqkit.Message) -> None:
    """No writes of its own: only the id is recorded."""


async def effect_outside(message: rmqkit.Message) -> None:
    """No transaction: the effect is a ledger row outside the store (tests.handlers' ledger)."""
    from tests.handlers import record

    record(message.message_id, message.attempt, "effect")


def _flag(message: rmqkit.Message, name: str) -> bool:
    return bool(message.body and json.loads(message.body).get(name))


async def apply_may_end_tx(message: rmqkit.Message, tx: rmqkit.Transaction) -> None:
    """``apply``, but a message with {"commit": true} / {"rollback": true} ends the given
    transaction itself (what the docs forbid, as a careless handler would)."""
    q = dialect_of(tx).q
    await tx.execute(
        q("INSERT INTO business (message_id, attempt) VALUES (?, ?)"),
        (message.message_id, message.attempt),
    )
    if _flag(message, "commit"):
        await tx.execute("COMMIT")
    if _flag(message, "rollback"):
        await tx.execute("ROLLBACK")
    if _flag(message, "swallow"):  # an SQL error caught: PostgreSQL's transaction is aborted
        with contextlib.suppress(Exception):
            await tx.execute("SELECT * FROM no_such_table_xatk")


async def apply_slow(message: rmqkit.Message, tx: rmqkit.Transaction) -> None:
    """``apply`` taking a few milliseconds (a run long enough to be interrupted)."""
    import asyncio

    await apply(message, tx)
    await asyncio.sleep(0.004)


def hang_once_sync(message: rmqkit.Message, tx: rmqkit.Transaction) -> None:
    """``apply_sync``; a message with {"hang": true} then sleeps 2 s on its first attempt
    (past --handler-timeout) holding its write, and tries one more write after waking."""
    import time

    apply_sync(message, tx)
    if _flag(message, "hang") and message.attempt == 1:
        time.sleep(2)
        tx.execute(
            dialect_of(tx).q("INSERT INTO business (message_id, attempt) VALUES (?, ?)"),
            (message.message_id, -1),
        )


async def apply_unless_switched_off(message: rmqkit.Message, tx: rmqkit.Transaction) -> None:
    """``apply``, but fails (after writing) while the state table holds k='broken'."""
    await apply(message, tx)
    cursor = await tx.execute(
        dialect_of(tx).q("SELECT count(*) FROM state WHERE k = ?"), ("broken",)
    )
    if (await cursor.fetchall())[0][0]:
        raise ConnectionError("downstream is broken")


def apply_sync_may_commit(message: rmqkit.Message, tx: rmqkit.Transaction) -> None:
    """``apply_sync``; a message with {"sync-commit": true} calls the driver's commit()."""
    apply_sync(message, tx)
    if _flag(message, "sync-commit"):
        tx.commit()  # type: ignore[attr-defined]

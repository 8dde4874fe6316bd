"""The idempotency store on a real SQLite file and the real PostgreSQL: init, record, status,
prune, the ordering guard, and the `rmqkit dedupe` commands."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from rmqkit.errors import ConfigError, DatabaseUnavailable
from rmqkit.guard import apply_if_newer, apply_if_newer_async
from rmqkit.idempotency import (
    dedupe_status,
    init_store,
    parse_window,
    prune,
    record,
    record_async,
)
from rmqkit.store import connect, connect_async, transaction, transaction_async
from tests.dedupe_harness import BACKENDS, pg_schema_dsn, query, store_dsn

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=BACKENDS)
def dsn(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with store_dsn(request.param, tmp_path) as made:
        init_store(made)
        yield made


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rmqkit", "dedupe", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def test_parse_window() -> None:
    assert parse_window("7d") == 7 * 86400
    assert parse_window("36h") == 36 * 3600
    assert parse_window("1.5d") == 1.5 * 86400
    with pytest.raises(ValueError, match="7d"):
        parse_window("7 days")


def test_record_is_true_once_and_rolls_back_with_the_transaction(dsn: str) -> None:
    with connect(dsn) as conn:
        with transaction(conn):
            assert record(conn, "m-1", queue="q") is True
            assert record(conn, "m-1") is False  # same transaction: already there
        with pytest.raises(RuntimeError), transaction(conn):
            assert record(conn, "m-2") is True
            raise RuntimeError("handler failed")
        with transaction(conn):
            assert record(conn, "m-1") is False
            assert record(conn, "m-2") is True  # the rollback took the id with it
    assert sorted(r[0] for r in query(dsn, "SELECT message_id FROM rmqkit_processed")) == [
        "m-1",
        "m-2",
    ]
    status = dedupe_status(dsn)
    assert status.rows == 2 and status.window_s == 7 * 86400
    assert status.oldest_age_s is not None and status.oldest_age_s < 60


def test_record_async(dsn: str) -> None:
    async def main() -> tuple[bool, bool]:
        async with connect_async(dsn) as conn:
            async with transaction_async(conn):
                first = await record_async(conn, "a-1")
            async with transaction_async(conn):
                second = await record_async(conn, "a-1")
        return first, second

    assert asyncio.run(main()) == (True, False)


def test_empty_message_id_is_refused(dsn: str) -> None:
    with connect(dsn) as conn, transaction(conn), pytest.raises(ValueError):
        record(conn, "")


def test_concurrent_same_id_on_postgresql_waits_for_the_winner() -> None:
    """Two transactions insert the same id: the second blocks until the first commits and then
    sees a duplicate (False), not an error; if the first rolls back, the second applies."""
    with pg_schema_dsn() as dsn:
        init_store(dsn)
        for winner_commits, expected in ((True, False), (False, True)):
            message_id = f"race-{winner_commits}"
            results: list[bool] = []
            with psycopg.connect(dsn) as first:
                assert record(first, message_id) is True  # psycopg opened a transaction
                second_done = threading.Event()

                thread = threading.Thread(
                    target=_second_inserter, args=(dsn, message_id, results, second_done)
                )
                thread.start()
                assert not second_done.wait(0.5), "the second insert did not wait"
                if winner_commits:
                    first.commit()
                else:
                    first.rollback()
                thread.join(10)
            assert results == [expected]
            rows = query(
                dsn, "SELECT count(*) FROM rmqkit_processed WHERE message_id = %s", (message_id,)
            )
            assert rows == [(1,)]


def _second_inserter(dsn: str, message_id: str, results: list[bool], done: threading.Event) -> None:
    with psycopg.connect(dsn) as conn:
        results.append(record(conn, message_id))
        conn.commit()
    done.set()


def test_init_is_idempotent_and_keeps_or_changes_the_window(dsn: str) -> None:
    assert init_store(dsn).window_s == 7 * 86400
    changed = init_store(dsn, window_s=3 * 86400)
    assert changed.window_changed and changed.window_s == 3 * 86400
    again = init_store(dsn)
    assert again.window_s == 3 * 86400 and not again.window_changed


def test_prune_deletes_old_ids_in_batches_and_keeps_young_ones(dsn: str) -> None:
    now = time.time()
    rows = [(f"old-{i}", now - 10 * 86400 - i) for i in range(250)]
    rows += [(f"new-{i}", now - 3600) for i in range(20)]
    with connect(dsn) as conn, transaction(conn):
        sql = "INSERT INTO rmqkit_processed (message_id, queue, processed_at) VALUES (?, '', ?)"
        for message_id, at in rows:
            conn.execute(
                sql if dsn.startswith("sqlite") else sql.replace("?", "%s"), (message_id, at)
            )
    assert dedupe_status(dsn).older_than_window == 250
    result = prune(dsn, batch=100, pause_s=0)
    assert result.deleted == 250 and result.batches == 3 and not result.below_window
    left = query(dsn, "SELECT message_id FROM rmqkit_processed")
    assert sorted(r[0] for r in left) == sorted(f"new-{i}" for i in range(20))
    short = prune(dsn, older_than_s=60, batch=100)
    assert short.deleted == 20 and short.below_window


def test_guard_applies_only_newer_versions(dsn: str) -> None:
    with connect(dsn) as conn:
        with transaction(conn):
            assert apply_if_newer(conn, "order-1", 3) is True
            assert apply_if_newer(conn, "order-1", 2) is False
            assert apply_if_newer(conn, "order-1", 3) is False  # equal: not newer
        with pytest.raises(RuntimeError), transaction(conn):
            assert apply_if_newer(conn, "order-1", 9) is True
            raise RuntimeError("rolled back")
        with transaction(conn):
            assert apply_if_newer(conn, "order-1", 4) is True
    # the key's exact bytes, in the library's default (empty) scope
    assert query(dsn, "SELECT scope, key, version FROM rmqkit_versions") == [("", b"order-1", 4)]
    with connect(dsn) as conn, transaction(conn), pytest.raises(ValueError):
        apply_if_newer(conn, "order-1", "5")  # type: ignore[arg-type]

    async def main() -> list[bool]:
        async with connect_async(dsn) as conn, transaction_async(conn):
            return [
                await apply_if_newer_async(conn, "order-2", 1),
                await apply_if_newer_async(conn, "order-2", 1),
            ]

    assert asyncio.run(main()) == [True, False]


def test_status_and_prune_on_a_store_never_initialised(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'empty.db'}"
    with pytest.raises(ConfigError, match="dedupe init"):
        dedupe_status(dsn)
    with pytest.raises(ConfigError, match="dedupe init"):
        prune(dsn)


def test_cli_init_status_prune(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'cli.db'}"
    made = cli("init", "--dsn", dsn, "--window", "2d")
    assert made.returncode == 0, made.stderr
    assert "window 2d" in made.stdout
    shown = cli("status", "--dsn", dsn, "--json")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["rows"] == 0 and data["window"] == "2d"
    pruned = cli("prune", "--dsn", dsn, "--older-than", "1h", "--batch", "5")
    assert pruned.returncode == 0, pruned.stderr
    assert "deleted 0 id(s)" in pruned.stdout and "younger than the window" in pruned.stderr
    bad = cli("prune", "--dsn", dsn, "--older-than", "7 days")
    assert bad.returncode == 64 and "--older-than" in bad.stderr


def test_cli_errors_are_one_line_with_their_exit_code(tmp_path: Path) -> None:
    malformed = cli("status", "--dsn", "mysql://x@y/z")
    assert malformed.returncode == 78 and malformed.stderr.count("\n") == 1
    missing = cli("status", "--dsn", f"sqlite:///{tmp_path / 'none.db'}")
    assert missing.returncode == 78 and "dedupe init" in missing.stderr
    down = cli("status", "--dsn", "postgresql://u:secret@127.0.0.1:1/db")
    assert down.returncode == 69 and "secret" not in down.stderr
    assert isinstance(DatabaseUnavailable("x"), Exception)

"""`rmqkit dedupe init` upgrading a store an older rmqkit made (ids and text keys without a
scope), on a real SQLite file and a PostgreSQL schema of its own: the rows are kept, in the
scope of the queue that recorded them, and keep deduplicating; the new key columns are there.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmqkit.errors import ConfigError
from rmqkit.guard import apply_if_newer
from rmqkit.idempotency import dedupe_status, init_store, prune, record
from rmqkit.store import connect, transaction
from tests.dedupe_harness import BACKENDS, columns, old_store, query, store_dsn

ROOT = Path(__file__).resolve().parents[2]
SHIPPING = "%2F/shipping.work"  # the default vhost's scope of queue shipping.work


@pytest.fixture(params=BACKENDS)
def dsn(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with store_dsn(request.param, tmp_path) as made:
        yield made


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(ROOT)}  # no RMQKIT_*: the URL's vhost is /
    return subprocess.run(
        [sys.executable, "-m", "rmqkit", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
        check=False,
    )


def _index_exists(dsn: str) -> bool:
    if dsn.startswith("sqlite:"):
        sql = "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = %s"
        return bool(query(dsn, sql, ("rmqkit_processed_at",))[0][0])
    return query(dsn, "SELECT to_regclass(%s)", ("rmqkit_processed_at",))[0][0] is not None


def test_init_upgrades_an_old_store_and_keeps_its_rows(dsn: str) -> None:
    old_store(dsn, [("m-1", "shipping.work"), ("m-2", "shipping.work")], [("order-1", 5)])
    query(dsn, "INSERT INTO rmqkit_versions VALUES (%s, 3, 0)", ("ключ-7",))  # non-ASCII text
    before = dict(query(dsn, "SELECT message_id, processed_at FROM rmqkit_processed"))
    status = dedupe_status(dsn)
    assert status.outdated == ("rmqkit_processed", "rmqkit_versions") and status.rows == 2
    with pytest.raises(ConfigError, match="dedupe init"):
        prune(dsn)  # its statements need the scoped schema

    done = cli("dedupe", "init", "--dsn", dsn)
    assert done.returncode == 0, done.stderr
    assert "upgraded from an older schema: 2 processed id(s) kept" in done.stdout
    assert f"scope {SHIPPING}: 2 id(s)" in done.stdout
    assert f"ordering versions: 2 key(s), scope {SHIPPING}" in done.stdout

    assert {"scope", "message_id", "queue", "processed_at"} <= columns(dsn, "rmqkit_processed")
    assert {"scope", "key", "version"} <= columns(dsn, "rmqkit_versions")
    assert _index_exists(dsn)
    rows = query(dsn, "SELECT scope, message_id, queue, processed_at FROM rmqkit_processed")
    assert sorted(rows) == sorted(
        (SHIPPING, m, "shipping.work", at) for m, at in before.items()
    )  # data kept, time included (prune still sees its age)
    versions = query(dsn, "SELECT scope, key, version FROM rmqkit_versions")
    assert sorted((s, bytes(k), v) for s, k, v in versions) == sorted(
        [(SHIPPING, b"order-1", 5), (SHIPPING, "ключ-7".encode(), 3)]
    )
    assert dedupe_status(dsn).window_s == 7 * 86400  # the recorded window kept

    with connect(dsn) as conn, transaction(conn):
        assert record(conn, "m-1", scope=SHIPPING) is False  # still a duplicate after it
        assert record(conn, "m-1", scope="%2F/billing.work") is True  # another consumer's
        assert apply_if_newer(conn, "order-1", 5, scope=SHIPPING) is False
        assert apply_if_newer(conn, "ключ-7", 4, scope=SHIPPING) is True  # text = its bytes
        assert apply_if_newer(conn, b"order-1", 6, scope=SHIPPING) is True

    again = cli("dedupe", "init", "--dsn", dsn)
    assert again.returncode == 0 and "upgraded" not in again.stdout, again.stdout
    shown = cli("dedupe", "status", "--dsn", dsn, "--json")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["outdated"] == []
    assert data["scopes"] == [
        {"scope": "%2F/billing.work", "ids": 1, "keys": 0},
        {"scope": SHIPPING, "ids": 2, "keys": 2},
    ]
    text = cli("dedupe", "status", "--dsn", dsn).stdout
    assert f"  {SHIPPING}: 2 id(s), 2 ordering key(s)" in text


def test_upgrade_of_several_queues_ids_and_a_legacy_scope(dsn: str, tmp_path: Path) -> None:
    old_store(dsn, [("a", "q1"), ("b", "q2"), ("c", "")], [("k", 1)])
    result = init_store(dsn, vhost="prod")
    assert result.upgraded is not None
    assert result.upgraded.id_scopes == {"prod/q1": 1, "prod/q2": 1, "": 1}
    # Versions did not say whose they were, and two queues used the store: the empty scope.
    assert (result.upgraded.versions, result.upgraded.versions_scope) == (1, "")
    assert sorted(query(dsn, "SELECT scope, message_id FROM rmqkit_processed")) == [
        ("", "c"),
        ("prod/q1", "a"),
        ("prod/q2", "b"),
    ]
    assert init_store(dsn).upgraded is None

    (tmp_path / "legacy").mkdir()
    with store_dsn("sqlite", tmp_path / "legacy") as other:
        old_store(other, [("a", "q1"), ("b", "q2")], [("k", 1)])
        given = init_store(other, legacy_scope="orders")
        assert given.upgraded is not None and given.upgraded.versions_scope == "orders"
        assert query(other, "SELECT DISTINCT scope FROM rmqkit_processed") == [("orders",)]
        assert query(other, "SELECT scope, key FROM rmqkit_versions") == [("orders", b"k")]


def test_an_upgrade_that_fails_half_way_leaves_the_old_store_as_it_was(tmp_path: Path) -> None:
    """The upgrade is one transaction: the ids' table is rebuilt first, then the versions'
    fails (a table in the way of its rebuild): nothing of it stays."""
    with store_dsn("sqlite", tmp_path) as dsn:
        old_store(dsn, [("m-1", "q")], [("k", 1)])
        query(dsn, "CREATE TABLE rmqkit_versions_v1 (x INTEGER)")
        with pytest.raises(ConfigError, match="rmqkit_versions_v1"):
            init_store(dsn)
        assert dedupe_status(dsn).outdated == ("rmqkit_processed", "rmqkit_versions")
        assert "scope" not in columns(dsn, "rmqkit_processed")
        assert query(dsn, "SELECT message_id, queue FROM rmqkit_processed") == [("m-1", "q")]
        assert query(dsn, "SELECT key, version FROM rmqkit_versions") == [("k", 1)]

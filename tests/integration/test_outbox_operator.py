"""``rmqkit outbox list|retry|discard|retarget`` and what a running relay logs about failing rows:
real SQLite file, real PostgreSQL, real broker, counted on the broker by message_id.

The relay is a real ``rmqkit outbox relay`` process; its stderr is read after it stopped, and
each failing row must appear there exactly once. The mid-publish tests widen the window between
a batch's confirms and its marks with the relay's test-only pause (rmqkit/outbox/batch.py).
"""

from __future__ import annotations

import collections
import contextlib
import random
import signal
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import rmqkit.outbox
from rmqkit.errors import DataError
from rmqkit.outbox import operator as ops
from rmqkit.store import as_dsn
from tests.integration.test_outbox import (
    collect,
    declare,
    drop_schema,
    outbox,
    pg_schema_dsn,
    relay_process,
)

pytestmark = pytest.mark.broker

PAUSE = "RMQKIT_OUTBOX_TEST_PAUSE_BEFORE_MARK"
MARKER = "RMQKIT_OUTBOX_TEST_PAUSE_FILE"


@pytest.fixture(params=["sqlite", "postgresql"])
def dsn(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        path = f"sqlite:///{tmp_path}/app.db"
        rmqkit.outbox.init(path)
        yield path
        return
    schema, pg = pg_schema_dsn("rmqkit_obo")
    rmqkit.outbox.init(pg)
    yield pg
    drop_schema(schema)


def _connect(dsn: str) -> Any:
    if dsn.startswith("sqlite"):
        return sqlite3.connect(dsn.removeprefix("sqlite:///"))
    return psycopg.connect(dsn)


def _query(dsn: str, sql: str) -> list[Any]:
    conn = _connect(dsn)
    try:
        return list(conn.execute(sql).fetchall())
    finally:
        conn.close()


def _fill(dsn: str, exchange: str, count: int, *, aggregates: int | None = None) -> list[str]:
    conn = _connect(dsn)
    ids = []
    for n in range(count):
        aggregate = None if aggregates is None else f"agg-{n % aggregates}"
        ids.append(
            rmqkit.outbox.add(
                conn, exchange=exchange, routing_key="ev", body={"n": n}, aggregate=aggregate
            )
        )
    conn.commit()
    conn.close()
    return ids


def _row_ids(dsn: str, message_ids: list[str]) -> list[int]:
    by_mid = dict(_query(dsn, "SELECT message_id, id FROM rmqkit_outbox"))
    return [int(by_mid[m]) for m in message_ids]


def _pending(dsn: str) -> int:
    return int(_query(dsn, "SELECT count(*) FROM rmqkit_outbox WHERE published_at IS NULL")[0][0])


def _until(check: Callable[[], bool], what: str, relays: list[Any], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        for relay in relays:
            assert relay.poll() is None, relay.communicate()
        time.sleep(0.1)


def _stop(*relays: subprocess.Popen[str]) -> list[tuple[str, str]]:
    for relay in relays:
        relay.send_signal(signal.SIGTERM)
    outputs = [relay.communicate(timeout=60) for relay in relays]
    assert [r.returncode for r in relays] == [0] * len(relays), outputs
    return outputs


def _names() -> tuple[str, str]:
    return f"ev-{uuid.uuid4().hex[:6]}", f"q-{uuid.uuid4().hex[:6]}"


# --- logging, and retarget under a running relay ------------------------------------------------
def test_running_relay_logs_each_failing_row_once_and_delivers_them_once_retargeted(
    vhost: str, dsn: str
) -> None:
    exchange, queue = _names()
    typo = exchange + "-typo"
    declare(vhost, exchange, queue)
    mids = _fill(dsn, typo, 5)
    ids = _row_ids(dsn, mids)
    relay = relay_process(dsn, vhost, "--poll", "100ms", "--failing-summary", "1s")
    try:
        # Three attempts each (back-off 0.5-1 s, then 1-2 s): the same error every time.
        _until(
            lambda: min(a for (a,) in _query(dsn, "SELECT attempts FROM rmqkit_outbox")) >= 3,
            "rows not retried three times",
            [relay],
        )
        listed = outbox("list", "--dsn", dsn, "--failing", vhost=None)
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.splitlines()[0] == "5 failing row(s)"
        moved = outbox("retarget", *map(str, ids), "--dsn", dsn, "--exchange", exchange, vhost=None)
        assert moved.returncode == 0, moved.stderr
        assert moved.stdout.count(f"to exchange {exchange!r}") == 5
        _until(lambda: _pending(dsn) == 0, "retargeted rows not published", [relay])
    finally:
        ((_, err),) = _stop(relay)
    got = collect(vhost, queue)
    assert sorted(m["message_id"] for m in got) == sorted(mids)  # exactly those, once each
    error = f"exchange {typo!r} does not exist"
    for row_id, mid in zip(ids, mids, strict=True):
        lines = [line for line in err.splitlines() if f"row {row_id} (message_id {mid})" in line]
        assert len(lines) == 1, err  # once, not once per retry
        assert f"to exchange {typo!r}, routing key 'ev' failed: {error}; retrying in" in lines[0]
    summaries = [line for line in err.splitlines() if "outbox relay: 5 rows failing" in line]
    assert summaries, err
    assert summaries[0].endswith(f"5 {error}"), summaries[0]
    assert "(oldest written " in summaries[0]


def test_a_changed_error_is_logged_again(vhost: str, dsn: str) -> None:
    exchange, queue = _names()
    declare(vhost, exchange, queue, binding="ev")
    (mid,) = _fill(dsn, exchange + "-typo", 1)
    (row_id,) = _row_ids(dsn, [mid])
    first = outbox("relay", "--dsn", dsn, "--once", vhost=vhost)
    assert first.returncode == 3 and first.stderr.count(f"row {row_id} ") == 1, first.stderr
    again = outbox("relay", "--dsn", dsn, "--once", vhost=vhost)  # the same error: not logged
    assert again.returncode == 3 and f"row {row_id} " not in again.stderr, again.stderr
    moved = outbox("retarget", str(row_id), "--dsn", dsn, "--exchange", exchange,
                   "--routing-key", "nobody", vhost=None)  # fmt: skip
    assert moved.returncode == 0, moved.stderr
    third = outbox("relay", "--dsn", dsn, "--once", vhost=vhost)  # now unroutable: a new error
    lines = [line for line in third.stderr.splitlines() if f"row {row_id} " in line]
    assert len(lines) == 1, third.stderr
    assert "failed: returned: no queue is bound" in lines[0]
    assert f"(before: exchange '{exchange}-typo' does not exist)" in lines[0]
    assert collect(vhost, queue) == []


# --- retry -------------------------------------------------------------------------------------
def test_retry_makes_a_backed_off_row_publish_now(vhost: str, dsn: str) -> None:
    exchange, queue = _names()
    declare(vhost, exchange, None)
    (mid,) = _fill(dsn, exchange, 1)
    (row_id,) = _row_ids(dsn, [mid])
    conn = _connect(dsn)  # a row that has failed for a while: its next back-off is 150-300 s
    conn.execute("UPDATE rmqkit_outbox SET attempts = 10")
    conn.commit()
    conn.close()
    relay = relay_process(dsn, vhost, "--poll", "100ms")
    try:
        _until(lambda: ops.list_rows(dsn, failing=True).total == 1, "row never failed", [relay])
        (row,) = ops.list_rows(dsn).rows
        assert row.due_in_s > 100 and row.attempts == 11, row
        declare(vhost, exchange, queue)  # fixed, but the row is backing off
        time.sleep(1.5)
        assert collect(vhost, queue, idle_s=0.3) == []
        retried = outbox("retry", str(row_id), "--dsn", dsn, vhost=None)
        assert retried.returncode == 0, retried.stderr
        assert retried.stdout == f"retrying row {row_id} ({mid}, {exchange!r}/'ev')\n"
        _until(lambda: _pending(dsn) == 0, "retried row not published", [relay], timeout_s=20)
    finally:
        _stop(relay)
    assert [m["message_id"] for m in collect(vhost, queue)] == [mid]


# --- errors ------------------------------------------------------------------------------------
def test_unknown_or_published_row_ids_are_one_line_and_change_nothing(vhost: str, dsn: str) -> None:
    exchange, _ = _names()
    mids = _fill(dsn, exchange, 2)
    ids = _row_ids(dsn, mids)
    masked = as_dsn(dsn).masked
    for command in (["retry"], ["discard"], ["retarget", "--exchange", "x"]):
        result = outbox(*command, str(ids[0]), "999999", "--dsn", dsn, vhost=None)
        assert result.returncode == 65, result
        assert result.stderr == (
            f"rmqkit: error: no outbox row with id 999999 in {masked} — nothing changed "
            "(`rmqkit outbox list` shows the pending rows)\n"
        )
    rows = _query(dsn, "SELECT exchange, attempts FROM rmqkit_outbox ORDER BY id")
    assert rows == [(exchange, 0), (exchange, 0)]  # the existing row untouched too
    conn = _connect(dsn)
    conn.execute(f"UPDATE rmqkit_outbox SET published_at = 1 WHERE id = {ids[1]}")
    conn.commit()
    conn.close()
    result = outbox("discard", str(ids[1]), "--dsn", dsn, vhost=None)
    assert (result.returncode, result.stderr) == (
        65,
        f"rmqkit: error: outbox row {ids[1]} was already published — nothing changed\n",
    )
    result = outbox("retarget", str(ids[0]), "--dsn", dsn, vhost=None)
    assert (result.returncode, result.stderr) == (
        64,
        "rmqkit: error: retarget: give --exchange, --routing-key or both\n",
    )
    assert _query(dsn, "SELECT count(*) FROM rmqkit_outbox")[0][0] == 2


# --- discard under a running relay -------------------------------------------------------------
def test_discard_waits_for_the_batch_in_flight_and_never_half_publishes(
    vhost: str, dsn: str, tmp_path: Path
) -> None:
    """A row confirmed by the broker but not yet marked is mid-publish: discard must not take it
    (it would be in the queue and in the audit table). It waits for the marks, then refuses."""
    exchange, queue = _names()
    declare(vhost, exchange, queue)
    mids = _fill(dsn, exchange, 10)
    ids = _row_ids(dsn, mids)
    marker = tmp_path / "paused"
    relay = relay_process(dsn, vhost, "--poll", "100ms", env={PAUSE: "10", MARKER: str(marker)})
    try:
        _until(marker.exists, "the relay never paused", [relay])
        busy = outbox("discard", str(ids[3]), "--dsn", dsn, "--wait", "1s", vhost=None)
        assert busy.returncode == 69, busy
        assert busy.stderr == (
            f"rmqkit: error: a relay (or another operator command) kept outbox row {ids[3]} "
            "busy for 1s — nothing changed; try again, or with a longer --wait\n"
        )
        late = outbox("discard", str(ids[4]), "--dsn", dsn, "--wait", "30s", vhost=None)
        assert (late.returncode, late.stderr) == (
            65,
            f"rmqkit: error: outbox row {ids[4]} was already published — nothing changed\n",
        )
    finally:
        _stop(relay)
    got = collect(vhost, queue)
    assert sorted(m["message_id"] for m in got) == sorted(mids)
    assert _query(dsn, "SELECT count(*) FROM rmqkit_outbox WHERE published_at IS NULL") == [(0,)]
    assert _discarded(dsn) == []


def _discarded(dsn: str) -> list[Any]:
    try:
        return _query(dsn, "SELECT message_id, reason, discarded_by FROM rmqkit_outbox_discarded")
    except (sqlite3.OperationalError, psycopg.errors.UndefinedTable):
        return []  # created by the first discard


def test_discarded_failing_rows_are_never_published_and_kept_for_audit(
    vhost: str, dsn: str
) -> None:
    exchange, queue = _names()
    declare(vhost, exchange, queue, binding="ev")
    good = _fill(dsn, exchange, 3)
    bad = _fill(dsn, exchange + "-typo", 3)
    bad_ids = _row_ids(dsn, bad)
    relay = relay_process(dsn, vhost, "--poll", "100ms")
    try:
        _until(lambda: ops.list_rows(dsn, failing=True).total == 3, "rows not failing", [relay])
        gone = outbox("discard", *map(str, bad_ids), "--dsn", dsn, "--reason", "typo", vhost=None)
        assert gone.returncode == 0, gone.stderr
        assert gone.stdout.count("(kept in rmqkit_outbox_discarded)") == 3
        declare(vhost, exchange + "-typo", queue, binding="ev")  # too late: they are gone
        time.sleep(2.5)  # their back-off is over: a relay that still had them would send them
    finally:
        _stop(relay)
    assert sorted(m["message_id"] for m in collect(vhost, queue)) == sorted(good)
    assert sorted(m for m, _, _ in _discarded(dsn)) == sorted(bad)
    assert {(r, "@" in by) for _, r, by in _discarded(dsn)} == {("typo", True)}
    assert _query(dsn, "SELECT count(*) FROM rmqkit_outbox WHERE published_at IS NULL") == [(0,)]


# --- adversarial: two relays, operator commands racing them ---------------------------------
def test_two_relays_while_retarget_and_discard_run_lose_and_duplicate_nothing(
    vhost: str, dsn: str
) -> None:
    """1,500 rows on 20 aggregates and 100 to a mistyped exchange; two relays run while the test
    retargets and discards pending rows at random, most of them being published at that moment.
    Every row ends delivered exactly once or discarded (never both, never neither)."""
    exchange, queue = _names()
    declare(vhost, exchange, queue)
    mids = _fill(dsn, exchange, 1500, aggregates=20) + _fill(dsn, exchange + "-typo", 100)
    # Each batch pauses 0.5 s between its confirms and its marks: the window a change must not
    # fall into (a row in it is in the queue already).
    slow = {PAUSE: "0.5"}
    relays = [relay_process(dsn, vhost, "--poll", "50ms", "--batch", "20", env=slow)] * 1
    relays.append(relay_process(dsn, vhost, "--poll", "50ms", "--batch", "20", env=slow))
    typo = (
        f"SELECT id FROM rmqkit_outbox WHERE published_at IS NULL AND exchange = '{exchange}-typo'"
    )
    rng = random.Random(7)
    changed = refused = 0
    try:
        _until(lambda: _pending(dsn) < 1500, "the relays never started", relays)
        while _pending(dsn) > 150 and changed + refused < 200:
            pending = [int(i) for (i,) in _query(
                dsn, "SELECT id FROM rmqkit_outbox WHERE published_at IS NULL ORDER BY id LIMIT 200"
            )]  # fmt: skip
            # Odd turns: rows at the head, being published now; even ones: rows behind them.
            turn = changed + refused
            window = pending[:40] if turn % 2 else pending[40:] or pending
            picked = rng.sample(window, min(2, len(window)))
            try:
                if turn % 3 == 0:
                    ops.discard(dsn, picked, reason="race")
                else:
                    ops.retarget(dsn, picked, exchange=exchange, routing_key="moved")
                changed += 1
            except DataError:
                refused += 1  # one of them was published first: nothing changed
        while left := [int(i) for (i,) in _query(dsn, typo)]:
            with contextlib.suppress(DataError):  # one was discarded meanwhile: none can be
                ops.retarget(dsn, left, exchange=exchange)
        _until(lambda: _pending(dsn) == 0, "rows left pending", relays, 120)
    finally:
        _stop(*relays)
    delivered = collections.Counter(m["message_id"] for m in collect(vhost, queue))
    discarded = collections.Counter(m for m, _, _ in _discarded(dsn))
    assert max(delivered.values()) == 1 and max(discarded.values(), default=1) == 1
    assert not set(delivered) & set(discarded)
    assert set(delivered) | set(discarded) == set(mids)
    assert changed >= 5 and refused and discarded, (changed, refused)  # the race was run
    print(f"delivered {len(delivered)}, discarded {len(discarded)}, changes {changed}, "
          f"refused {refused}")  # fmt: skip

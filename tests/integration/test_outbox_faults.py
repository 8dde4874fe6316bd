"""The outbox under connection faults and kill -9, as an on-call engineer would cause them.

A daemon relay (not ``--once``) whose broker connections the management API closes, whose
PostgreSQL backend is terminated between confirm and mark, or which is ``kill -9``-ed on SQLite
(the next relay takes over when the lease expires). Counted on the broker by message_id and in
the table: nothing lost, nothing marked without its confirm, duplicates only from the batch in
flight, each aggregate in order once duplicates are dropped.
"""

from __future__ import annotations

import collections
import json
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

import rmqkit.outbox
from tests import broker
from tests.integration.test_outbox import collect, declare, relay_process, status_json
from tests.integration.test_outbox_adversarial import (
    MARKER,
    PAUSE,
    _names,
    _rows,
    _stop,
    _wait,
    pg,
)

pytestmark = pytest.mark.broker
__all__ = ["pg"]  # the fixture, shared


def _fill(
    dsn: str, exchange: str, count: int, aggregates: int = 20, start: int = 0, pad: int = 0
) -> list[str]:
    with psycopg.connect(dsn) as conn, conn.pipeline(), conn.transaction():
        return [
            rmqkit.outbox.add(
                conn,
                exchange=exchange,
                routing_key="ev",
                body={"agg": n % aggregates, "seq": n // aggregates, "pad": "x" * pad},
                aggregate=f"agg-{n % aggregates}",
            )
            for n in range(start, start + count)
        ]


def _in_order(got: list[dict[str, Any]]) -> None:
    """Per aggregate, each first copy after the previous one (what an idempotent consumer
    applies: a re-published duplicate of an earlier row is skipped there)."""
    last: dict[int, int] = {}
    seen: set[str] = set()
    for message in got:
        if message["message_id"] in seen:
            continue
        seen.add(message["message_id"])
        body = json.loads(message["body"])
        assert body["seq"] >= last.get(body["agg"], -1), body
        last[body["agg"]] = body["seq"]


def test_broker_connections_closed_while_a_daemon_relay_publishes(vhost: str, pg: str) -> None:
    """A daemon relay's broker connections closed again and again while it publishes (rabbitmqctl
    close_all_connections on this vhost, then the management API while it is idle): it
    reconnects by itself each time; every event is on the broker; only unconfirmed rows again."""
    exchange, queue = _names()
    declare(vhost, exchange, queue)
    ids = _fill(pg, exchange, 2000, pad=8192)  # 16 MB: publishing takes a while
    relay = relay_process(pg, vhost, "--batch", "50", "--poll", "100ms")
    listed, closes = f"/vhosts/{broker.q(vhost)}/connections", 0
    try:
        while closes < 4 and not all(p for p, _, _ in _rows(pg).values()):
            result = broker.rabbitmqctl("close_all_connections", "-p", vhost, "test: forced")
            closes += "Closed 0 connections" not in result.stdout
            code, status = status_json(pg)  # status while the relay works
            assert code in (0, 1) and status["pending"] >= 0
            assert relay.poll() is None, relay.communicate()[1][-3000:]
        _wait(lambda: all(p for p, _, _ in _rows(pg).values()), "rows left pending", 40)
        ids += _fill(pg, exchange, 500, start=len(ids))  # idle relay: its connection closed
        _wait(lambda: broker.api("GET", listed).json(), "the relay's connection is not listed")
        for c in broker.api("GET", listed).json():
            broker.api("DELETE", f"/connections/{broker.q(c['name'])}")
        ids += _fill(pg, exchange, 500, start=len(ids))
        _wait(lambda: all(p for p, _, _ in _rows(pg).values()), "rows left pending", 40)
        assert relay.poll() is None, relay.communicate()  # it reconnected by itself
    finally:
        out, err = _stop(relay)
    assert relay.returncode == 0, out + err
    got = collect(vhost, queue)
    counts = collections.Counter(m["message_id"] for m in got)
    assert closes >= 1 and set(counts) == set(ids)  # nothing lost; re-published may repeat
    assert sum(counts.values()) - len(ids) <= 50 * closes  # at most a batch per close again
    _in_order(got)
    print(f"relay: {out.strip()}; {closes} closes; copies {len(got)} for {len(ids)} rows")


def test_connections_closed_from_the_relays_first_moment(vhost: str, pg: str) -> None:
    """Its connections closed again and again from the moment it starts (its first connect
    included): a broker that answered and closed (CONNECTION_FORCED) is not "unreachable at
    start", so the relay keeps retrying instead of exiting 69, then publishes every row."""
    exchange, queue = _names()
    declare(vhost, exchange, queue)
    ids = _fill(pg, exchange, 2000, pad=8192)  # 16 MB: publishing takes a while
    relay = relay_process(pg, vhost, "--batch", "50", "--poll", "100ms")
    closes = 0
    try:
        for _ in range(30):  # several seconds of closes, the first before its handshake
            result = broker.rabbitmqctl("close_all_connections", "-p", vhost, "test: forced")
            closes += "Closed 0 connections" not in result.stdout
            assert relay.poll() is None, relay.communicate()[1][-3000:]
        _wait(lambda: all(p for p, _, _ in _rows(pg).values()), "rows left pending", 60)
        assert relay.poll() is None, relay.communicate()
    finally:
        out, err = _stop(relay)
    assert relay.returncode == 0, out + err
    assert "cannot reach database" not in err  # a broker close is not reported as the database
    counts = collections.Counter(m["message_id"] for m in collect(vhost, queue))
    assert closes >= 2 and set(counts) == set(ids)


def test_postgres_backend_terminated_between_confirm_and_mark(
    vhost: str, pg: str, tmp_path: Path
) -> None:
    exchange, queue = _names()
    declare(vhost, exchange, queue)
    ids = _fill(pg, exchange, 300)
    marker, app = tmp_path / "paused", f"rmqkit-oba-{uuid.uuid4().hex[:8]}"
    env = {PAUSE: "1", MARKER: str(marker), "PGAPPNAME": app}
    relay = relay_process(pg, vhost, "--batch", "100", "--poll", "100ms", env=env)
    try:
        _wait(marker.exists, "the relay never reached the pause")
        with psycopg.connect(pg, autocommit=True) as admin:
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = %s",
                (app,),
            ).fetchone()
        assert killed is not None and killed[0] >= 1
        _wait(lambda: all(p for p, _, _ in _rows(pg).values()), "rows left pending", 40)
        assert relay.poll() is None, relay.communicate()
    finally:
        out, err = _stop(relay)
    assert relay.returncode == 0, out + err
    got = collect(vhost, queue)
    counts = collections.Counter(m["message_id"] for m in got)
    assert set(counts) == set(ids)
    twice = [m for m, n in counts.items() if n > 1]
    assert len(twice) <= 100 and set(twice) <= set(ids[:100])  # only the first batch, at most
    _in_order(got)


def test_kill_9_of_a_sqlite_relay_then_another_takes_over_after_the_lease(
    vhost: str, tmp_path: Path
) -> None:
    dsn = f"sqlite:///{tmp_path}/app.db"
    rmqkit.outbox.init(dsn)
    exchange, queue = _names()
    declare(vhost, exchange, queue)
    conn = sqlite3.connect(tmp_path / "app.db")
    ids = [
        rmqkit.outbox.add(conn, exchange=exchange, routing_key="ev", body=b"%d" % n)
        for n in range(250)
    ]
    conn.commit()
    conn.close()
    marker = tmp_path / "paused"
    first = relay_process(
        dsn, vhost, "--batch", "100", "--lease", "2s", env={PAUSE: "60", MARKER: str(marker)}
    )
    _wait(marker.exists, "the relay never reached the pause")
    first.kill()
    first.communicate()
    second = relay_process(dsn, vhost, "--batch", "100", "--lease", "2s", "--poll", "200ms")
    try:
        _wait(lambda: all(p for p, _, _ in _rows(dsn).values()), "rows left pending", 20)
    finally:
        out, err = _stop(second)
    assert second.returncode == 0, out + err
    counts = collections.Counter(m["message_id"] for m in collect(vhost, queue))
    assert set(counts) == set(ids)
    assert {m for m, n in counts.items() if n > 1} == set(ids[:100])  # the killed batch only


def test_broker_closed_between_confirm_and_mark_then_reconnects(
    vhost: str, pg: str, tmp_path: Path
) -> None:
    """The connection closed while the relay pauses between a batch's confirms and its marks (or,
    the management API's listing lagging, in the next batch): the relay reconnects by itself and
    publishes the rest; copies beyond one are only rows of the batch the close hit (a confirm
    lost with the connection is a re-publish, never a mark)."""
    exchange, queue = _names()
    declare(vhost, exchange, queue)
    ids = _fill(pg, exchange, 400)
    marker = tmp_path / "paused"
    env = {PAUSE: "0.5", MARKER: str(marker)}
    relay = relay_process(pg, vhost, "--batch", "100", "--poll", "100ms", env=env)
    listed = f"/vhosts/{broker.q(vhost)}/connections"
    try:
        _wait(marker.exists, "the relay never reached the pause")
        _wait(lambda: broker.api("GET", listed).json(), "the relay's connection is not listed")
        for c in broker.api("GET", listed).json():
            broker.api("DELETE", f"/connections/{broker.q(c['name'])}")
        _wait(lambda: all(p for p, _, _ in _rows(pg).values()), "rows left pending", 40)
        assert relay.poll() is None, relay.communicate()
    finally:
        out, err = _stop(relay)
    assert relay.returncode == 0, out + err
    got = collect(vhost, queue)
    counts = collections.Counter(m["message_id"] for m in got)
    assert set(counts) == set(ids)
    assert sum(counts.values()) - len(ids) <= 100, out  # at most one batch again
    _in_order(got)
    print(f"relay: {out.strip()}; copies {len(got)} for {len(ids)} rows")


def test_sqlite_batch_longer_than_the_lease_is_not_published_twice(
    vhost: str, tmp_path: Path
) -> None:
    """A live relay whose batch outlasts the lease (here a 3 s pause; in life a broker in flow
    control) keeps its lease: a second relay waits instead of publishing the same rows."""
    dsn = f"sqlite:///{tmp_path}/app.db"
    rmqkit.outbox.init(dsn)
    exchange, queue = _names()
    declare(vhost, exchange, queue)
    conn = sqlite3.connect(tmp_path / "app.db")
    ids = [
        rmqkit.outbox.add(conn, exchange=exchange, routing_key="ev", body=b"%d" % n)
        for n in range(150)
    ]
    conn.commit()
    conn.close()
    marker = tmp_path / "paused"
    slow = relay_process(
        dsn, vhost, "--batch", "100", "--lease", "1s", env={PAUSE: "3", MARKER: str(marker)}
    )
    _wait(marker.exists, "the relay never reached the pause")
    other = relay_process(dsn, vhost, "--batch", "100", "--lease", "1s", "--poll", "200ms")
    try:
        _wait(lambda: all(p for p, _, _ in _rows(dsn).values()), "rows left pending", 30)
    finally:
        outputs = [_stop(slow), _stop(other)]
    assert (slow.returncode, other.returncode) == (0, 0), outputs
    counts = collections.Counter(m["message_id"] for m in collect(vhost, queue))
    assert counts == collections.Counter(ids), outputs  # each once: no second publisher


def test_exchange_deleted_under_a_running_relay(vhost: str, pg: str) -> None:
    """The relay still believes the exchange exists (its check is cached for a few seconds) when
    it publishes to it: the broker closes the channel (404), failing the other rows in flight on
    it too. None is marked without its confirm; the others go out on their retry; the relay checks
    the exchange again instead of closing the next channel the same way (the retry of the row
    says "does not exist"). Going out once the exchange is back: test_outbox.py."""
    x, y, queue = f"x-{uuid.uuid4().hex[:6]}", f"y-{uuid.uuid4().hex[:6]}", _names()[1]
    declare(vhost, x, queue)
    declare(vhost, y, queue)
    relay = relay_process(pg, vhost, "--batch", "50", "--poll", "100ms")

    def add(*exchanges: str) -> list[str]:
        with psycopg.connect(pg) as conn, conn.transaction():
            return [
                rmqkit.outbox.add(conn, exchange=e, routing_key="k", body=b"") for e in exchanges
            ]

    try:
        ids = add(x)
        _wait(lambda: all(p for p, _, _ in _rows(pg).values()), "the first row is pending")
        broker.api("DELETE", f"/exchanges/{broker.q(vhost)}/{broker.q(x)}")
        ids += add(y, x, y)
        _wait(lambda: "NOT_FOUND" in str(_rows(pg)[ids[2]][1]), "no 404", 10)
        # the others go out on the retry; the deleted exchange is checked again, not published to
        _wait(lambda: _rows(pg)[ids[2]][2] >= 2, "no retry", 15)
        assert not _rows(pg)[ids[2]][0] and "does not exist" in str(_rows(pg)[ids[2]][1])
        _wait(lambda: _rows(pg)[ids[1]][0] and _rows(pg)[ids[3]][0], "y rows pending", 15)
        assert relay.poll() is None, relay.communicate()
    finally:
        out, err = _stop(relay)
    assert relay.returncode == 0, out + err
    counts = collections.Counter(m["message_id"] for m in collect(vhost, queue))
    # y rows may be twice (enqueued, then their confirm lost with the channel); x2 never arrived
    assert set(counts) == {ids[0], ids[1], ids[3]} and counts[ids[0]] == 1, out

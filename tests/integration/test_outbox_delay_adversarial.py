"""The outbox relay's delays, order, start and stop, attacked one step further than the defects
that were fixed (test_outbox_delayed.py, test_outbox_commit_order.py, test_outbox_lifecycle.py):

- a delayed row's exit removed while its target stays (the binding deleted by hand), and a
  default-exchange target (a queue) deleted under the relay and declared again;
- 30 delayed rows of one aggregate in one batch: strict order sends them in 30 waves, each
  after the previous one's confirms, and each must still enter the ladder with the delay it
  has left then;
- three concurrent transactions on one aggregate committing in reverse order, a daemon relay
  (LISTEN/NOTIFY) watching;
- SIGTERM while the broker connection has gone silent (a proxy that stops forwarding: no
  confirm, no error, no close);
- a database that appears only after the relay was started;
- an outbox table of another shape.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

import rmqkit.outbox
from rmqkit.delay import Ladder
from rmqkit.settings import with_vhost
from tests import broker
from tests.integration.test_outbox import (
    BASE_DSN,
    collect,
    declare,
    drop_schema,
    outbox,
    pg_schema_dsn,
    relay_process,
)
from tests.integration.test_outbox_adversarial import _rows, _stop, _wait
from tests.integration.test_outbox_delayed import (
    Tap,
    add_rows,
    arrived,
    created_at,
    relay_once_with_tap,
    running_relay,
    sqlite_outbox,
)
from tests.integration.test_outbox_lifecycle import _exit_of, _one_line

pytestmark = pytest.mark.broker


# --- delayed rows whose exit breaks ---------------------------------------------------------
def test_the_exit_binding_deleted_while_the_target_exchange_stays(
    vhost: str, tmp_path: Path
) -> None:
    """Someone removes the ladder's exit into a live exchange (a binding clean-up): the relay
    binds it again before its next delayed rows, which arrive."""
    exchange, queue = f"bx-{uuid.uuid4().hex[:6]}", f"bq-{uuid.uuid4().hex[:6]}"
    declare(vhost, exchange, queue)
    dsn = sqlite_outbox(tmp_path)
    relay = running_relay(dsn, vhost)
    try:
        first = add_rows(dsn, exchange, 1)
        assert arrived(vhost, queue, 1, 20) == first
        out = Ladder().out
        path = f"/bindings/{broker.q(vhost)}/e/{broker.q(out)}/e/{broker.q(exchange)}"
        bindings = broker.api("GET", path).json()
        assert len(bindings) == 1, bindings
        removed = broker.api("DELETE", f"{path}/{bindings[0]['properties_key']}")
        assert removed.status_code == 204, removed.text
        later = add_rows(dsn, exchange, 5)
        assert sorted(arrived(vhost, queue, 5, 20)) == sorted(later), _rows(dsn)
        assert relay.poll() is None, relay.communicate()
    finally:
        out_text, err = _stop(relay)
    assert relay.returncode == 0, out_text + err


def test_a_queue_target_deleted_under_the_relay_then_declared_again(
    vhost: str, tmp_path: Path
) -> None:
    """Delayed rows for the default exchange (routing key = a queue): the exit is a binding to
    that queue, gone with it. While the queue is missing its delayed rows stay pending with the
    error; declared again, they arrive (none marked and lost in between)."""
    queue = f"tq-{uuid.uuid4().hex[:6]}"
    declare(vhost, f"unused-{queue}", queue)  # a durable queue (the exchange is not used)
    dsn = sqlite_outbox(tmp_path)
    relay = running_relay(dsn, vhost)

    def add(count: int, delay: str = "1s") -> list[str]:
        with sqlite3.connect(dsn.removeprefix("sqlite:///")) as conn:
            return [
                rmqkit.outbox.add(conn, exchange="", routing_key=queue, body=b"d", delay=delay)
                for _ in range(count)
            ]

    try:
        first = add(1)
        assert arrived(vhost, queue, 1, 20) == first
        gone = broker.api("DELETE", f"/queues/{broker.q(vhost)}/{broker.q(queue)}")
        assert gone.status_code == 204, gone.text
        held = add(3)
        _wait(lambda: all(_rows(dsn)[m][2] >= 1 for m in held), "not tried", 20)
        rows = _rows(dsn)
        assert not any(rows[m][0] for m in held), rows
        assert all(queue in str(rows[m][1]) for m in held), rows
        declare(vhost, f"unused-{queue}", queue)
        assert sorted(arrived(vhost, queue, 3, 40)) == sorted(held), _rows(dsn)
        assert relay.poll() is None, relay.communicate()
    finally:
        out, err = _stop(relay)
    assert relay.returncode == 0, out + err


@pytest.mark.timing
def test_delayed_rows_of_one_aggregate_each_planned_in_its_own_wave(
    vhost: str, tmp_path: Path
) -> None:
    """Strict order sends an aggregate's rows one wave (one confirm round trip) at a time; every
    row's remaining delay must be computed as its own wave goes out. Timing, generously: entry
    (the tap's receive time, a little late) + planned delay - (add + 10 s) within -50 to +150 ms;
    planned once for the whole batch, the last rows would be late by the 29 waves before them.
    The delay is long enough that no row is already due when a slow relay start claims it (a
    due row goes straight to its exchange, never through the ladder the tap watches)."""
    exchange, queue = f"wx-{uuid.uuid4().hex[:6]}", f"wq-{uuid.uuid4().hex[:6]}"
    declare(vhost, exchange, queue)
    dsn = sqlite_outbox(tmp_path)
    with sqlite3.connect(dsn.removeprefix("sqlite:///")) as conn:
        ids = [
            rmqkit.outbox.add(
                conn, exchange=exchange, routing_key="k", body={"n": n}, aggregate="a", delay="10s"
            )
            for n in range(30)
        ]
    created = created_at(dsn)
    tap = Tap(vhost, exchange)
    report = relay_once_with_tap(vhost, dsn, tap, lambda: len(tap.seen) == 30)
    assert (report.published, report.left_pending) == (30, 0), report.errors
    assert sorted(tap.seen) == sorted(ids), "rows that did not enter the ladder"
    errors = {
        mid: tap.seen[mid][0] + int(tap.seen[mid][1]["rmqkit-delay-ms"]) / 1000 - created[mid] - 10
        for mid in ids
    }
    assert all(-0.05 < e < 0.15 for e in errors.values()), sorted(
        f"{e * 1000:.0f} ms" for e in errors.values()
    )
    assert sorted(arrived(vhost, queue, 30, 30)) == sorted(ids)


# --- three transactions on one aggregate, committed in reverse -----------------------------
def test_three_transactions_on_one_aggregate_commit_in_reverse_under_a_daemon_relay(
    vhost: str,
) -> None:
    schema, pg = pg_schema_dsn("rmqkit_obd")
    exchange, queue = f"rx-{uuid.uuid4().hex[:6]}", f"rq-{uuid.uuid4().hex[:6]}"
    declare(vhost, exchange, queue)
    rmqkit.outbox.init(pg)
    relay = relay_process(pg, vhost, "--poll", "100ms")
    conns = [psycopg.connect(pg) for _ in range(3)]
    try:
        with psycopg.connect(pg) as conn:  # a first row, so the relay is known to be running
            ready = rmqkit.outbox.add(conn, exchange=exchange, routing_key="k", body=b"ready")
        _wait(lambda: _rows(pg)[ready][0], "the relay did not start", 20)
        ids = [
            rmqkit.outbox.add(
                c, exchange=exchange, routing_key="k", body={"n": n}, aggregate="order-1"
            )
            for n, c in enumerate(conns)
        ]
        for conn in reversed(conns):  # the last writer commits first
            conn.commit()
            time.sleep(0.5)  # the relay (NOTIFY) sees each commit alone
        _wait(lambda: all(p for p, _, _ in _rows(pg).values()), "not all published", 20)
        got = [m["message_id"] for m in collect(vhost, queue)]
        assert got == [ready, *ids], (got, ids)
        assert relay.poll() is None, relay.communicate()
    finally:
        for conn in conns:
            conn.close()
        out, err = _stop(relay)
        drop_schema(schema)
    assert relay.returncode == 0, out + err


# --- SIGTERM while the broker connection is silent ---------------------------------------------
class SilentProxy:
    """A TCP proxy to the broker that, once ``silence()`` is called, keeps every connection
    open but forwards nothing more either way (a network path that died without a reset)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.silent = threading.Event()
        self.closed = threading.Event()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                while self.silent.is_set() and not self.closed.is_set():
                    time.sleep(0.05)  # swallowed, never forwarded
                if self.closed.is_set():
                    return
                sink.sendall(data)

    def silence(self) -> None:
        self.silent.set()

    def close(self) -> None:
        self.closed.set()
        for sock in [self.listener, *self.sockets]:
            with contextlib.suppress(OSError):
                sock.close()


@pytest.fixture
def proxy() -> Iterator[SilentProxy]:
    host, port = broker.BASE_URL.split("@")[-1].split("/")[0].split(":")
    made = SilentProxy((host, int(port)))
    yield made
    made.close()


@pytest.mark.timing
def test_sigterm_while_the_broker_connection_is_silent(
    vhost: str, tmp_path: Path, proxy: SilentProxy
) -> None:
    queue = f"sq-{uuid.uuid4().hex[:6]}"
    declare(vhost, f"unused-{queue}", queue)
    dsn = sqlite_outbox(tmp_path)
    url = with_vhost(f"amqp://guest:guest@127.0.0.1:{proxy.port}/", vhost)
    relay = running_relay(dsn, vhost, "--grace", "2s", env={"RMQKIT_URL": url})
    try:
        # connected through the proxy (it published a first row), idle
        proxy.silence()
        with sqlite3.connect(dsn.removeprefix("sqlite:///")) as conn:
            ids = [
                rmqkit.outbox.add(conn, exchange="", routing_key=queue, body=b"s") for _ in range(5)
            ]
        time.sleep(1.5)  # claimed and sent into the silence: waiting on confirms
        relay.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        code, err = _exit_of(relay, 30)
    finally:
        if relay.poll() is None:
            relay.kill()
            relay.communicate()
    took = time.monotonic() - signalled
    assert code == 0, err
    assert took < 8, f"stopped {took:.1f} s after SIGTERM (grace 2 s)"
    assert not any(_rows(dsn)[m][0] for m in ids), _rows(dsn)
    after = outbox("relay", "--dsn", dsn, "--once", vhost=vhost)
    assert after.returncode == 0, after.stderr
    assert sorted(arrived(vhost, queue, 5, 10)) == sorted(ids)


# --- a database that appears only after start ------------------------------------------------
def test_a_database_that_appears_after_the_relay_started(vhost: str, tmp_path: Path) -> None:
    """A relay started before its database exists exits 69 at once (for the supervisor to
    restart), whether it is a PostgreSQL database not created yet or a SQLite file in a
    directory not mounted yet; started again once it exists, it relays."""
    name = f"rmqkit_late_{uuid.uuid4().hex[:8]}"
    base = BASE_DSN.rsplit("/", 1)[0]
    late_pg = f"{base}/{name}"
    late_sqlite = f"sqlite:///{tmp_path}/not-mounted-yet/app.db"
    try:
        for dsn in (late_pg, late_sqlite):
            relay = relay_process(dsn, vhost, "--poll", "100ms")
            code, err = _exit_of(relay, 20)
            assert code == 69, err
            _one_line(err)
        with psycopg.connect(BASE_DSN, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        (tmp_path / "not-mounted-yet").mkdir()
        exchange, queue = f"lx-{uuid.uuid4().hex[:6]}", f"lq-{uuid.uuid4().hex[:6]}"
        declare(vhost, exchange, queue)
        ids: list[str] = []
        for dsn in (late_pg, late_sqlite):
            rmqkit.outbox.init(dsn)
            conn: Callable[[], object] = (
                (lambda d=dsn: psycopg.connect(d))
                if dsn.startswith("postgresql")
                else (lambda d=dsn: sqlite3.connect(d.removeprefix("sqlite:///")))
            )
            with contextlib.closing(conn()) as c:  # type: ignore[type-var]
                ids.append(rmqkit.outbox.add(c, exchange=exchange, routing_key="k", body=b"l"))
                c.commit()  # type: ignore[attr-defined]
            run = outbox("relay", "--dsn", dsn, "--once", vhost=vhost)
            assert run.returncode == 0, run.stderr
        assert sorted(arrived(vhost, queue, 2, 10)) == sorted(ids)
    finally:
        with psycopg.connect(BASE_DSN, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


# --- an outbox table of another shape ----------------------------------------------------------
def test_an_outbox_table_of_another_shape_is_one_line_and_78(vhost: str, tmp_path: Path) -> None:
    schema, pg = pg_schema_dsn("rmqkit_obd")
    wrong = "CREATE TABLE rmqkit_outbox (id INTEGER PRIMARY KEY, message_id TEXT, payload TEXT)"
    sqlite_dsn = f"sqlite:///{tmp_path}/other.db"
    try:
        with sqlite3.connect(tmp_path / "other.db") as conn:
            conn.execute(wrong)
        with psycopg.connect(pg, autocommit=True) as conn:
            conn.execute(wrong)
        for dsn in (sqlite_dsn, pg):
            for args, on_vhost in (
                (["init", "--dsn", dsn], None),  # keeps the table, as it found it
                (["status", "--dsn", dsn], None),
                (["relay", "--dsn", dsn, "--once"], vhost),
            ):
                result = outbox(*args, vhost=on_vhost)
                assert result.returncode == 78, (args, result.stdout + result.stderr)
                line = _one_line(result.stderr)
                assert "rmqkit outbox init" in line and "published_at" in line, line
            assert _indexes_added(dsn) == 0
    finally:
        drop_schema(schema)


def _indexes_added(dsn: str) -> int:
    """How many indexes the other table gained (none: init changed nothing)."""
    if dsn.startswith("sqlite"):
        with sqlite3.connect(dsn.removeprefix("sqlite:///")) as conn:
            sql = "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
            return int(conn.execute(sql).fetchone()[0])
    with psycopg.connect(dsn) as conn:
        sql = (
            "SELECT count(*) FROM pg_indexes WHERE schemaname = current_schema() AND "
            "tablename = 'rmqkit_outbox' AND indexname <> 'rmqkit_outbox_pkey'"
        )
        row = conn.execute(sql).fetchone()
        return int(row[0]) if row else 0

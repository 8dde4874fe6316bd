"""The outbox relay's start and stop, and ``status`` on a database that is not ready, as a
supervisor and a monitoring system see them: exit codes, one line on stderr, what is left in
the table.

- a daemon relay that cannot reach its broker or database at start exits 69 (docs/outbox.md:
  a supervisor restarts it) instead of retrying forever;
- ``outbox status`` without the table is one line and 78 ("run `rmqkit outbox init`"), not a
  traceback and 1 (monitoring reads 1 as "warning");
- a relay blocked by a memory alarm stops within its grace on SIGTERM, the rows it could not
  get confirmed left pending (on the alarm node of tests/integration/alarm_node.py: an alarm
  blocks every publisher of its cluster, so never on the shared broker).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pytest

import rmqkit.outbox
from tests.faults.cluster import ClusterUnavailable
from tests.integration.alarm_node import AlarmNode
from tests.integration.test_outbox import drop_schema, outbox, pg_schema_dsn, relay_process
from tests.integration.test_outbox_adversarial import _rows

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rmqkit: error: "), lines
    return lines[0]


def _exit_of(relay: subprocess.Popen[str], timeout_s: float) -> tuple[int, str]:
    """The relay's exit code and stderr; fails (and kills it) if it runs on past the timeout."""
    try:
        _, err = relay.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        relay.kill()
        relay.communicate()
        raise AssertionError(f"the relay still ran after {timeout_s:.0f} s") from None
    return relay.returncode, err


def test_a_daemon_relay_that_cannot_reach_its_broker_or_database_at_start_exits_69(
    vhost: str, tmp_path: Path
) -> None:
    dsn = f"sqlite:///{tmp_path}/app.db"
    rmqkit.outbox.init(dsn)
    no_broker = relay_process(
        dsn, vhost, "--poll", "100ms", env={"RMQKIT_URL": "amqp://guest:guest@127.0.0.1:1/"}
    )
    code, err = _exit_of(no_broker, 20)
    assert code == 69, err
    assert "127.0.0.1:1" in _one_line(err)
    no_database = relay_process("postgresql://app:s3cret@127.0.0.1:1/app", vhost, "--poll", "100ms")
    code, err = _exit_of(no_database, 20)
    assert code == 69, err
    assert "s3cret" not in _one_line(err)


def test_status_without_the_outbox_table_is_one_line_and_78(tmp_path: Path) -> None:
    schema, pg = pg_schema_dsn("rmqkit_obl")
    try:
        for dsn in (f"sqlite:///{tmp_path}/empty.db", pg):
            for extra in ([], ["--json"]):
                result = outbox("status", "--dsn", dsn, *extra, vhost=None)
                assert result.returncode == 78, result.stdout + result.stderr
                assert "rmqkit outbox init" in _one_line(result.stderr)
                assert result.stdout == ""
    finally:
        drop_schema(schema)


# --- SIGTERM while a memory alarm blocks the relay --------------------------------------------
@pytest.fixture
def alarm_node() -> Iterator[AlarmNode]:
    try:
        started = AlarmNode().start()
    except ClusterUnavailable as exc:
        pytest.skip(f"no alarm node here: {exc}")
    try:
        yield started
    finally:
        started.stop()


def _declare_queue(node: AlarmNode) -> str:
    name = f"alarm-{uuid.uuid4().hex[:8]}"

    async def declare() -> None:
        connection = await aio_pika.connect(node.url)
        async with connection:
            channel = await connection.channel()
            await channel.declare_queue(name, durable=True)

    asyncio.run(declare())
    return name


def _take(node: AlarmNode, queue: str) -> list[str]:
    async def take() -> list[str]:
        connection = await aio_pika.connect(node.url)
        async with connection:
            channel = await connection.channel()
            declared = await channel.declare_queue(queue, passive=True)
            out: list[str] = []
            while (message := await declared.get(fail=False, no_ack=True)) is not None:
                out.append(str(message.message_id))
            return out

    return list(asyncio.run(take()))


def _node_env(node: AlarmNode) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RMQKIT_")}
    env.update(RMQKIT_URL=node.url, RMQKIT_MANAGEMENT_URL=node.management_url)
    return env


@pytest.mark.timing
@pytest.mark.own_node  # starts the alarm node (one per host: tests/integration/alarm_node.py)
def test_sigterm_stops_a_relay_blocked_by_a_memory_alarm_within_its_grace(
    alarm_node: AlarmNode, tmp_path: Path
) -> None:
    """Blocked on confirms that never come, the relay must still stop on SIGTERM within its
    grace (2 s here; asserted with room for the process's own exit: under 8 s, where the code
    before took more than 15), marking nothing it has no confirm for."""
    queue = _declare_queue(alarm_node)
    dsn = f"sqlite:///{tmp_path}/app.db"
    rmqkit.outbox.init(dsn)
    with sqlite3.connect(tmp_path / "app.db") as conn:
        ids = [
            rmqkit.outbox.add(conn, exchange="", routing_key=queue, body={"n": n}) for n in range(5)
        ]
    command = [sys.executable, "-m", "rmqkit", "outbox", "relay", "--dsn", dsn, "--grace", "2s"]
    with alarm_node.memory_alarm():
        relay = subprocess.Popen(
            [*command, "--poll", "100ms"],
            env=_node_env(alarm_node),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert relay.stderr is not None
        try:
            line = relay.stderr.readline()  # the relay says it is blocked: its batch is out
            assert "broker blocks publishing" in line, line
        except BaseException:
            relay.kill()
            raise
        relay.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        code, err = _exit_of(relay, 30)
        took = time.monotonic() - signalled
        assert code == 0, err
        assert took < 8, f"stopped {took:.1f} s after SIGTERM (grace 2 s)"
        rows = _rows(dsn)
        assert not any(published for published, _, _ in rows.values()), rows
    # Nothing lost: once the alarm is over, a relay publishes every row (a copy the blocked
    # connection had already handed to the broker may arrive twice: at least once).
    after = subprocess.run(
        [*command, "--once"], env=_node_env(alarm_node), cwd=ROOT, capture_output=True, text=True
    )
    assert after.returncode == 0, after.stderr
    assert set(_take(alarm_node, queue)) == set(ids)
    assert all(published for published, _, _ in _rows(dsn).values())

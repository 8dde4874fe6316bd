"""Memory and disk alarms (issue 14, runbook memory-alarm.md), on a node of this module's own.

An alarm blocks every publishing connection of its cluster, so it is never raised on a node
other tests share: ``tests/integration/alarm_node.py`` starts ``rmqalarm`` (AMQP 5691) for this
module (~6 s) and every alarm is cleared in a ``finally``. The module skips, with the reason, only
when that node cannot be started here.

- a publish the broker blocks says so on stderr at once, with the broker's reason, and again
  while blocked; ``--timeout`` gives up with exit 69 naming the confirmed messages, and the
  broker holds exactly those; once the alarm clears, blocked publishes are confirmed.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pytest

from rmqkit.publish import messages_from_bodies, publish_messages
from rmqkit.settings import load_settings
from tests.faults.cluster import ClusterUnavailable, poll
from tests.integration.alarm_node import AlarmNode

# Each test starts an alarm node of its own (the host's package): not beside other tests.
pytestmark = pytest.mark.own_node

ROOT = Path(__file__).resolve().parents[2]
CONSUME = [
    sys.executable,
    "-m",
    "rmqkit",
    "consume",
    "tests.handlers:handle",
    "--queue",
    "jobs.work",
]


@pytest.fixture(scope="module")
def node() -> Iterator[AlarmNode]:
    try:
        started = AlarmNode().start()
    except ClusterUnavailable as exc:
        pytest.skip(f"no alarm node here: {exc}")
    try:
        yield started
    finally:
        started.stop()


def _queue(node: AlarmNode) -> str:
    """A fresh durable queue on the node (declared while no alarm is on)."""
    name = f"alarm-{uuid.uuid4().hex[:8]}"

    async def declare() -> None:
        connection = await aio_pika.connect(node.url)
        async with connection:
            channel = await connection.channel()
            await channel.declare_queue(name, durable=True)

    asyncio.run(declare())
    return name


def _depth(node: AlarmNode, queue: str) -> int:
    async def read() -> int:
        connection = await aio_pika.connect(node.url)
        async with connection:
            channel = await connection.channel()
            declared = await channel.declare_queue(queue, passive=True)
            return int(declared.declaration_result.message_count or 0)

    return int(asyncio.run(read()))


def _drain(node: AlarmNode, queue: str) -> list[tuple[str | None, bytes]]:
    """Every message of ``queue`` (message_id, body), taken off it."""

    async def take() -> list[tuple[str | None, bytes]]:
        connection = await aio_pika.connect(node.url)
        async with connection:
            channel = await connection.channel()
            declared = await channel.declare_queue(queue, passive=True)
            out: list[tuple[str | None, bytes]] = []
            while (message := await declared.get(fail=False, no_ack=True)) is not None:
                out.append((message.message_id, message.body))
            return out

    return list(asyncio.run(take()))


def _env(node: AlarmNode, **more: str) -> dict[str, str]:
    """The environment of an rmqkit command against the alarm node."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RMQKIT_")}
    env.update(RMQKIT_URL=node.url, RMQKIT_MANAGEMENT_URL=node.management_url, **more)
    return env


def _cli(node: AlarmNode, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rmqkit", *args],
        capture_output=True,
        text=True,
        env=_env(node, **env),
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def _publish_cli(node: AlarmNode, queue: str, *args: str) -> subprocess.CompletedProcess[str]:
    return _cli(node, "publish", "", queue, *args)


def test_a_blocked_publish_says_why_at_once_and_gives_up_naming_what_was_confirmed(
    node: AlarmNode,
) -> None:
    queue = _queue(node)
    before = _publish_cli(node, queue, "--body", "before the alarm")
    assert before.returncode == 0, before.stderr
    bodies = ("--body", "one", "--body", "two")
    with node.memory_alarm():
        # --blocked-every longer than the run: a notice can only come from the block itself.
        blocked = _publish_cli(node, queue, *bodies, "--timeout", "3s", "--blocked-every", "30s")
        assert _depth(node, queue) == 1  # the broker took nothing while it blocked publishing
    assert blocked.returncode == 69, blocked.stderr
    lines = blocked.stderr.splitlines()
    notices = [line for line in lines if line.startswith("rmqkit publish: broker blocks")]
    assert len(notices) == 1, blocked.stderr
    assert "low on memory" in notices[0] and "0 of 2 message(s) confirmed" in notices[0]
    error = lines[-1]
    assert error.startswith("rmqkit: error: gave up after 3s without a confirm"), error
    assert "low on memory" in error and "Nothing is lost" in error
    assert "confirmed 0 of the 2 message(s) sent" in error
    assert "not confirmed: messages 1-2" in error
    assert "may still take them when the alarm clears" in error
    # The advice holds: the same command again confirms both, under the ids the error named;
    # the copies the broker read after the alarm cleared (if any) carry the same ids.
    again = _publish_cli(node, queue, *bodies, "--json")
    assert again.returncode == 0, again.stderr
    assert '"confirmed": 2' in again.stdout
    named = set(error.split("message_id ", 1)[1].split(")", 1)[0].split(", "))
    held = _drain(node, queue)
    # Each blocked copy the first run had written to its socket may arrive too, once, when the
    # alarm clears (4 seen: "one" had been written, "two" not yet); none is lost or tripled.
    counts = Counter(body for _, body in held)
    assert counts[b"before the alarm"] == 1 and set(counts) == {b"before the alarm", b"one", b"two"}
    assert counts[b"one"] in (1, 2) and counts[b"two"] in (1, 2), held
    assert {mid for mid, body in held if body != b"before the alarm"} == named


def test_the_notice_repeats_while_blocked_and_the_timeout_names_the_disk(
    node: AlarmNode,
) -> None:
    queue = _queue(node)
    settings = load_settings(url=node.url, management_url=node.management_url)
    notices: list[tuple[float, str]] = []
    began = time.monotonic()

    def notice(line: str) -> None:
        notices.append((time.monotonic() - began, line))

    with node.disk_alarm():
        poll(lambda: "disk_free_alarm" in node.alarms(), 20)  # the disk monitor's next check
        began = time.monotonic()
        with pytest.raises(Exception) as caught:
            asyncio.run(
                publish_messages(
                    settings,
                    "",
                    queue,
                    messages_from_bodies([b"a", b"b", b"c"]),
                    notice=notice,
                    notice_every_s=1.0,
                    timeout_s=2.6,
                )
            )
        assert _depth(node, queue) == 0  # nothing taken while blocked (maybe after: see above)
    error = caught.value
    assert type(error).__name__ == "BrokerUnavailable" and getattr(error, "exit_code", 0) == 69
    assert "low on disk" in str(error) and "not confirmed: messages 1-3" in str(error)
    first_at, first = notices[0]
    assert first.startswith("broker blocks publishing: low on disk"), notices
    assert first_at < 0.9, notices  # at once, not at the first reminder (1 s)
    still = [line for _, line in notices if line.startswith("broker still blocks publishing")]
    assert len(still) >= 2, notices


def test_publishes_blocked_by_an_alarm_are_confirmed_when_it_clears(node: AlarmNode) -> None:
    queue = _queue(node)
    settings = load_settings(url=node.url, management_url=node.management_url)
    notices: list[str] = []

    async def scenario() -> int:
        noticed = asyncio.Event()

        def notice(line: str) -> None:
            notices.append(line)
            noticed.set()

        with node.memory_alarm():
            publishing = asyncio.ensure_future(
                publish_messages(
                    settings,
                    "",
                    queue,
                    messages_from_bodies([b"x", b"y"]),
                    notice=notice,
                    notice_every_s=30,
                )
            )
            await asyncio.wait_for(noticed.wait(), 15)
            assert "low on memory" in notices[0], notices
            assert not publishing.done()
        report = await asyncio.wait_for(publishing, 30)  # the alarm is cleared: it completes
        return report.confirmed

    assert asyncio.run(scenario()) == 2
    assert any(line.startswith("broker unblocked publishing") for line in notices), notices
    assert _depth(node, queue) == 2


def _cli(node: AlarmNode, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RMQKIT_")}
    env.update(RMQKIT_URL=node.url, RMQKIT_MANAGEMENT_URL=node.management_url)
    return subprocess.run(
        [sys.executable, "-m", "rmqkit", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def _alarm_findings(node: AlarmNode) -> tuple[int, list[dict[str, str]]]:
    doctor = _cli(node, "doctor", "--json", "--growth-sample", "0")
    report = json.loads(doctor.stdout)
    findings = [f for f in report["findings"] if f["check"] == "broker-alarm"]
    return doctor.returncode, findings


def test_status_and_doctor_name_the_node_and_the_resource_in_alarm(node: AlarmNode) -> None:
    with node.memory_alarm():
        poll(lambda: "mem_alarm" in node.alarms(), 20)
        piped = _cli(node, "status")
        as_json = _cli(node, "status", "--json")
        code, findings = _alarm_findings(node)
    assert piped.returncode == 0, piped.stderr
    banner = [line for line in piped.stderr.splitlines() if line.startswith("ALARM:")]
    assert len(banner) == 1 and f"memory alarm on node {node.name}" in banner[0], piped.stderr
    assert "blocks every publishing connection" in banner[0] and "used, limit" in banner[0]
    (alarm,) = json.loads(as_json.stdout)["alarms"]
    assert alarm["node"] == node.name and alarm["resource"] == "memory"
    assert alarm["mem_used"] > alarm["mem_limit"] > 0
    assert code == 2  # Nagios critical
    (finding,) = findings
    assert finding["severity"] == "critical" and finding["kind"] == "node"
    assert finding["object"] == node.name and "memory alarm" in finding["evidence"]

    with node.disk_alarm():
        poll(lambda: "disk_free_alarm" in node.alarms(), 20)
        code, findings = _alarm_findings(node)
    assert code == 2
    (finding,) = findings
    assert finding["object"] == node.name and "disk alarm" in finding["evidence"]
    assert "free, limit" in finding["evidence"] and "free disk on" in finding["fix"]

    poll(lambda: not node.alarms(), 20)  # cleared: no finding, no banner
    code, findings = _alarm_findings(node)
    assert findings == [] and code in (0, 1)
    assert "ALARM" not in _cli(node, "status").stderr


def test_an_outbox_relay_blocked_by_an_alarm_logs_why_and_publishes_once_it_clears(
    node: AlarmNode, tmp_path: Path
) -> None:
    """The relay waits on confirms while the broker blocks it: it says so with the broker's
    reason instead of looking hung, and every row is published once the alarm clears."""
    import sqlite3

    import rmqkit.outbox

    queue = _queue(node)
    dsn = f"sqlite:///{tmp_path}/app.db"
    rmqkit.outbox.init(dsn)
    conn = sqlite3.connect(tmp_path / "app.db")
    ids = [rmqkit.outbox.add(conn, exchange="", routing_key=queue, body={"n": n}) for n in range(5)]
    conn.commit()
    conn.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RMQKIT_")}
    env.update(RMQKIT_URL=node.url, RMQKIT_MANAGEMENT_URL=node.management_url)
    with node.memory_alarm():
        relay = subprocess.Popen(
            [sys.executable, "-m", "rmqkit", "outbox", "relay", "--dsn", dsn, "--once"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert relay.stderr is not None
        try:
            line = relay.stderr.readline()  # blocks until the relay writes its first line
            assert "outbox relay: broker blocks publishing" in line, line
            assert "low on memory" in line, line
            assert relay.poll() is None  # still waiting, nothing given up
            assert _depth(node, queue) == 0
        except BaseException:
            relay.kill()
            raise
    out, err = relay.communicate(timeout=60)
    assert relay.returncode == 0, err
    assert "published 5" in out
    assert sorted(mid for mid, _ in _drain(node, queue)) == sorted(ids)


def test_a_consumer_the_alarm_blocks_says_so_and_parks_everything_once_it_clears(
    node: AlarmNode, tmp_path: Path
) -> None:
    """Its park publishes (then its acks) wait while the broker blocks the connection: the
    consumer's log says so at once, with the reason and what it holds, and when it ends; then
    every message is parked, none lost, none left in the work queue."""
    env = _env(node, RMQKIT_TEST_LEDGER=str(tmp_path / "ledger.db"))
    topology = str(ROOT / "tests" / "topologies" / "jobs.toml")
    declared = _cli(node, "declare", "-t", topology)
    assert declared.returncode == 0, declared.stderr
    ids = [uuid.uuid4().hex for _ in range(5)]

    async def publish() -> None:
        connection = await aio_pika.connect(node.url)
        async with connection:
            channel = await connection.channel()
            for mid in ids:
                body = json.dumps({"id": mid, "permanent": True}).encode()
                await channel.default_exchange.publish(
                    aio_pika.Message(body, message_id=mid, delivery_mode=2), "jobs.work"
                )

    asyncio.run(publish())
    log = tmp_path / "consumer.log"
    with log.open("w") as out, node.memory_alarm():
        consumer = subprocess.Popen(
            [*CONSUME, "--topology", topology],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
        )
        try:
            assert poll(lambda: "broker blocks this consumer" in log.read_text(), 30), (
                log.read_text()
            )
            text = log.read_text()
            assert "low on memory" in text and "message(s) in hand" in text, text
            assert _depth(node, "jobs.work.parking") == 0  # its park publishes were not read yet
        except BaseException:
            consumer.kill()
            raise
    try:
        assert poll(
            lambda: _depth(node, "jobs.work.parking") == 5 and _depth(node, "jobs.work") == 0, 30
        )
        assert poll(lambda: "broker unblocked this consumer" in log.read_text(), 30)
    finally:
        consumer.terminate()
        assert consumer.wait(30) == 0, log.read_text()
    parked = {mid for mid, _ in _drain(node, "jobs.work.parking")}
    assert parked == set(ids)

"""`rmqkit status` against the real broker: counts on a declared topology with messages in
its work, wait and parking queues and a consumer holding some unacked."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from rmqkit import headers as h
from rmqkit.health.status import read_status_once
from rmqkit.settings import with_vhost
from rmqkit.topology import declare_topology, load_topology
from tests import broker

pytestmark = [pytest.mark.broker, pytest.mark.semantics("4.3")]
ROOT = Path(__file__).resolve().parents[2]
ORDERS = str(ROOT / "topologies" / "orders.toml")
NOW = datetime.now(UTC)


async def _hold(message: aio_pika.abc.AbstractIncomingMessage) -> None:
    """Receive and never ack: the message stays unacked until the connection closes."""


class HeldConsumer(threading.Thread):
    """A consumer of ``queue`` with prefetch ``prefetch`` that never acks, until stopped."""

    def __init__(self, vhost: str, queue: str, prefetch: int) -> None:
        super().__init__(daemon=True)
        self.vhost, self.queue, self.prefetch = vhost, queue, prefetch
        self.ready = threading.Event()
        self.stopping = threading.Event()

    def run(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        conn = await aio_pika.connect(with_vhost(broker.BASE_URL, self.vhost))
        try:
            channel = await conn.channel()
            await channel.set_qos(prefetch_count=self.prefetch)
            queue = await channel.get_queue(self.queue, ensure=False)
            await queue.consume(_hold, no_ack=False)
            self.ready.set()
            await asyncio.to_thread(self.stopping.wait)
        finally:
            await conn.close()  # the held messages go back to the queue

    def __enter__(self) -> HeldConsumer:
        self.start()
        assert self.ready.wait(10)
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        self.join(timeout=10)


def parked_headers(index: int) -> dict[str, Any]:
    hours = 2 if index == 0 else 1
    return {
        h.LAST_FAILED_AT: h.format_timestamp(NOW - timedelta(hours=hours)),
        h.PARK_REASON: "permanent",
        h.ORIGIN_QUEUE: "orders.work",
    }


@pytest.fixture(scope="module")
def populated(vhost: str) -> Iterator[str]:
    """orders.toml declared; 5 orders, 1 message waiting in the 2m tier, 2 parked (aged 2h
    and 1h); a consumer holds 2 of the orders unacked."""
    broker.run(declare_topology(broker.settings_for(vhost), load_topology(ORDERS)))
    broker.publish_with_ids(vhost, "orders", "order.new", [(f"o{i}", b"{}") for i in range(5)])
    broker.publish(vhost, "", "orders.work.wait.2m", [b"{}"])
    parked = [(f"p{i}", b"{}") for i in range(2)]
    broker.publish_with_ids(vhost, "", "orders.work.parking", parked, headers=parked_headers)
    with HeldConsumer(vhost, "orders.work", prefetch=2):
        settings = broker.settings_for(vhost)

        def settled() -> bool:  # management counts lag by up to the stats interval
            report = broker.run(read_status_once(settings))
            rows = {q.name: q for q in report.queues}
            work, parking = rows["orders.work"], rows["orders.work.parking"]
            wait = rows["orders.work.wait.2m"]
            return (work.ready, work.unacked, work.consumers, wait.messages, parking.messages) == (
                3,
                2,
                1,
                1,
                2,
            )

        assert broker.wait_for(settled, timeout_s=20, interval_s=0.5)
        yield vhost


def status_json(vhost: str, *args: str) -> dict[str, Any]:
    result = broker.cli("status", "--json", *args, vhost=vhost)
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def test_status_json_with_the_topology_shows_the_right_counts(populated: str) -> None:
    report = status_json(populated, "--topology", ORDERS, "--parking-age")
    (group,) = report["groups"]
    assert group["work"] == "orders.work"
    assert (group["ready"], group["unacked"], group["consumers"]) == (3, 2, 1)
    assert (group["waiting"], group["wait_queues"], group["parked"]) == (1, 20, 2)
    assert group["parking"] == ["orders.work.parking"]
    # --parking-age browsed the parking queue: the oldest was parked two hours ago.
    # NOW is fixed at import, so allow for the time the suite took to get here.
    elapsed = (datetime.now(UTC) - NOW).total_seconds()
    assert 7200 - 60 < group["parked_oldest_age_s"] < 7200 + elapsed + 60
    rows = {q["name"]: q for q in report["queues"]}
    assert len(rows) == 22 and all(q["exists"] for q in rows.values())
    assert rows["orders.work.wait.2m"]["messages"] == 1
    assert rows["orders.work.wait.2m"]["delay_ms"] == 120_000
    assert rows["orders.work.parking"]["oldest_age_from"] == "browse"
    parking = rows["orders.work.parking"]
    assert (parking["role"], parking["owner"], parking["messages"]) == ("parking", "orders.work", 2)
    # Browsing returned every parked message.
    assert broker.depths(populated, ["orders.work.parking"]) == {"orders.work.parking": 2}


def test_status_without_topology_infers_roles_from_dead_letter_wiring(populated: str) -> None:
    report = status_json(populated)
    roles = {q["name"]: (q["role"], q["owner"]) for q in report["queues"]}
    assert roles["orders.work"] == ("work", "orders.work")
    assert roles["orders.work.wait.1s"] == ("wait", "orders.work")
    assert roles["orders.work.parking"] == ("parking", "orders.work")
    (group,) = report["groups"]
    assert (group["ready"], group["unacked"], group["waiting"], group["parked"]) == (3, 2, 1, 2)
    # Without --parking-age the age is not known (quorum queues keep no head timestamp).
    assert group["parked_oldest_age_s"] is None


def test_status_piped_prints_one_line_per_row_with_wait_slots_collapsed(populated: str) -> None:
    result = broker.cli("status", "--topology", ORDERS, vhost=populated)
    assert result.returncode == 0, result.stderr
    lines = [line.split("\t") for line in result.stdout.splitlines()]
    assert lines[0][:5] == ["queue", "role", "ready", "unacked", "consumers"]
    by_name = {fields[0]: fields for fields in lines[1:]}
    assert by_name["orders.work"][1:5] == ["work", "3", "2", "1"]
    assert by_name["orders.work.wait.2m (+4 slots)"][1:3] == ["wait", "1"]
    assert by_name["orders.work.parking"][1:3] == ["parking", "2"]
    assert len(lines) == 1 + 1 + 4 + 1


def test_status_of_a_topology_not_declared_marks_its_queues(fresh_vhost: Any) -> None:
    report = status_json(fresh_vhost(), "--topology", ORDERS)
    assert report["queues"] and not any(q["exists"] for q in report["queues"])
    assert {q["note"] for q in report["queues"]} == {"not declared"}


@pytest.mark.timing
def test_status_watch_redraws_until_ctrl_c(populated: str) -> None:
    env = broker.cli_env(populated)
    process = subprocess.Popen(
        [sys.executable, "-m", "rmqkit", "status", "--watch", "--json", "--interval", "300ms"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stdout is not None
        readings = [json.loads(process.stdout.readline()) for _ in range(2)]
        assert readings[0]["taken_at"] < readings[1]["taken_at"]
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=10) == 0  # its documented way out, no error
    finally:
        process.kill()
        process.wait()

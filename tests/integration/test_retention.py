"""Retention (issue 15): `retention = "2s"` on a work queue parks the messages that waited longer,
with reason `expired`, counted by id; none is dropped, and a retry coming back from a wait queue
gets a fresh window instead of being expired for the time it spent elsewhere."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import aio_pika
import pytest

from tests import broker

pytestmark = pytest.mark.semantics("4.3")

WORK = "keep.work"
PARKING = "keep.work.parking"
WAIT = "keep.work.wait.1s"
RETENTION_S = 2.0
TOPOLOGY = """
[exchanges.keep]
type = "direct"

[queues."keep.work"]
bind = [{ exchange = "keep", routing_key = "job" }]
retention = "2s"
retry_delays = ["1s"]
jitter_slots = 1
"""


@pytest.fixture
def declared(tmp_path: Path, fresh_vhost: Callable[[], str]) -> tuple[str, Path]:
    vhost = fresh_vhost()
    path = tmp_path / "keep.toml"
    path.write_text(TOPOLOGY)
    result = broker.cli("declare", str(path), vhost=vhost)
    assert result.returncode == 0, result.stdout + result.stderr
    return vhost, path


def _newest_death(headers: dict[str, object]) -> dict[str, object]:
    deaths = headers.get("x-death")
    assert isinstance(deaths, list) and deaths, headers
    newest = deaths[0]
    assert isinstance(newest, dict)
    return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in newest.items()}


def test_plan_states_the_retention(declared: tuple[str, Path]) -> None:
    vhost, path = declared
    result = broker.cli("plan", str(path), vhost=vhost)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "keep.work: retries 1s, max_attempts 5; retention 2s, then parked as expired" in (
        result.stdout
    )
    data = json.loads(broker.cli("plan", str(path), "--json", vhost=vhost).stdout)
    assert data["work_queues"][0]["retention_ms"] == 2000
    policy = broker.api("GET", f"/policies/{broker.q(vhost)}/rmqkit.{WORK}").json()
    assert policy["definition"]["message-ttl"] == 2000


@pytest.mark.timing
def test_expired_messages_are_all_parked_with_reason_expired(declared: tuple[str, Path]) -> None:
    vhost, _ = declared
    count = 200
    ids = [f"keep-{i:04d}" for i in range(count)]
    broker.publish_with_ids(vhost, "keep", "job", [(i, f'{{"i": "{i}"}}'.encode()) for i in ids])
    started = time.monotonic()
    # No consumer: after the retention every message has left the work queue for parking.
    assert broker.wait_for(
        lambda: broker.depths(vhost, [WORK, PARKING]) == {WORK: 0, PARKING: count},
        timeout_s=20,
        interval_s=0.1,
    ), broker.depths(vhost, [WORK, PARKING])
    assert time.monotonic() - started >= RETENTION_S - 0.2  # not before the retention
    assert broker.depths(vhost, [WAIT])[WAIT] == 0

    # `rmqkit parking list` names the reason and the origin of each (read without taking them).
    listed = broker.cli_json_lines("parking", "list", PARKING, "--json", vhost=vhost)
    assert sorted(m["message_id"] for m in listed) == ids
    assert {m["reason"] for m in listed} == {"expired"}
    assert {m["origin_queue"] for m in listed} == {WORK}
    assert all(m["last_failed_at"] for m in listed)  # when it expired: its age shows from it

    parked = broker.drain(vhost, PARKING)
    assert sorted(str(m["message_id"]) for m in parked) == ids  # each exactly once: none lost
    for message in parked:
        death = _newest_death(message["headers"])
        assert death["reason"] == "expired" and death["queue"] == WORK, death


async def _hold_then_retry(vhost: str, hold_s: float) -> None:
    """What a consumer does with a transient failure, after holding the message ``hold_s``:
    publish the copy to the wait queue (confirmed), then ack the original."""
    conn = await aio_pika.connect(broker.with_vhost(broker.BASE_URL, vhost))
    try:
        channel = await conn.channel()
        work = await channel.get_queue(WORK, ensure=False)
        message = await work.get(fail=True, no_ack=False)
        assert message is not None
        await asyncio.sleep(hold_s)  # unacked: held by the consumer, not expiring
        await channel.default_exchange.publish(
            aio_pika.Message(
                message.body,
                message_id=message.message_id,
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            ),
            routing_key=WAIT,
        )
        await message.ack()
    finally:
        await conn.close()


def test_a_retry_coming_back_gets_a_fresh_window(declared: tuple[str, Path]) -> None:
    """The message has existed for longer than the retention when it returns from the wait queue;
    it is not expired at once for that, it gets the whole retention in the work queue again."""
    vhost, _ = declared
    broker.publish_with_ids(vhost, "keep", "job", [("retry-1", b"{}")])
    broker.run(_hold_then_retry(vhost, hold_s=RETENTION_S + 0.5))
    assert broker.wait_for(
        lambda: broker.depths(vhost, [WORK])[WORK] == 1, timeout_s=5, interval_s=0.05
    )
    time.sleep(RETENTION_S / 2)
    # Half the retention after its return it is still waiting for a consumer.
    assert broker.depths(vhost, [WORK, PARKING]) == {WORK: 1, PARKING: 0}
    # And once its own window is over, it is parked as expired, not lost.
    assert broker.wait_for(
        lambda: broker.depths(vhost, [WORK, PARKING]) == {WORK: 0, PARKING: 1}, timeout_s=10
    )
    [parked] = broker.drain(vhost, PARKING)
    assert parked["message_id"] == "retry-1"
    death = _newest_death(parked["headers"])
    assert death["reason"] == "expired" and death["queue"] == WORK

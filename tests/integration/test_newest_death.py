"""A parked message is listed by its newest death (finding 6 of issue 9).

A message rmqkit parked as ``permanent`` is replayed and then dies by the work queue's delivery
limit: the broker dead-letters it back to parking with x-death ``delivery_limit``, and the stale
``rmqkit-park-reason: permanent`` (and error, and last-failed time from before the replay) still
travel with it. It must be listed as ``delivery_limit`` with the new time, and ``--reason
delivery_limit`` / ``--newer-than`` must find it. The same for a retry copy (rmqkit's headers from
a transient failure two hours ago) that then dies by the delivery limit.

On the code of 7cb9a46: the replayed message is listed ``permanent`` with error ``myapp.Bad`` and
its two-hour-old time; ``--reason delivery_limit`` finds only the retry copy, ``--newer-than 10m``
finds nothing.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import aiormq
import pytest
from pamqp import commands as spec

from rmqkit import headers as h
from rmqkit.settings import with_vhost
from tests import broker

pytestmark = pytest.mark.semantics("4.0", "4.3")

WORK = "n.work"
PARKING = "n.work.parking"


async def _declare(vhost: str) -> None:
    conn = await aiormq.connect(with_vhost(broker.BASE_URL, vhost))
    try:
        channel = await conn.channel()
        await channel.queue_declare(
            PARKING,
            durable=True,
            arguments={"x-queue-type": "quorum", **broker.no_delivery_limit()},
        )
        await channel.queue_declare(
            WORK,
            durable=True,
            arguments={
                "x-queue-type": "quorum",
                "x-delivery-limit": 2,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": PARKING,
            },
        )
    finally:
        await conn.close()


async def _reject_until_dead_lettered(vhost: str, queue: str, timeout_s: float = 30.0) -> int:
    """Take every message of ``queue`` and reject it with requeue, until the queue is empty: each
    return counts toward the delivery limit (3.10-4.x; 4.3 no longer counts a nack-requeue)."""
    conn = await aiormq.connect(with_vhost(broker.BASE_URL, vhost))
    rejected = 0
    deadline = time.monotonic() + timeout_s
    try:
        channel = await conn.channel()
        while time.monotonic() < deadline:
            got = await channel.basic_get(queue)
            if isinstance(got.delivery, spec.Basic.GetEmpty):
                declared = await channel.queue_declare(queue, passive=True)
                if declared.message_count == 0:
                    return rejected
                continue
            assert got.delivery_tag is not None
            await channel.basic_reject(got.delivery_tag, requeue=True)
            rejected += 1
        raise AssertionError(f"{queue} still holds messages after {timeout_s} s")
    finally:
        await conn.close()


def _rmqkit_headers(failed_at: datetime, *, parked: bool) -> dict[str, Any]:
    stamp = h.format_timestamp(failed_at)
    headers: dict[str, Any] = {
        h.ORIGIN_QUEUE: WORK,
        h.ORIGINAL_EXCHANGE: "",
        h.ORIGINAL_ROUTING_KEY: WORK,
        h.ERROR_TYPE: "myapp.Bad",
        h.ERROR_MESSAGE: "bad order",
        h.ATTEMPT: 2,
        h.FIRST_FAILED_AT: stamp,
        h.LAST_FAILED_AT: stamp,
    }
    if parked:
        headers[h.PARK_REASON] = "permanent"
    return headers


def _ids(vhost: str, *args: str) -> set[str]:
    return {
        m["message_id"]
        for m in broker.cli_json_lines("parking", "list", PARKING, "--json", *args, vhost=vhost)
    }


def test_a_replayed_message_that_dies_by_the_delivery_limit_is_listed_by_that_death(
    vhost: str,
) -> None:
    broker.run(_declare(vhost))
    two_hours_ago = datetime.now(UTC) - timedelta(hours=2)
    replayed, control, retried = (uuid.uuid4().hex for _ in range(3))
    broker.publish_exact(
        vhost,
        "",
        [
            (PARKING, replayed, b"to replay", _rmqkit_headers(two_hours_ago, parked=True)),
            (PARKING, control, b"stays", _rmqkit_headers(two_hours_ago, parked=True)),
            # a retry copy (no park reason) that comes back to the work queue and crash-loops
            (WORK, retried, b"retry copy", _rmqkit_headers(two_hours_ago, parked=False)),
        ],
    )
    result = broker.cli("parking", "replay", PARKING, "--id", replayed, vhost=vhost)
    assert result.returncode == 0, result.stderr
    assert broker.depths(vhost, [PARKING, WORK]) == {PARKING: 1, WORK: 2}
    replay_done = datetime.now(UTC)

    assert broker.run(_reject_until_dead_lettered(vhost, WORK)) >= 6  # 3 deliveries each
    assert broker.depths(vhost, [PARKING, WORK]) == {PARKING: 3, WORK: 0}

    listed = {
        m["message_id"]: m
        for m in broker.cli_json_lines("parking", "list", PARKING, "--json", vhost=vhost)
    }
    # what the broker holds: the stale park reason and x-death's newer delivery_limit, together
    raw = listed[replayed]["headers"]
    assert raw[h.PARK_REASON] == "permanent" and raw["x-death"][0]["reason"] == "delivery_limit"
    assert raw[h.REPLAY_COUNT] == 1
    for message_id in (replayed, retried):
        record = listed[message_id]
        assert record["reason"] == "delivery_limit", record
        assert record["origin_queue"] == WORK
        assert record["error_type"] is None and record["error_message"] is None
        last = h.parse_timestamp(record["last_failed_at"])
        assert last is not None and last > two_hours_ago + timedelta(hours=1), record
        assert last <= datetime.now(UTC)
    assert h.parse_timestamp(listed[replayed]["last_failed_at"]) >= replay_done - timedelta(
        seconds=1
    )
    assert listed[control]["reason"] == "permanent"
    assert listed[control]["error_type"] == "myapp.Bad"

    assert _ids(vhost, "--reason", "delivery_limit") == {replayed, retried}
    assert _ids(vhost, "--newer-than", "10m") == {replayed, retried}
    assert _ids(vhost, "--reason", "permanent") == {control}
    assert _ids(vhost, "--older-than", "1h") == {control}
    assert _ids(vhost, "--error-type", "myapp.*") == {control}
    assert broker.depths(vhost, [PARKING]) == {PARKING: 3}  # listing changed nothing

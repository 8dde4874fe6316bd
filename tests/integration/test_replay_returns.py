"""Replay to a target that returns some copies: every returned copy stays parked.

aiormq matches a returned message to its publish by ``message_id``. Parked messages need not
have one (a publisher that never set it) and need not be unique (a publisher that sent the same
id twice), so a replay must not rely on it: a copy matched wrongly is counted confirmed, its
original acked, and the message is gone from both places.
"""

from __future__ import annotations

import asyncio
import uuid

import aiormq
import pytest
from pamqp import commands as spec

from rmqkit.parking.model import ParkedFilter
from rmqkit.parking.replay import replay_parked
from rmqkit.settings import with_vhost
from tests import broker

pytestmark = pytest.mark.semantics("4.0", "4.3")

PARKING = "r.work.parking"


async def _bodies(vhost: str, queue: str) -> list[bytes]:
    conn = await aiormq.connect(with_vhost(broker.BASE_URL, vhost))
    out: list[bytes] = []
    try:
        channel = await conn.channel()
        while True:
            got = await channel.basic_get(queue, no_ack=True)
            if isinstance(got.delivery, spec.Basic.GetEmpty):
                return out
            out.append(got.body)
    finally:
        await conn.close()


def test_returned_copies_stay_parked_with_shared_and_missing_ids(vhost: str) -> None:
    async def declare() -> None:
        conn = await aiormq.connect(with_vhost(broker.BASE_URL, vhost))
        channel = await conn.channel()
        await channel.queue_declare("r.present", durable=True)
        await channel.queue_declare(
            PARKING,
            durable=True,
            arguments={"x-queue-type": "quorum", **broker.no_delivery_limit()},
        )
        await conn.close()

    broker.run(declare())
    shared = uuid.uuid4().hex
    # Interleaved: routable and unroutable copies with the same id, and id-less ones, parked
    # with the headers the consumer writes.
    broker.publish_exact(
        vhost,
        "",
        [
            (
                PARKING,
                shared if i % 4 < 2 else None,
                f"m{i}".encode(),
                {
                    "rmqkit-origin-queue": "r.present" if i % 2 == 0 else "r.gone",
                    "rmqkit-reason": "permanent",
                },
            )
            for i in range(200)
        ],
    )

    async def scenario() -> None:
        report = await replay_parked(broker.settings_for(vhost), PARKING, ParkedFilter())
        assert report.selected == 200
        assert report.moved == 100 and report.returned == 100, report.as_dict("replayed")
        delivered = sorted(await _bodies(vhost, "r.present"))
        parked = sorted(await _bodies(vhost, PARKING))
        assert delivered == sorted(f"m{i}".encode() for i in range(0, 200, 2))
        assert parked == sorted(f"m{i}".encode() for i in range(1, 200, 2))

    asyncio.run(scenario())

"""A delayed message (rmqkit.delay's ladder) through `rmqkit consume`, on the real broker.

The broker delivers a message that left the ladder with the exchange of its last stage
(``….after-NN``) as the delivery's exchange. The consumer shows the handler the exchange the
producer asked for (``Message.exchange``) and records that one as
``rmqkit-original-exchange`` in retry and park copies, so a replay goes where it was meant to
(rmqkit.delay.delivered_route).
"""

from __future__ import annotations

import json
from pathlib import Path

from rmqkit import headers as h
from rmqkit.broker.session import session
from rmqkit.delay import Ladder, declare_ladder
from tests import broker
from tests.consumer_harness import ConsumerProcess, wait_until
from tests.flow_handlers import read_rows

PARKING = "jobs.work.parking"


def test_a_delayed_message_keeps_the_producers_exchange_in_the_handler_and_its_copies(
    jobs_vhost: str, tmp_path: Path
) -> None:
    ladder = Ladder(prefix="d", unit_ms=50, bits=3)

    async def declare() -> None:
        async with session(broker.settings_for(jobs_vhost)) as s:
            await declare_ladder(s, ladder, targets=[("jobs", "")])

    broker.run(declare())
    plan = ladder.plan(120, "jobs", "job", {"app": "x"})
    assert plan.exchange != "jobs" and plan.hops >= 1
    ledger = tmp_path / "ledger.db"
    body = json.dumps({"id": "late-1", "permanent": True}).encode()
    consumer = ConsumerProcess(jobs_vhost, ledger, handler="tests.flow_handlers:seen")
    try:
        broker.publish_with_ids(
            jobs_vhost, plan.exchange, plan.routing_key, [("late-1", body)], lambda _: plan.headers
        )
        assert wait_until(lambda: broker.depths(jobs_vhost, [PARKING])[PARKING] == 1, 20), (
            consumer.output()
        )
    finally:
        consumer.stop()
    [row] = read_rows(f"{ledger}.jsonl")
    assert row["exchange"] == "jobs"
    [parked] = broker.drain(jobs_vhost, PARKING)
    assert parked["headers"][h.PARK_REASON] == "permanent"
    assert parked["headers"][h.ORIGINAL_EXCHANGE] == "jobs"
    assert parked["headers"][h.ORIGINAL_ROUTING_KEY] == "job"
    assert parked["headers"][h.DELAY_EXCHANGE] == "jobs"  # the ladder's own trail stays

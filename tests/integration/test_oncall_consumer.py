"""The consumer's log tells the on-call engineer why (issue 14): every retry and park line
carries the error's type and message, so nobody has to open the message to see the cause."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

from tests import broker
from tests.consumer_harness import ConsumerProcess, effects, wait_until
from tests.handlers import body

PARKING = "jobs.work.parking"


def test_retry_and_park_lines_name_the_error_type_and_message(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    transient, permanent = uuid.uuid4().hex, uuid.uuid4().hex
    broker.publish_with_ids(
        jobs_vhost,
        "jobs",
        "job",
        [(transient, body(id=transient, fail=1)), (permanent, body(id=permanent, permanent=True))],
    )
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(jobs_vhost, ledger)
    consumers.append(consumer)
    assert wait_until(lambda: transient in effects(ledger), timeout_s=30), consumer.output()
    assert wait_until(lambda: broker.depths(jobs_vhost, [PARKING])[PARKING] == 1, timeout_s=20)
    assert consumer.stop() == 0, consumer.output()
    log = consumer.output()

    retry = [line for line in log.splitlines() if "retry via" in line and transient in line]
    assert len(retry) == 1, log[-3000:]
    assert re.search(
        r"retry via jobs\.work\.wait\S*: ConnectionError: downstream timed out on attempt 1",
        retry[0],
    ), retry[0]
    parked = [line for line in log.splitlines() if "parked in" in line and permanent in line]
    assert len(parked) == 1, log[-3000:]
    assert (
        f"parked in {PARKING}: permanent (rmqkit.consumer.message.Permanent: "
        f"job {permanent} is invalid)" in parked[0]
    ), parked[0]
    # the broker holds what the log says: the parked copy is the permanent one
    held = broker.drain(jobs_vhost, PARKING)
    assert [m["message_id"] for m in held] == [permanent]

"""retry_engine = "broker" on the real broker. On 4.3: `declare` gives the work queue the
delayed retry and no wait queues; the embedded consumer puts a failing message back with a
reject, the broker holds it for the tier's delay (never less), a message that succeeds on its
third attempt is handled exactly three times, one that always fails is parked `exhausted` after
max_attempts; every queue ends empty but parking. Before 4.3, `plan` and `declare` refuse the
file with the fix (the setting would be ignored and every retry come back at once)."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest

import rmqkit
from rmqkit import headers as h
from tests import broker
from tests.consumer_harness import ConsumerProcess, effects, wait_until

pytestmark = pytest.mark.semantics("4.3", "4.0")

TOPOLOGY = """
[exchanges."re"]
type = "direct"

[queues."re.work"]
bind = [{ exchange = "re", routing_key = "job" }]
retry_engine = "broker"
retry_delays = ["400ms", "800ms"]
max_attempts = 3
"""
WORK, PARKING = "re.work", "re.work.parking"


def _on_43() -> bool:
    return broker.version() >= (4, 3)


@pytest.fixture
def spec(vhost: str, tmp_path: Path) -> Path:
    path = tmp_path / "re.toml"
    path.write_text(TOPOLOGY, encoding="utf-8")
    return path


def test_before_4_3_plan_and_declare_refuse_with_the_fix(vhost: str, spec: Path) -> None:
    if _on_43():
        pytest.skip("4.3 has the delayed retry")
    planned = broker.cli("plan", str(spec), vhost=vhost)
    assert planned.returncode == 65, planned.stdout + planned.stderr
    assert 'retry_engine = "broker" needs RabbitMQ 4.3' in planned.stdout + planned.stderr
    declared = broker.cli("declare", str(spec), vhost=vhost)
    assert declared.returncode == 65, declared.stdout + declared.stderr
    assert WORK not in broker.queue_names(vhost)


@pytest.mark.timing
def test_the_broker_holds_each_retry_and_rmqkit_parks_the_exhausted(vhost: str, spec: Path) -> None:
    if not _on_43():
        pytest.skip("the delayed retry is RabbitMQ 4.3's")
    declared = broker.cli("declare", str(spec), vhost=vhost, timeout=120)
    assert declared.returncode == 0, declared.stdout + declared.stderr
    names = broker.queue_names(vhost)
    assert {WORK, PARKING} <= names and not any(".wait." in n for n in names), names

    seen: dict[str, list[tuple[float, int]]] = defaultdict(list)

    async def handle(message: rmqkit.Message) -> None:
        seen[str(message.message_id)].append((time.monotonic(), message.attempt))
        job = message.json()
        if job["kind"] == "poison" or message.attempt < 3:
            raise ConnectionError("downstream is down")

    flaky = [uuid.uuid4().hex for _ in range(10)]
    poison = [uuid.uuid4().hex for _ in range(5)]
    bodies = [(m, json.dumps({"kind": "flaky"}).encode()) for m in flaky]
    bodies += [(m, json.dumps({"kind": "poison"}).encode()) for m in poison]

    async def main() -> None:
        settings = broker.settings_for(vhost)
        consumer = rmqkit.Consumer(handle, queue=WORK, topology=spec, settings=settings)
        await consumer.start()
        try:
            await asyncio.to_thread(broker.publish_with_ids, vhost, "re", "job", bodies)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                depths = await asyncio.to_thread(broker.depths, vhost, [WORK, PARKING])
                if depths[PARKING] == len(poison) and all(len(seen[m]) == 3 for m in flaky):
                    break
                await asyncio.sleep(0.1)
        finally:
            await consumer.stop(grace_s=5)

    broker.run(main())
    for message_id in flaky + poison:
        deliveries = seen[message_id]
        assert [a for _, a in deliveries] == [1, 2, 3], (message_id, deliveries)
        gaps = [b - a for (a, _), (b, _) in itertools.pairwise(deliveries)]
        assert gaps[0] >= 0.39 and gaps[1] >= 0.79, gaps  # never early
    assert broker.depths(vhost, [WORK, PARKING]) == {WORK: 0, PARKING: len(poison)}
    parked = broker.drain(vhost, PARKING)
    assert sorted(str(m["message_id"]) for m in parked) == sorted(poison)
    for message in parked:
        assert message["headers"][h.PARK_REASON] == "exhausted"
        assert message["headers"][h.ATTEMPT] == 3
        assert message["headers"][h.ERROR_TYPE] == "ConnectionError"


def test_kill_9_mid_run_loses_nothing_the_broker_holds(
    vhost: str, spec: Path, tmp_path: Path
) -> None:
    """`rmqkit consume` on a broker-retry queue, killed with -9 while messages wait in the
    broker's delay and others are in its hands; a new consumer finishes them: every message
    took effect, or is parked exhausted with its reason; nothing is left in the work queue."""
    if not _on_43():
        pytest.skip("the delayed retry is RabbitMQ 4.3's")
    declared = broker.cli("declare", str(spec), vhost=vhost, timeout=120)
    assert declared.returncode == 0, declared.stdout + declared.stderr
    ids = [f"k-{i}" for i in range(300)]
    bodies = [(i, json.dumps({"id": i, "fail": 1, "sleep": 0.01}).encode()) for i in ids]
    broker.publish_with_ids(vhost, "re", "job", bodies)
    ledger = tmp_path / "ledger.db"
    first = ConsumerProcess(vhost, ledger, "--concurrency", "20", queue=WORK, topology=str(spec))
    try:
        assert wait_until(lambda: len(effects(ledger)) >= 60, 60), first.output()
    finally:
        first.kill()  # -9: mid-batch, with retries held by the broker
    second = ConsumerProcess(vhost, ledger, "--concurrency", "20", queue=WORK, topology=str(spec))
    try:

        def settled() -> bool:
            parked = broker.depths(vhost, [PARKING])[PARKING] or 0
            return len(effects(ledger)) + parked >= len(ids)

        # up before it may be stopped (a SIGTERM during its imports is not a graceful stop)
        started = wait_until(lambda: f"consuming {WORK}" in second.output(), 60)
        finished = started and wait_until(settled, 120)
    finally:
        code = second.stop(timeout=60)
    assert finished, second.output()
    assert code == 0, (code, second.output())
    done = set(effects(ledger))
    parked = {str(m["message_id"]): m["headers"] for m in broker.drain(vhost, PARKING)}
    assert done | set(parked) == set(ids)  # every message accounted for
    assert not done & set(parked)
    for headers in parked.values():  # a return at the kill counts: parked, with its reason
        assert headers[h.PARK_REASON] == "exhausted"
    assert broker.depths(vhost, [WORK]) == {WORK: 0}

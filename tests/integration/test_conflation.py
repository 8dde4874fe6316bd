"""`rmqkit consume --conflate-key-header K` on the real broker (issue 15, seed 001 §5): a burst of
updates for a few keys is handled as the newest per key, the superseded ones are acked unhandled,
logged and counted, and nothing is lost or parked."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import httpx

from tests import broker
from tests.consumer_harness import ConsumerProcess, events, wait_until
from tests.handlers import body
from tests.ports import free_port

WORK, PARKING = "jobs.work", "jobs.work.parking"
KEYS, VERSIONS = 10, 10


def test_a_burst_of_100_updates_for_10_keys_handles_about_the_newest_per_key(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    updates = [(f"k{k}-v{v}", k, v) for v in range(VERSIONS) for k in range(KEYS)]  # in order
    broker.publish_with_ids(
        jobs_vhost,
        "jobs",
        "job",
        # The first version of each key runs for 1 s: the rest of the burst arrives while it
        # runs (however loaded the machine), so what is handled does not depend on how fast
        # deliveries come in compared with a short handler.
        [(mid, body(id=mid, sleep=1.0 if v == 0 else 0.05)) for mid, _, v in updates],
        headers=lambda i: {"entity": f"k{updates[i][1]}"},
    )
    plain = [f"plain-{i}" for i in range(5)]  # no key header: each handled as usual
    broker.publish_with_ids(jobs_vhost, "jobs", "job", [(m, body(id=m)) for m in plain])
    assert broker.depths(jobs_vhost, [WORK])[WORK] == 105

    ledger, port = tmp_path / "ledger.db", free_port()
    consumer = ConsumerProcess(
        jobs_vhost,
        ledger,
        "--conflate-key-header",
        "entity",
        "--prefetch",
        "200",
        "--metrics-port",
        str(port),
    )
    consumers.append(consumer)
    newest = {f"k{k}-v{VERSIONS - 1}" for k in range(KEYS)}

    def handled() -> set[str]:
        return {m for m, _, kind, _ in events(ledger) if kind == "effect"}

    assert wait_until(lambda: handled() >= newest | set(plain), timeout_s=30), consumer.output()
    assert wait_until(
        lambda: broker.depths(jobs_vhost, [WORK, PARKING]) == {WORK: 0, PARKING: 0},
        timeout_s=15,
    )
    assert wait_until(
        lambda: (broker.mgmt_queue(jobs_vhost, WORK) or {}).get("messages_unacknowledged") == 0,
        timeout_s=15,
    )
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert consumer.stop() == 0, consumer.output()

    effects_by_key: dict[int, list[int]] = defaultdict(list)
    for mid, _, kind, _ in sorted(events(ledger), key=lambda e: e[3]):
        if kind == "effect" and mid.startswith("k"):
            key, version = re.fullmatch(r"k(\d+)-v(\d+)", mid).groups()  # type: ignore[union-attr]
            effects_by_key[int(key)].append(int(version))
    assert set(effects_by_key) == set(range(KEYS))
    for key, versions in effects_by_key.items():
        assert len(versions) <= 3, (
            key,
            versions,
        )  # the one running when the burst came, the newest
        assert versions[-1] == VERSIONS - 1, (key, versions)  # the newest always, and last
        assert versions == sorted(versions), (key, versions)  # never two of a key out of order
    handled_keyed = sum(len(v) for v in effects_by_key.values())
    superseded = KEYS * VERSIONS - handled_keyed
    assert handled_keyed <= 2 * KEYS + 5, effects_by_key

    # every message acked: handled or superseded, each exactly once, the log and metrics agree
    assert handled() >= set(plain)
    log = consumer.output()
    assert log.count("superseded: a newer message with entity=") == superseded, log[-3000:]
    (line,) = [m for m in metrics.splitlines() if m.startswith("rmqkit_consumer_superseded_total")]
    assert float(line.split()[-1]) == superseded, line
    assert broker.depths(jobs_vhost, broker.queue_names(jobs_vhost)) == dict.fromkeys(
        broker.queue_names(jobs_vhost), 0
    )


def test_byte_array_keys_that_are_not_utf8_are_distinct_keys(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    """Java clients send a ``byte[]`` key as an AMQP byte array. Two keys that differ only in a
    byte that is not UTF-8 are two keys: a newer message of one never supersedes the other's.
    (Decoded with replacement characters, b"\\xff\\x01" and b"\\xfe\\x01" were one key, and b-1
    was acked unhandled as superseded by b-2.)"""
    messages = [("a-1", b"\xff\x01", 1.5), ("b-1", b"\xfe\x01", 0.5), ("b-2", b"\xfe\x01", 0)]
    broker.publish_with_ids(
        jobs_vhost,
        "jobs",
        "job",
        [(mid, body(id=mid, sleep=sleep)) for mid, _, sleep in messages],
        headers=lambda i: {"entity": bytearray(messages[i][1])},  # sent as a byte array
    )
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(jobs_vhost, ledger, "--conflate-key-header", "entity")
    consumers.append(consumer)

    def handled() -> set[str]:
        return {m for m, _, kind, _ in events(ledger) if kind == "effect"}

    assert wait_until(lambda: handled() == {"a-1", "b-1", "b-2"}, timeout_s=30), (
        handled(),
        consumer.output()[-2000:],
    )
    assert consumer.stop() == 0, consumer.output()
    assert "superseded" not in consumer.output()
    assert broker.depths(jobs_vhost, [WORK, PARKING]) == {WORK: 0, PARKING: 0}

"""Lanes, partitions, single active consumer and the default delay on the real broker
(issue 15): what `rmqkit declare topologies/flow.toml` leaves on it, read back through the
management API; idempotence; what `plan` says; 1,000 keys spread over the partitions, none lost;
a message rejected from a lane or a partition parks in its work queue's parking queue; a delayed
message leaves the ladder through the exit declare made.

Runs on whichever node the suite points at (3.10 by default; the 4.3 node with
``eval "$(scripts/broker-up --version 4.3 --env)"`` in the environment)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import aio_pika
import pytest

from rmqkit.delay import Ladder
from tests import broker

pytestmark = pytest.mark.semantics("4.3")

# topologies/flow.toml with one retry tier and one wait queue per tier (fewer quorum queues for
# a 2-core CI machine; the shape is the same).
FLOW_TEXT = (
    (Path(__file__).resolve().parents[2] / "topologies" / "flow.toml")
    .read_text(encoding="utf-8")
    .replace('retry_delays = ["1s", "10s"]', 'retry_delays = ["1s"]\njitter_slots = 1')
)
PARTS = [f"accounts.work.p{i}" for i in range(4)]
LANE = "media.work.lane.large"


@pytest.fixture(scope="module")
def flow_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("flow") / "flow.toml"
    path.write_text(FLOW_TEXT, encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def declared(flow_file: str) -> Iterator[str]:
    vhost = broker.create_vhost("flow")
    try:
        result = broker.cli("declare", flow_file, vhost=vhost, timeout=120)
        assert result.returncode == 0, result.stderr
        yield vhost
    finally:
        broker.delete_vhost(vhost)


def _get(path: str) -> Any:
    response = broker.api("GET", path)
    response.raise_for_status()
    return response.json()


def _effective(vhost: str, name: str) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        queue = broker.mgmt_queue(vhost, name)
        if queue and queue.get("policy") == f"rmqkit.{name}":
            return dict(queue.get("effective_policy_definition") or {})
        return None

    found = broker.wait_for(ready)
    assert found, f"policy never took effect on {name}"
    return found


def test_the_broker_holds_lanes_partitions_sac_and_the_ladder(declared: str) -> None:
    vhost = declared
    names = broker.queue_names(vhost)
    assert "accounts.work" not in names  # partitioned: the parent is no queue
    assert {"media.work", LANE, "media.work.lane.bulk", *PARTS, "ledger.work"} <= names
    assert {f"{LANE}.wait.1s", "accounts.work.p3.wait.1s", "ledger.work.wait.5s"} <= names
    assert set(Ladder().queue_names) <= names

    for name in PARTS:
        queue = broker.mgmt_queue(vhost, name)
        assert queue is not None and queue["type"] == "quorum"
        assert queue["arguments"] == {"x-queue-type": "quorum", "x-single-active-consumer": True}
        assert _effective(vhost, name)["dead-letter-routing-key"] == "accounts.work.parking"
        assert _effective(vhost, f"{name}.wait.1s")["dead-letter-routing-key"] == name
    ledger = broker.mgmt_queue(vhost, "ledger.work")
    assert ledger is not None and ledger["arguments"]["x-single-active-consumer"] is True
    lane = broker.mgmt_queue(vhost, LANE)
    assert lane is not None and "x-single-active-consumer" not in lane["arguments"]
    assert _effective(vhost, LANE)["dead-letter-routing-key"] == "media.work.parking"
    assert _effective(vhost, f"{LANE}.wait.1s")["dead-letter-routing-key"] == LANE
    assert "media.work.lane.large.parking" not in names  # one parking queue per work queue

    hashing = _get(f"/exchanges/{broker.q(vhost)}/accounts.work.partition")
    assert hashing["type"] == "x-consistent-hash"
    assert hashing["arguments"] == {"hash-header": "account_id"}
    bindings = _get(f"/bindings/{broker.q(vhost)}")
    weights = sorted(
        (b["destination"], b["routing_key"])
        for b in bindings
        if b["source"] == "accounts.work.partition"
    )
    assert weights == [(name, "1") for name in PARTS]
    e2e = [b for b in bindings if b["source"] == "accounts"]
    assert [(b["destination"], b["destination_type"], b["routing_key"]) for b in e2e] == [
        ("accounts.work.partition", "exchange", "account.updated")
    ]
    # lanes are not bound to the parent's exchange: only rmqkit publishers choose a lane
    assert [b["destination"] for b in bindings if b["source"] == "media"] == ["media.work"]
    ladder = Ladder()
    exits = [b for b in bindings if b["source"] == ladder.out and b["destination"] == "ledger.work"]
    assert len(exits) == 1 and exits[0]["arguments"]["rmqkit-delay-routing-key"] == "ledger.work"
    rung = broker.mgmt_queue(vhost, ladder.queue_name(0))
    assert rung is not None and rung["arguments"] == ladder.queue_arguments(0)
    assert rung.get("policy") in (None, "")


def test_second_declare_changes_nothing_and_plan_states_the_flow(
    declared: str, flow_file: str
) -> None:
    again = broker.cli("declare", flow_file, vhost=declared, timeout=120)
    assert again.returncode == 0, again.stderr
    assert "No changes" in again.stdout, again.stdout
    plan = broker.cli("plan", flow_file, vhost=declared, timeout=120)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    out = plan.stdout
    assert (
        "lanes media.work.lane.large (body over 262144 bytes), media.work.lane.bulk "
        "(x-lane=bulk), else media.work" in out
    )
    assert (
        "4 partitions accounts.work.p0…accounts.work.p3 by header account_id through "
        "accounts.work.partition (x-consistent-hash; one active consumer each)" in out
    )
    assert "ledger.work: retries 5s, max_attempts 5" in out
    assert "single active consumer; default delay 30s (delay ladder)" in out
    assert "delay ladder rmqkit.delay.100ms: 20 rungs, exits to queue ledger.work" in out
    assert "no changes;" in out and "orphan" not in out


def test_1000_keys_spread_over_the_partitions_none_lost(declared: str) -> None:
    vhost = declared
    before = broker.depths(vhost, PARTS)
    messages = [(uuid.uuid4().hex, b"{}") for _ in range(1000)]
    broker.publish_with_ids(
        vhost,
        "accounts",
        "account.updated",
        messages,
        headers=lambda i: {"account_id": f"acct-{i}"},
    )
    after = broker.depths(vhost, PARTS)
    spread = {name: int(after[name] or 0) - int(before[name] or 0) for name in PARTS}
    assert sum(spread.values()) == 1000, spread
    assert all(count > 0 for count in spread.values()), spread
    # the same key always lands in the same partition
    broker.publish_with_ids(
        vhost, "accounts", "account.updated", messages[:20], headers=lambda i: {"account_id": "x"}
    )
    again = broker.depths(vhost, PARTS)
    grew = [name for name in PARTS if (again[name] or 0) > (after[name] or 0)]
    assert len(grew) == 1 and (again[grew[0]] or 0) - (after[grew[0]] or 0) == 20
    for name in PARTS:
        _purge(vhost, name)


def _purge(vhost: str, queue: str) -> None:
    # basic.get is refused on a single-active-consumer quorum queue (RESOURCE_LOCKED, seen on
    # 3.10.8), so no broker.drain here
    broker.api("DELETE", f"/queues/{broker.q(vhost)}/{broker.q(queue)}/contents")


async def _reject_one_consumed(vhost: str, queue: str) -> None:
    """basic.reject(requeue=False) one message, taken by basic.consume (see _purge)."""
    conn = await aio_pika.connect(broker.with_vhost(broker.BASE_URL, vhost))
    try:
        channel = await conn.channel()
        await channel.set_qos(prefetch_count=1)
        source = await channel.get_queue(queue, ensure=False)
        async with source.iterator() as messages:
            async for message in messages:
                await message.reject(requeue=False)
                break
    finally:
        await conn.close()


async def _x_death_queue(vhost: str, parking: str) -> list[str]:
    conn = await aio_pika.connect(broker.with_vhost(broker.BASE_URL, vhost))
    try:
        channel = await conn.channel()
        queue = await channel.get_queue(parking, ensure=False)
        seen: list[str] = []
        while (message := await queue.get(fail=False, no_ack=True)) is not None:
            deaths: Any = (message.headers or {}).get("x-death") or []
            seen.append(str(deaths[0]["queue"]) if deaths else "")
        return seen
    finally:
        await conn.close()


def test_rejected_from_a_lane_or_partition_parks_in_the_parents_parking(declared: str) -> None:
    vhost = declared
    broker.publish(vhost, "", LANE, [b"big job"])  # as an rmqkit publisher sends a lane message
    assert broker.reject_one(vhost, LANE)
    broker.publish(vhost, "accounts", "account.updated", [b"u"], {"account_id": "acct-7"})
    part = next(name for name, n in broker.depths(vhost, PARTS).items() if n)
    broker.run(asyncio.wait_for(_reject_one_consumed(vhost, part), 10))

    def parked() -> bool:
        depths = broker.depths(vhost, ["media.work.parking", "accounts.work.parking"])
        return depths == {"media.work.parking": 1, "accounts.work.parking": 1}

    assert broker.wait_for(parked, timeout_s=10), broker.depths(
        vhost, ["media.work.parking", "accounts.work.parking", LANE, part]
    )
    # the origin queue tells which lane or partition a parked message came from
    assert broker.run(_x_death_queue(vhost, "media.work.parking")) == [LANE]
    assert broker.run(_x_death_queue(vhost, "accounts.work.parking")) == [part]


@pytest.mark.timing
def test_a_delayed_message_leaves_the_ladder_by_the_exit_declare_made(declared: str) -> None:
    vhost = declared
    plan = Ladder().plan(300, "", "ledger.work", {"k": "v"})
    started = time.monotonic()
    broker.publish(vhost, plan.exchange, plan.routing_key, [b"later"], plan.headers)
    assert broker.depths(vhost, ["ledger.work"]) == {"ledger.work": 0}
    arrived = broker.wait_for(
        lambda: broker.depths(vhost, ["ledger.work"])["ledger.work"] == 1,
        timeout_s=10,
        interval_s=0.05,
    )
    waited = time.monotonic() - started
    assert arrived and waited >= 0.3, waited
    _purge(vhost, "ledger.work")


@pytest.mark.parametrize("via", ["policy", "arguments"])
def test_declare_without_the_plugin_is_one_line_and_changes_nothing(
    via: Literal["policy", "arguments"], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker without the consistent-hash plugin, played by an exchange type no broker has:
    with the management API `plan` sees the type is missing (a conflict); without it
    (`--via arguments`) the broker refuses the exchange, declared before anything else."""
    from rmqkit.errors import TopologyConflict
    from rmqkit.settings import load_settings, with_vhost
    from rmqkit.topology import declare_topology, parse_topology
    from rmqkit.topology import partitions as partitions_module
    from rmqkit.topology import plan as plan_module

    monkeypatch.setattr(partitions_module, "CONSISTENT_HASH", "x-rmqkit-missing")
    monkeypatch.setitem(plan_module.PLUGINS, "x-rmqkit-missing", "rabbitmq_missing_plugin")
    topology = parse_topology(
        '[exchanges.accounts]\n[queues."a.work"]\n'
        'bind = [{ exchange = "accounts", routing_key = "k" }]\n'
        'partitions = 2\npartition_key = "account_id"\nretry_delays = []\n',
        "nohash.toml",
    )
    vhost = broker.create_vhost("nohash")
    try:
        management = broker.MGMT if via == "policy" else "http://127.0.0.1:9"  # none for blind
        settings = load_settings(url=with_vhost(broker.BASE_URL, vhost), management_url=management)
        with pytest.raises(TopologyConflict) as info:
            broker.run(declare_topology(settings, topology, via=via))
        message = str(info.value)
        assert "\n" not in message
        assert "exchange 'a.work.partition'" in message and "x-rmqkit-missing" in message
        assert "rabbitmq-plugins enable rabbitmq_missing_plugin" in message
        assert broker.queue_names(vhost) == set()
        names = {e["name"] for e in _get(f"/exchanges/{broker.q(vhost)}")}
        assert "accounts" not in names and "a.work.partition" not in names
    finally:
        broker.delete_vhost(vhost)

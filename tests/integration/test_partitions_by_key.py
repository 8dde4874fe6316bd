"""Partitions by the routing key (``partition_by = "routing_key"``) on the real broker: on 4.3
the built-in x-modulus-hash exchange (no plugin), on 3.10 and 4.0 the plugin's consistent hash
of the routing key. 1,000 keys spread over 4 partitions with none lost and one key always in
one partition; `plan` names the exchange type; a message parked from a partition and replayed
goes back to that partition; on 4.3 an exchange left by an older broker (the consistent hash)
is kept, not a conflict, and still routes every message."""

from __future__ import annotations

import uuid
from pathlib import Path

import aio_pika
import pytest

from tests import broker

pytestmark = pytest.mark.semantics("4.3", "4.0")

TOPOLOGY = """
[exchanges."pk.accounts"]
type = "topic"

[queues."{work}"]
partitions = 4
partition_by = "routing_key"
bind = [{{ exchange = "pk.accounts", routing_key = "account.#" }}]
retry_delays = []
max_attempts = 1
"""


def _modulus() -> bool:
    """x-modulus-hash is built in from RabbitMQ 4.3."""
    return broker.version() >= (4, 3)


def _file(tmp_path: Path, work: str) -> str:
    path = tmp_path / f"{work}.toml"
    path.write_text(TOPOLOGY.format(work=work), encoding="utf-8")
    return str(path)


def _parts(work: str) -> list[str]:
    return [f"{work}.p{i}" for i in range(4)]


def _exchange(vhost: str, name: str) -> dict[str, object]:
    response = broker.api("GET", f"/exchanges/{broker.q(vhost)}/{broker.q(name)}")
    response.raise_for_status()
    found: dict[str, object] = response.json()
    return found


def _spread(vhost: str, work: str) -> dict[str, int]:
    messages = [(uuid.uuid4().hex, b"{}") for _ in range(1000)]
    broker.publish_with_ids(vhost, "pk.accounts", "", messages, routing=lambda i: f"account.{i}")
    depths = broker.depths(vhost, _parts(work))
    return {name: int(depths[name] or 0) for name in _parts(work)}


def test_keys_spread_over_the_partitions_none_lost(vhost: str, tmp_path: Path) -> None:
    work = "pk.work"
    declared = broker.cli("declare", _file(tmp_path, work), vhost=vhost, timeout=120)
    assert declared.returncode == 0, declared.stderr
    hashing = _exchange(vhost, f"{work}.partition")
    assert hashing["type"] == ("x-modulus-hash" if _modulus() else "x-consistent-hash")
    assert not hashing.get("arguments")
    spread = _spread(vhost, work)
    assert sum(spread.values()) == 1000, spread
    assert all(count > 0 for count in spread.values()), spread
    # one key, one partition
    same = [(uuid.uuid4().hex, b"{}") for _ in range(20)]
    broker.publish_with_ids(vhost, "pk.accounts", "account.same", same)
    after = broker.depths(vhost, _parts(work))
    grew = {n: int(after[n] or 0) - spread[n] for n in _parts(work) if after[n] != spread[n]}
    assert list(grew.values()) == [20], grew
    planned = broker.cli("plan", _file(tmp_path, work), vhost=vhost)
    assert planned.returncode == 0, planned.stdout + planned.stderr
    kind = "x-modulus-hash" if _modulus() else "x-consistent-hash"
    assert f"by the routing key through {work}.partition ({kind};" in planned.stdout
    for name in _parts(work):
        broker.api("DELETE", f"/queues/{broker.q(vhost)}/{broker.q(name)}/contents")


async def _reject_one(vhost: str, queue: str) -> None:
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


def test_a_parked_message_replayed_goes_back_to_its_partition(vhost: str, tmp_path: Path) -> None:
    work = "pk.replay"
    declared = broker.cli("declare", _file(tmp_path, work), vhost=vhost, timeout=120)
    assert declared.returncode == 0, declared.stderr
    broker.publish_with_ids(vhost, "pk.accounts", "account.77", [(uuid.uuid4().hex, b"{}")])
    [home] = [n for n, d in broker.depths(vhost, _parts(work)).items() if d]
    broker.run(_reject_one(vhost, home))
    parking = f"{work}.parking"
    assert broker.wait_for(lambda: broker.depths(vhost, [parking])[parking] == 1)
    replayed = broker.cli("parking", "replay", parking, vhost=vhost)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    held = broker.depths(vhost, [*_parts(work), parking])
    assert {n: d for n, d in held.items() if d} == {home: 1}, held
    broker.api("DELETE", f"/queues/{broker.q(vhost)}/{broker.q(home)}/contents")


def test_an_older_brokers_consistent_hash_exchange_is_kept_on_4_3(
    vhost: str, tmp_path: Path
) -> None:
    """A partition exchange declared by 4.2 (the plugin's consistent hash of the routing key)
    on a broker now on 4.3: plan says it is kept, declare leaves it, messages still spread."""
    if not _modulus():
        pytest.skip("x-modulus-hash is built in from RabbitMQ 4.3")
    work = "pk.kept"
    exchange = f"{work}.partition"
    made = broker.api(
        "PUT",
        f"/exchanges/{broker.q(vhost)}/{broker.q(exchange)}",
        json={"type": "x-consistent-hash", "durable": True},
    )
    assert made.status_code in (201, 204), made.text
    planned = broker.cli("plan", _file(tmp_path, work), vhost=vhost)
    assert planned.returncode == 2, planned.stdout + planned.stderr  # 2: changes to make
    assert "(x-consistent-hash, kept: x-modulus-hash would move keys" in planned.stdout
    assert "conflict" not in planned.stdout
    declared = broker.cli("declare", _file(tmp_path, work), vhost=vhost, timeout=120)
    assert declared.returncode == 0, declared.stderr
    assert _exchange(vhost, exchange)["type"] == "x-consistent-hash"
    spread = _spread(vhost, work)
    assert sum(spread.values()) == 1000 and all(spread.values()), spread
    for name in _parts(work):
        broker.api("DELETE", f"/queues/{broker.q(vhost)}/{broker.q(name)}/contents")


def test_a_delayed_message_lands_in_its_keys_partition(vhost: str, tmp_path: Path) -> None:
    """Through the delay ladder the routing key is kept: the delayed copy of a key goes to the
    partition its undelayed messages go to (never to another, never unroutable)."""
    work = "pk.delayed"
    path = _file(tmp_path, work)
    declared = broker.cli("declare", path, vhost=vhost, timeout=120)
    assert declared.returncode == 0, declared.stderr
    broker.publish_with_ids(vhost, "pk.accounts", "account.5", [(uuid.uuid4().hex, b"{}")])
    [home] = [n for n, d in broker.depths(vhost, _parts(work)).items() if d]
    sent = broker.cli(
        "publish", "pk.accounts", "account.5", "--topology", path, "--delay", "300ms",
        "--body", "{}", vhost=vhost, timeout=120,
    )  # fmt: skip
    assert sent.returncode == 0, sent.stderr
    assert broker.wait_for(lambda: broker.depths(vhost, [home])[home] == 2, timeout_s=20)
    held = broker.depths(vhost, _parts(work))
    assert {n: d for n, d in held.items() if d} == {home: 2}, held
    broker.api("DELETE", f"/queues/{broker.q(vhost)}/{broker.q(home)}/contents")

"""Partitions by the routing key: x-modulus-hash where RabbitMQ 4.3 has it built in, the
plugin's consistent hash elsewhere; a broker's consistent-hash exchange kept after an upgrade;
the file checks that keep every message from landing in one partition."""

from __future__ import annotations

from typing import Any

import pytest

from rmqkit.errors import TopologyFileError
from rmqkit.topology.expand import expand
from rmqkit.topology.model import parse_topology
from rmqkit.topology.plan import LiveState, compute_plan

BY_KEY = """
[exchanges.accounts]
type = "topic"

[queues."acct.work"]
partitions = 4
partition_by = "routing_key"
bind = [{ exchange = "accounts", routing_key = "account.#" }]
"""
BY_HEADER = '[queues."acct.work"]\npartitions = 4\npartition_key = "account_id"\n'
V43, V42 = (4, 3, 6), (4, 2, 0)


def _hashing(text: str, version: tuple[int, int, int]) -> dict[str, Any]:
    state = expand(parse_topology(text, "t.toml"), broker_version=version)
    [exchange] = [e for e in state.exchanges if e.name == "acct.work.partition"]
    return {"type": exchange.type, "arguments": exchange.arguments}


def test_by_routing_key_is_the_modulus_hash_on_4_3_else_the_consistent_hash() -> None:
    assert _hashing(BY_KEY, V43) == {"type": "x-modulus-hash", "arguments": {}}
    assert _hashing(BY_KEY, V42) == {"type": "x-consistent-hash", "arguments": {}}
    assert _hashing(BY_KEY, (3, 10, 8)) == {"type": "x-consistent-hash", "arguments": {}}
    # a header can only be hashed by the plugin, on every version
    header = {"type": "x-consistent-hash", "arguments": {"hash-header": "account_id"}}
    assert _hashing(BY_HEADER, V43) == header


def test_the_plan_line_says_which_exchange_and_what_is_hashed() -> None:
    [work] = expand(parse_topology(BY_KEY, "t.toml"), broker_version=V43).work_queues
    assert (
        "4 partitions acct.work.p0…acct.work.p3 by the routing key through acct.work.partition "
        "(x-modulus-hash; one active consumer each)" in work.text()
    )
    assert work.as_dict()["partition_exchange_type"] == "x-modulus-hash"
    [header] = expand(parse_topology(BY_HEADER, "t.toml"), broker_version=V43).work_queues
    assert "by header account_id through acct.work.partition (x-consistent-hash;" in header.text()


def _plan(text: str, exchanges: dict[str, Any], types: set[str]) -> Any:
    live = LiveState(
        queues={}, exchanges=exchanges, bindings=[], policies={}, exchange_types=frozenset(types)
    )
    desired = expand(parse_topology(text, "t.toml"), broker_version=V43)
    return compute_plan(desired, live, source="t.toml", vhost="/")


def _exchange(name: str, kind: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    """An exchange as the management API shows it."""
    return {
        "name": name,
        "type": kind,
        "durable": True,
        "auto_delete": False,
        "internal": False,
        "arguments": arguments or {},
    }


BUILTIN = {"direct", "topic", "fanout", "headers", "x-modulus-hash"}


def test_an_upgraded_brokers_consistent_hash_exchange_is_kept_not_a_conflict() -> None:
    live = {
        "acct.work.partition": _exchange("acct.work.partition", "x-consistent-hash"),
        "accounts": _exchange("accounts", "topic"),
    }
    plan = _plan(BY_KEY, live, BUILTIN | {"x-consistent-hash"})
    assert not plan.conflicts
    [change] = [c for c in plan.changes if c.name == "acct.work.partition"]
    assert change.action == "in-sync"
    [exchange] = [e for e in plan.desired.exchanges if e.name == "acct.work.partition"]
    assert exchange.type == "x-consistent-hash"  # declare redeclares nothing of it
    [work] = plan.desired.work_queues
    assert "(x-consistent-hash, kept: x-modulus-hash would move keys" in work.text()


def test_a_header_hash_exchange_is_not_taken_for_a_routing_key_one() -> None:
    live = {
        "acct.work.partition": _exchange(
            "acct.work.partition", "x-consistent-hash", {"hash-header": "account_id"}
        )
    }
    plan = _plan(BY_KEY, live, BUILTIN | {"x-consistent-hash"})
    [conflict] = plan.conflicts
    assert conflict.name == "acct.work.partition" and "x-modulus-hash" in conflict.detail


def test_without_the_plugin_on_4_3_the_fix_names_the_routing_key_way() -> None:
    plan = _plan(BY_HEADER, {}, BUILTIN)
    [conflict] = plan.conflicts
    assert "rabbitmq-plugins enable rabbitmq_consistent_hash_exchange" in conflict.fix
    assert 'partition_by = "routing_key"' in conflict.fix
    assert not _plan(BY_KEY, {}, BUILTIN).conflicts  # no plugin needed


@pytest.mark.parametrize(
    ("text", "where", "says"),
    [
        (
            '[queues.w]\npartition_by = "routing_key"\n',
            "partition_by",
            "needs partitions = N",
        ),
        (
            '[queues.w]\npartitions = 2\npartition_by = "routing_key"\npartition_key = "k"\n',
            "partition_key",
            "drop partition_key",
        ),
        (
            '[exchanges.d]\ntype = "direct"\n[queues.w]\npartitions = 2\n'
            'partition_by = "routing_key"\nbind = [{ exchange = "d", routing_key = "acct" }]\n',
            "bind",
            "all of them would land in one partition",
        ),
        (
            '[queues.w]\npartitions = 2\npartition_by = "routing_key"\n'
            'bind = [{ exchange = "amq.topic", routing_key = "account.updated" }]\n',
            "bind",
            "routing key 'account.updated'",
        ),
        ('[queues.w]\npartitions = 2\npartition_by = "key"\n', "partition_by", "routing_key"),
    ],
    ids=["no-partitions", "with-a-header", "direct-bind", "topic-without-wildcard", "unknown"],
)
def test_a_routing_key_partition_that_would_not_spread_is_refused(
    text: str, where: str, says: str
) -> None:
    with pytest.raises(TopologyFileError) as info:
        parse_topology(text, "t.toml")
    message = str(info.value)
    assert where in message and says in message, message


def test_fanout_and_headers_binds_are_fine_by_routing_key() -> None:
    text = (
        '[exchanges.f]\ntype = "fanout"\n[exchanges.h]\ntype = "headers"\n'
        '[queues.w]\npartitions = 2\npartition_by = "routing_key"\nbind = [\n'
        '  { exchange = "f", routing_key = "x" },\n'
        '  { exchange = "h", arguments = { "x-match" = "any", k = "1" } },\n]\n'
    )
    parse_topology(text, "t.toml")


def test_a_modulus_hash_exchange_left_by_a_queue_no_longer_partitioned_is_an_orphan() -> None:
    live = LiveState(
        queues={},
        exchanges={"acct.work.partition": _exchange("acct.work.partition", "x-modulus-hash")},
        bindings=[],
        policies={},
        exchange_types=frozenset(BUILTIN),
    )
    desired = expand(parse_topology('[queues."acct.work"]\n', "t.toml"), broker_version=V43)
    plan = compute_plan(desired, live, source="t.toml", vhost="/")
    [orphan] = [c for c in plan.changes if c.name == "acct.work.partition"]
    assert orphan.action == "orphan" and "not partitioned now" in orphan.detail

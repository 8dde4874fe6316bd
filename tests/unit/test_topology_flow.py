"""Flow-control keys of a topology file (issues 15, 16): lanes, partitions, single active
consumer, default delay, full jitter, encryption; and the accessors that publish, the outbox, the
consumer, parking and status read them through."""

from __future__ import annotations

import pytest

from rmqkit.errors import ExitCode, TopologyFileError
from rmqkit.topology.lanes import LaneSpec, topic_matches
from rmqkit.topology.model import Topology, parse_topology

FILE = """\
[exchanges.media]
type = "topic"

[exchanges.accounts]
type = "direct"

[exchanges.all]
type = "fanout"

[queues."media.work"]
bind = [{ exchange = "media", routing_key = "media.*" }]
retry_delays = ["1s", "5s"]
prefetch = 50
delay = "90s"
parking = "media.parked"

[queues."media.work".lanes.large]
body_over = 262144
prefetch = 2
concurrency = 1

[queues."media.work".lanes.vip]
header = { "x-lane" = "vip", tier = "gold" }

[queues."acct.work"]
bind = [{ exchange = "accounts", routing_key = "acct" }, { exchange = "all" }]
partitions = 4
partition_key = "account_id"
retry_delays = ["2s"]
sensitive_fields = ["customer.name", "tax_id"]
blind_index = ["tax_id"]
encrypt = true

[queues."seq.work"]
single_active_consumer = true
jitter = 1.0

[[bindings]]
source = "all"
destination = "media"
destination_type = "exchange"
routing_key = ""
"""


def _topology(text: str = FILE) -> Topology:
    return parse_topology(text, "t.toml")


def _error(text: str) -> TopologyFileError:
    with pytest.raises(TopologyFileError) as info:
        parse_topology(text, "t.toml")
    assert info.value.exit_code == ExitCode.DATA
    return info.value


def test_the_new_keys_load() -> None:
    t = _topology()
    media = t.model.queues["media.work"]
    assert media.delay == 90_000
    assert list(media.lanes) == ["large", "vip"]
    acct = t.model.queues["acct.work"]
    assert (acct.partitions, acct.partition_key, acct.encrypt) == (4, "account_id", True)
    assert acct.blind_index == ["tax_id"]
    seq = t.model.queues["seq.work"]
    assert seq.single_active_consumer and seq.jitter == 1.0
    assert not media.single_active_consumer and not media.encrypt and seq.delay is None


def test_lanes_of_in_file_order() -> None:
    t = _topology()
    assert t.lanes_of("media.work") == [
        LaneSpec("large", "media.work.lane.large", prefetch=2, concurrency=1),
        LaneSpec("vip", "media.work.lane.vip", prefetch=50, concurrency=None),
    ]
    assert t.lanes_of("seq.work") == []


def test_lane_for_first_match_wins_else_the_work_queue() -> None:
    t = _topology()
    assert t.lane_for("media.work", {}, 100) == "media.work"
    assert t.lane_for("media.work", {}, 262144) == "media.work"  # strictly larger only
    assert t.lane_for("media.work", {}, 262145) == "media.work.lane.large"
    vip = {"x-lane": "vip", "tier": "gold"}
    assert t.lane_for("media.work", vip, 10) == "media.work.lane.vip"
    assert t.lane_for("media.work", {"x-lane": b"vip", "tier": b"gold"}, 10) == (
        "media.work.lane.vip"
    )
    assert t.lane_for("media.work", {"x-lane": "vip"}, 10) == "media.work"  # all must match
    assert t.lane_for("media.work", vip, 300_000) == "media.work.lane.large"  # file order
    assert t.lane_for("seq.work", vip, 300_000) == "seq.work"


def test_lane_with_both_conditions_needs_both() -> None:
    t = _topology('[queues.w.lanes.big]\nheader = { kind = "video" }\nbody_over = 10\n')
    assert t.lane_for("w", {"kind": "video"}, 11) == "w.lane.big"
    assert t.lane_for("w", {"kind": "video"}, 10) == "w"
    assert t.lane_for("w", {"kind": "text"}, 11) == "w"


def test_partitions_of_and_exchange() -> None:
    t = _topology()
    assert t.partitions_of("acct.work") == [f"acct.work.p{i}" for i in range(4)]
    assert t.partition_exchange("acct.work") == "acct.work.partition"
    assert t.partitions_of("media.work") == [] and t.partition_exchange("media.work") is None


def test_queue_spec_resolves_lanes_and_partitions() -> None:
    t = _topology()
    lane = t.queue_spec("media.work.lane.large")
    assert lane.prefetch == 2 and lane.retry_delays == [1000, 5000] and lane.lanes == {}
    assert lane.bind == [] and not lane.single_active_consumer
    assert t.queue_spec("media.work.lane.vip").prefetch == 50
    part = t.queue_spec("acct.work.p3")
    assert part.single_active_consumer and part.partitions is None and part.retry_delays == [2000]
    assert part.sensitive_fields == ["customer.name", "tax_id"] and part.encrypt
    assert t.queue_spec("media.work") is t.model.queues["media.work"]
    with pytest.raises(KeyError):
        t.queue_spec("acct.work.p4")
    with pytest.raises(KeyError):
        t.queue_spec("nope")


def test_parking_and_wait_names_of_derived_queues() -> None:
    t = _topology()
    assert t.parking_name("media.work") == "media.parked"
    assert t.parking_name("media.work.lane.large") == "media.parked"
    assert t.parking_name("acct.work.p0") == "acct.work.parking"
    assert t.wait_name("media.work.lane.large", 1000) == "media.work.lane.large.wait.1s"
    assert t.parent_of("acct.work.p2") == "acct.work" and t.parent_of("x") is None
    assert t.work_queue_names() == [
        "media.work",
        "media.work.lane.large",
        "media.work.lane.vip",
        "acct.work.p0",
        "acct.work.p1",
        "acct.work.p2",
        "acct.work.p3",
        "seq.work",
    ]


def test_work_queues_for_follows_binds_e2e_and_default_exchange() -> None:
    t = _topology()
    assert t.work_queues_for("media", "media.image") == ["media.work"]
    assert t.work_queues_for("media", "media.image.big") == []
    assert t.work_queues_for("accounts", "acct") == ["acct.work"]
    assert t.work_queues_for("accounts", "other") == []
    # fanout reaches acct.work directly and media.work through the e2e binding, whose own
    # routing key "" does not match media.* (the message keeps its routing key)
    assert t.work_queues_for("all", "media.x") == ["acct.work", "media.work"]
    assert t.work_queues_for("all", "zzz") == ["acct.work"]
    assert t.work_queues_for("", "seq.work") == ["seq.work"]
    assert t.work_queues_for("", "acct.work") == []  # partitioned: not a queue on the broker
    assert t.work_queues_for("", "nope") == []
    assert t.work_queues_for("unknown", "x") == []


def test_a_publish_past_the_files_exchanges_still_reaches_its_work_queue() -> None:
    """The partition exchange, a partition or a lane named directly: the work queue is reached,
    so its encryption and default delay apply (they were skipped before: plaintext sent)."""
    t = _topology()
    assert t.work_queues_for("acct.work.partition", "") == ["acct.work"]
    assert t.work_queues_for("", "acct.work.p3") == ["acct.work"]
    assert t.work_queues_for("", "media.work.lane.large") == ["media.work"]
    assert t.work_queues_for("", "acct.work.p4") == []  # no such partition
    assert t.work_queues_for("", "media.work.lane.none") == []


def test_work_queues_for_alternate_and_headers_and_builtin() -> None:
    t = _topology(
        '[exchanges.in]\ntype = "direct"\nalternate_exchange = "un"\n'
        '[exchanges.un]\ntype = "fanout"\n'
        '[exchanges.h]\ntype = "headers"\n'
        '[queues.a]\nbind = [{ exchange = "in", routing_key = "a" }]\n'
        '[queues.u]\nbind = [{ exchange = "un" }]\n'
        '[queues.hq]\nbind = [{ exchange = "h", arguments = { "x-match" = "any", k = "1" } }]\n'
        '[queues.t]\nbind = [{ exchange = "amq.topic", routing_key = "#.x" }]\n'
    )
    assert t.work_queues_for("in", "a") == ["a"]
    assert t.work_queues_for("in", "b") == ["u"]
    assert t.work_queues_for("h", "", {"k": "1"}) == ["hq"]
    assert t.work_queues_for("h", "", {"k": "2"}) == []
    assert t.work_queues_for("amq.topic", "x") == ["t"]
    assert t.work_queues_for("amq.topic", "a.b.x") == ["t"]


@pytest.mark.parametrize(
    ("pattern", "key", "hit"),
    [
        ("a.*", "a.b", True),
        ("a.*", "a", False),
        ("a.#", "a", True),
        ("#", "", True),
        ("*.b.#", "x.b.c.d", True),
        ("a.*.c", "a.b.d", False),
    ],
)
def test_topic_matching(pattern: str, key: str, hit: bool) -> None:
    assert topic_matches(pattern, key) is hit


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        ("[queues.w]\njitter = 1.5\n", "queues.w.jitter", "less than or equal"),
        ('[queues.w]\ndelay = "-1s"\n', "queues.w.delay", "must not be negative"),
        ('[queues.w]\ndelay = "48h"\n', "queues.w.delay", "delay ladder"),
        ("[queues.w]\ndelay = 5\n", "queues.w.delay", "bad duration"),
        ("[queues.w]\npartitions = 1\npartition_key = 'k'\n", "queues.w.partitions", "2"),
        ("[queues.w]\npartitions = 4\n", "queues.w.partition_key", "go together"),
        ("[queues.w]\npartition_key = 'k'\n", "queues.w.partitions", "go together"),
        ("[queues.w.lanes.big]\nprefetch = 3\n", "queues.w.lanes.big", "body_over"),
        ("[queues.w.lanes.big]\nbody_over = -1\n", "queues.w.lanes.big.body_over", "0"),
        ('[queues.w.lanes."a b"]\nbody_over = 1\n', 'queues.w.lanes."a b"', "letters"),
        (
            "[queues.w]\npartitions = 2\npartition_key = 'k'\n[queues.w.lanes.b]\nbody_over = 1\n",
            "queues.w.lanes",
            "cannot have lanes",
        ),
        (
            "[queues.w]\nsensitive_fields = ['a']\nblind_index = ['b']\n",
            "queues.w.blind_index",
            "b not in sensitive_fields",
        ),
        ("[queues.w]\nencrypt = true\n", "queues.w.encrypt", "sensitive_fields"),
        ("[queues.w]\nencrypt = 'yes'\n", "queues.w.encrypt", "valid boolean"),
        ("[queues.w]\nsingle_active_consumer = 1\n", "queues.w.single_active_consumer", "boolean"),
        (
            '[queues.w]\n[queues.w.lanes.x]\nbody_over = 1\n[queues."w.lane.x"]\n',
            "queues.w",
            "clashes",
        ),
        (
            "[exchanges.\"w.partition\"]\n[queues.w]\npartitions = 2\npartition_key = 'k'\n",
            "queues.w.partitions",
            "clashes",
        ),
        (
            "[queues.w]\npartitions = 2\npartition_key = 'k'\n"
            "[[bindings]]\nsource = 'amq.direct'\ndestination = 'w'\n",
            "bindings[0].destination",
            "is partitioned, not a queue: bind to its exchange 'w.partition'",
        ),
    ],
)
def test_invalid_flow_keys_name_key_and_line(text: str, key: str, words: str) -> None:
    err = _error(text)
    assert err.key == key, str(err)
    assert words in str(err), str(err)
    assert err.line is not None and str(err).startswith(f"t.toml:{err.line}:")


def test_error_line_points_at_the_key() -> None:
    err = _error('[queues.w]\nprefetch = 3\n\ndelay = "-1s"\n')
    assert err.line == 4


def test_binding_to_the_partition_exchange_is_allowed() -> None:
    t = _topology(
        "[queues.w]\npartitions = 2\npartition_key = 'k'\n"
        "[[bindings]]\nsource = 'amq.direct'\ndestination = 'w.partition'\n"
        "destination_type = 'exchange'\nrouting_key = 'r'\n"
    )
    assert t.partitions_of("w") == ["w.p0", "w.p1"]

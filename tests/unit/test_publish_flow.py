"""The publishing edge without a broker (rmqkit.publishing.routing): lane, delay and fields."""

from __future__ import annotations

import json

import pytest

from rmqkit.crypto import KeyRingError, decrypt_fields, generate_keyring
from rmqkit.delay import DelayRangeError, Ladder
from rmqkit.errors import DataError
from rmqkit.publishing.routing import Edge, Encryptor
from rmqkit.topology import parse_topology

FILE = """
[exchanges.media]
type = "direct"
[exchanges.all]
type = "fanout"
[queues."media.work"]
bind = [{ exchange = "media", routing_key = "m" }, { exchange = "all" }]
[queues."media.work".lanes.large]
header = { "x-lane" = "large" }
[queues."media.work".lanes.big]
body_over = 100
[queues."later.work"]
bind = [{ exchange = "media", routing_key = "later" }, { exchange = "all" }]
delay = "90s"
[queues."people.work"]
bind = [{ exchange = "media", routing_key = "person" }]
sensitive_fields = ["name", "tax_id"]
blind_index = ["tax_id"]
encrypt = true
[queues."redacted.work"]
bind = [{ exchange = "media", routing_key = "person" }]
sensitive_fields = ["address"]
"""


@pytest.fixture
def edge() -> Edge:
    return Edge(parse_topology(FILE, "flow.toml"))


def test_lanes_by_header_then_body_size_else_the_queue(edge: Edge) -> None:
    tagged = edge.route("media", "m", {"x-lane": "large"}, 500)
    assert (tagged.exchange, tagged.routing_key, tagged.lane) == (
        "",
        "media.work.lane.large",
        tagged.lane,
    )
    assert tagged.headers == {"x-lane": "large"}  # first matching lane in file order
    big = edge.route("media", "m", None, 101)
    assert (big.exchange, big.routing_key) == ("", "media.work.lane.big")
    small = edge.route("media", "m", {"x-lane": "small"}, 100)
    assert (small.exchange, small.routing_key, small.lane) == ("media", "m", None)
    elsewhere = edge.route("other", "x", None, 10_000)  # reaches no work queue of the file
    assert (elsewhere.exchange, elsewhere.routing_key) == ("other", "x")


def test_a_lane_for_a_message_that_reaches_several_queues_is_refused(edge: Edge) -> None:
    with pytest.raises(DataError, match="reaches 2 work queues"):
        Edge(parse_topology(FILE.replace('delay = "90s"', ""), "f")).route("all", "", None, 500)


def test_default_delay_explicit_delay_and_zero(edge: Edge) -> None:
    default = edge.route("media", "later", {"k": "v"}, 10)
    assert (default.exchange, default.routing_key) == (Ladder().entry, "later")
    assert default.delay_ms == 90_000 and default.applied_ms == 90_000
    assert default.target == ("media", "later") and default.headers is not None
    assert default.headers["k"] == "v" and default.headers["rmqkit-delay-exchange"] == "media"
    zero = edge.route("media", "later", None, 10, delay_ms=0)
    assert (zero.exchange, zero.applied_ms, zero.target) == ("media", 0, None)
    explicit = edge.route("media", "m", None, 10, delay_ms=1_050)
    assert explicit.applied_ms == 1_100 and explicit.target == ("media", "m")
    # a delayed lane message leaves the ladder into its lane queue
    lane = edge.route("media", "m", {"x-lane": "large"}, 10, delay_ms=2_000)
    assert lane.target == ("", "media.work.lane.large") and lane.routing_key == lane.target[1]


def test_time_already_waited_counts_towards_the_delay(edge: Edge) -> None:
    part = edge.route("media", "later", None, 10, waited_ms=30_000.0)
    assert part.delay_ms == 60_000 and part.applied_ms == 60_000
    done = edge.route("media", "later", None, 10, waited_ms=95_000.0)
    assert (done.exchange, done.applied_ms, done.target) == ("media", 0, None)


def test_delay_refusals(edge: Edge) -> None:
    with pytest.raises(DelayRangeError, match="exceeds the maximum"):
        edge.check_delay(30 * 3600 * 1000, "--delay: ")
    with pytest.raises(DelayRangeError, match="exceeds the maximum"):
        edge.route("media", "m", None, 10, delay_ms=30 * 3600 * 1000)
    with pytest.raises(DelayRangeError, match="expiration"):
        edge.route("media", "m", None, 10, delay_ms=1000, expiration="5000")
    with pytest.raises(DataError, match="different default delays"):
        edge.route("all", "", None, 10)  # media.work (none) and later.work (90s)


def test_encryptor_takes_the_fields_of_the_queues_that_encrypt() -> None:
    topology = parse_topology(FILE, "flow.toml")
    ring = generate_keyring()
    encryptor = Encryptor(keyring=ring, topology=topology)
    # people.work encrypts; redacted.work (same binding) only redacts its field in views
    assert encryptor.fields_for("media", "person") == (["name", "tax_id"], ["tax_id"])
    assert encryptor.fields_for("media", "m") == ([], [])
    body = json.dumps({"name": "Ada", "tax_id": "123", "address": "here"}).encode()
    sealed = encryptor.encrypt("media", "person", body)
    parsed = json.loads(sealed)
    assert b"Ada" not in sealed and b"123" not in sealed and parsed["address"] == "here"
    assert "bi" in parsed["tax_id"] and "bi" not in parsed["name"]
    assert decrypt_fields(parsed, None, ring) == json.loads(body)
    assert encryptor.encrypt("media", "m", b"not json") == b"not json"  # nothing to encrypt
    with pytest.raises(DataError, match="not JSON"):
        encryptor.encrypt("media", "person", b"not json")
    with pytest.raises(KeyRingError):
        Encryptor(topology=topology).encrypt("media", "person", body)
    fixed = Encryptor(["card.holder"], [], ring)  # without a topology: the same fields always
    assert b"Ada" not in fixed.encrypt("x", "y", b'{"card": {"holder": "Ada"}}')


def test_plaintext_guard_needs_no_key_ring() -> None:
    topology = parse_topology(FILE, "flow.toml")
    guard = Encryptor(topology=topology)  # the relay's: no key ring
    sealed = Encryptor(keyring=generate_keyring(), topology=topology).encrypt(
        "media", "person", b'{"name": "Ada", "tax_id": "1"}'
    )
    assert guard.plaintext("media", "person", sealed) is None
    assert guard.plaintext("media", "person", b'{"other": 1}') is None  # missing fields: fine
    assert "name in plaintext" in (guard.plaintext("media", "person", b'{"name": "Ada"}') or "")
    assert "not JSON" in (guard.plaintext("media", "person", b"raw") or "")
    assert guard.plaintext("media", "m", b"raw") is None  # a queue that does not encrypt

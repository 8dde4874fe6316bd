"""`rmqkit publish`'s library call without a broker (rmqkit.publishing.stream): the edge it
loads, the checks every message gets before it is sent, the report's summary and error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import rmqkit
from rmqkit.crypto import generate_keyring
from rmqkit.publishing.edge import SensitiveIdError
from rmqkit.publishing.ids import IdSource
from rmqkit.publishing.inputs import OutgoingMessage, messages_from_ndjson
from rmqkit.publishing.report import PublishReport
from rmqkit.publishing.stream import PublishEdge, _checked
from rmqkit.settings import Settings

TOPOLOGY = """
[exchanges.people]
type = "direct"
[queues."people.work"]
bind = [{ exchange = "people", routing_key = "person" }]
retry_delays = []
sensitive_fields = ["tax_id", "customer.name"]
encrypt = true
"""


@pytest.fixture
def edge(tmp_path: Path) -> PublishEdge:
    path = tmp_path / "t.toml"
    path.write_text(TOPOLOGY)
    loaded = PublishEdge.load(Settings(), path, keyring=generate_keyring())
    assert loaded is not None and loaded.encryptor is not None
    return loaded


def test_no_topology_and_no_delay_is_no_edge() -> None:
    assert PublishEdge.load(Settings(), None, None) is None
    zero = PublishEdge.load(Settings(), None, 0)  # --delay 0s: an edge that delays nothing
    assert zero is not None and zero.encryptor is None


def test_a_delay_beyond_the_ladder_is_refused_when_loaded() -> None:
    with pytest.raises(rmqkit.DataError, match=r"--delay: .*exceeds the maximum"):
        PublishEdge.load(Settings(), None, 30 * 3600 * 1000)


@pytest.mark.parametrize(
    ("field", "in_record", "refused"),
    [
        ("tax_id", False, True),
        ("customer.name.first", False, True),
        ("body.tax_id", True, True),
        ("tax_id", True, False),  # a field of the NDJSON record, not of the body
        ("order_id", False, False),
    ],
)
def test_an_id_field_the_topology_encrypts_is_a_usage_error(
    edge: PublishEdge, field: str, in_record: bool, refused: bool
) -> None:
    ids = IdSource("people", "person", field=field, in_record=in_record)
    if refused:
        with pytest.raises(rmqkit.UsageError, match="sensitive field"):
            edge.refuse_sensitive_id_field(ids)
    else:
        edge.refuse_sensitive_id_field(ids)


def test_an_id_that_is_a_sensitive_value_is_refused_without_quoting_it(
    edge: PublishEdge,
) -> None:
    body = json.dumps({"tax_id": "SECRET-9", "customer": {"name": 42}}).encode()
    for given in ("SECRET-9", "42"):
        message = OutgoingMessage(body, given, where="<stdin>:3")
        with pytest.raises(SensitiveIdError) as caught:
            edge.prepare(message, 3, "people", "person")
        assert given not in str(caught.value) and "message 3 (<stdin>:3)" in str(caught.value)
    ready, routed = edge.prepare(OutgoingMessage(body, "o-1"), 1, "people", "person")
    assert b"SECRET-9" not in ready.body and routed.routing_key == "person"


def test_ids_and_headers_amqp_cannot_carry_are_found_before_sending() -> None:
    lines = [
        json.dumps({"body": "a", "message_id": "ok"}).encode(),
        json.dumps({"body": "b", "headers": {"n": 2**70}}).encode(),
    ]
    checked = _checked(messages_from_ndjson(lines))
    assert next(checked).message_id == "ok"
    with pytest.raises(rmqkit.DataError, match=r"message 2 \(<stdin>:2\).*header AMQP"):
        next(checked)
    long = [OutgoingMessage(b"x", "i" * 256, where="--body 1")]
    with pytest.raises(rmqkit.DataError, match="255 bytes") as caught:
        list(_checked(long))
    assert "i" * 256 not in str(caught.value)  # the id is not quoted


def test_the_report_keeps_its_plain_keys_and_names_the_first_reason() -> None:
    plain = PublishReport(published=2, confirmed=2)
    assert set(plain.as_dict()) == {"published", "confirmed", "returned", "nacked", "retried"}
    assert plain.failure() is None
    edged = PublishReport(published=2, confirmed=2, lanes={"b": 1, "a": 1}, delays_ms=[100])
    assert edged.as_dict()["lanes"] == {"a": 1, "b": 1} and edged.as_dict()["delayed"] == 1
    large = PublishReport(published=2, confirmed=1, too_large=1, too_large_ids=["t"])
    assert large.as_dict()["too_large"] == 1
    assert isinstance(large.failure(), rmqkit.MessageTooLarge)
    both = PublishReport(returned=1, returned_ids=["r"], nacked=1, too_large=1)
    assert isinstance(both.failure(), rmqkit.DataError)
    assert "unroutable" in str(both.failure())
    busy = PublishReport(nacked=1)
    error = busy.failure()
    assert isinstance(error, rmqkit.BrokerUnavailable) and "--retry-busy" in str(error)

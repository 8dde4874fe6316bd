"""``rmqkit.Publisher``'s preparation and error choice, without a broker."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel, Field

import rmqkit
from rmqkit.publishing.prepare import body_bytes, delay_ms_of, prepare
from rmqkit.publishing.results import PublishResult, failure
from rmqkit.publishing.routing import Edge, Encryptor


@pytest.mark.parametrize(
    ("given", "ms"),
    [(None, None), (0, 0), (1.5, 1500), ("90s", 90_000), (timedelta(minutes=2), 120_000)],
)
def test_delay_spellings(given: Any, ms: int | None) -> None:
    assert delay_ms_of(given) == ms


@pytest.mark.parametrize("bad", [-1, "soon", True, [1]])
def test_bad_delays_are_usage_errors(bad: Any) -> None:
    with pytest.raises(rmqkit.UsageError):
        delay_ms_of(bad)


class Item(BaseModel):
    item_id: str = Field(alias="itemId")


def test_bodies_become_bytes_with_their_content_type() -> None:
    assert body_bytes(b"raw") == (b"raw", None, None)
    assert body_bytes("text") == (b"text", "text/plain; charset=utf-8", None)
    assert body_bytes({"a": 1}) == (b'{"a":1}', "application/json", None)
    assert body_bytes(Item(itemId="i")) == (b'{"itemId":"i"}', "application/json", Item)
    with pytest.raises(rmqkit.DataError):
        body_bytes(object())


def test_prepare_refuses_bad_ids_and_headers_naming_the_message() -> None:
    edge, enc = Edge(), Encryptor()
    with pytest.raises(rmqkit.DataError, match="message 2"):
        prepare(edge, enc, "x", "k", rmqkit.PublishMessage(b"", message_id="x" * 256), 2)
    with pytest.raises(rmqkit.DataError, match=r"message 3 .*header AMQP cannot carry"):
        prepare(edge, enc, "x", "k", rmqkit.PublishMessage(b"", headers={"s": {1}}), 3)
    ready = prepare(edge, enc, "x", "k", rmqkit.PublishMessage(b"b", message_id="m"), 1)
    assert (ready.routed.exchange, ready.routed.routing_key) == ("x", "k")
    assert ready.properties.delivery_mode == 2 and ready.properties.message_id == "m"


def _r(outcome: str) -> PublishResult:
    return PublishResult(outcome, "x", "k", outcome == "confirmed", outcome)  # type: ignore[arg-type]


def test_failure_picks_the_reason_and_keeps_every_result() -> None:
    assert failure([_r("confirmed")]) is None
    mixed = [_r("confirmed"), _r("nacked"), _r("returned"), _r("unconfirmed")]
    error = failure(mixed)
    assert isinstance(error, rmqkit.Unroutable) and error.exit_code == 65
    assert error.results == tuple(mixed)
    assert error.confirmed == (mixed[0],) and error.unconfirmed == tuple(mixed[1:])
    busy = failure([_r("nacked"), _r("unconfirmed")])
    assert isinstance(busy, rmqkit.PublisherBusy) and busy.exit_code == 69
    lost = failure([_r("unconfirmed")], "gone")
    assert isinstance(lost, rmqkit.PublishInterrupted) and "gone" in str(lost)
    assert isinstance(lost, rmqkit.PublishFailed) and isinstance(lost, rmqkit.BrokerUnavailable)

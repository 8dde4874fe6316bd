"""How the relay names what went wrong (rmqkit.outbox.relay): a broker connection closed is the
broker's, never "cannot reach database" (aiormq's errors are OSErrors too), and a close the
broker sent (CONNECTION_FORCED) is retried even at start. The same close, live, is in
tests/integration/test_outbox_faults.py."""

from __future__ import annotations

from pathlib import Path

import aiormq.exceptions

from rmqkit.broker.session import closed_by_broker
from rmqkit.errors import BrokerUnavailable
from rmqkit.outbox.options import RelayOptions
from rmqkit.outbox.relay import Relay
from rmqkit.settings import Settings


def _relay(tmp_path: Path) -> Relay:
    return Relay(Settings(), RelayOptions(dsn=f"sqlite:///{tmp_path / 'outbox.db'}"))


def test_a_broker_close_is_named_as_the_brokers(tmp_path: Path) -> None:
    forced = aiormq.exceptions.ConnectionClosed(320, "CONNECTION_FORCED - test: forced")
    error = _relay(tmp_path)._mapped(forced)
    assert isinstance(error, BrokerUnavailable) and error.exit_code == 69
    assert "broker connection lost" in str(error) and "database" not in str(error)


def test_only_a_close_the_broker_sent_counts_as_the_broker_being_there() -> None:
    forced = aiormq.exceptions.ConnectionClosed(320, "CONNECTION_FORCED - test: forced")
    try:
        try:
            raise forced
        except aiormq.exceptions.ConnectionClosed as exc:
            raise BrokerUnavailable("broker connection lost") from exc
    except BrokerUnavailable as wrapped:
        assert closed_by_broker(wrapped)  # found through the wrapping
    assert closed_by_broker(forced)
    assert not closed_by_broker(aiormq.exceptions.ConnectionClosed(403, "ACCESS_REFUSED"))
    assert not closed_by_broker(ConnectionRefusedError(111, "Connection refused"))

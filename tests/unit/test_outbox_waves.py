"""Order under failure, without a broker: ``Broker.publish_in_order`` on a scripted broker.

The n-th row of each aggregate goes out in the n-th wave, a wave is settled before the next is
sent, and after a failure the later rows of that aggregate are not sent (None: untouched).
Also: which rows AMQP cannot carry (``wire_problem``/``headers_problem``), refused by ``add``.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import pytest

import rmqkit.outbox
from rmqkit.broker.codec import headers_problem, wire_problem
from rmqkit.broker.session import Outcome
from rmqkit.errors import BrokerUnavailable
from rmqkit.outbox.amqp import Broker, Row
from rmqkit.settings import load_settings


class Scripted(Broker):
    """Publishes nothing: records each wave and answers from ``fail`` (message_id -> outcome)."""

    def __init__(self, fail: dict[str, Outcome | str], lose_at_wave: int | None = None) -> None:
        super().__init__(load_settings(), window=10, name="test")
        self.fail = fail
        self.waves: list[list[str]] = []
        self.lose_at_wave = lose_at_wave

    @property
    def lost(self) -> bool:
        return False

    async def exchange_exists(self, exchange: str) -> bool:
        return exchange != "missing"

    async def _send(self, rows: Sequence[Row]) -> list[asyncio.Future[Outcome] | str]:
        if self.lose_at_wave == len(self.waves):
            raise BrokerUnavailable("the broker connection was lost")
        self.waves.append([r.message_id for r in rows])
        settled: list[asyncio.Future[Outcome] | str] = []
        for row in rows:
            outcome = self.fail.get(row.message_id, Outcome.CONFIRMED)
            if isinstance(outcome, str):  # failed before it had a confirm
                settled.append(outcome)
                continue
            future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
            future.set_result(outcome)
            settled.append(future)
        return settled


def _row(n: int, mid: str, aggregate: str | None, exchange: str = "ev") -> Row:
    return Row(n, mid, exchange, "k", b"", None, None, aggregate, 0)


ROWS = [
    _row(1, "a1", "A"),
    _row(2, "b1", "B"),
    _row(3, "a2", "A"),
    _row(4, "n1", None),
    _row(5, "a3", "A"),
    _row(6, "b2", "B"),
    _row(7, "n2", None),
    _row(8, "a4", "A"),
]


def _run(broker: Scripted, rows: Sequence[Row] = ROWS) -> list[Outcome | str | None]:
    return asyncio.run(broker.publish_in_order(rows))


def test_one_unconfirmed_row_per_aggregate_and_free_rows_in_the_first_wave() -> None:
    broker = Scripted({})
    assert _run(broker) == [Outcome.CONFIRMED] * len(ROWS)
    assert broker.waves == [["a1", "b1", "n1", "n2"], ["a2", "b2"], ["a3"], ["a4"]]


def test_a_failed_row_stops_its_aggregate_only() -> None:
    broker = Scripted({"a2": Outcome.RETURNED, "n1": Outcome.NACKED})
    results = dict(zip([r.message_id for r in ROWS], _run(broker), strict=True))
    assert broker.waves == [["a1", "b1", "n1", "n2"], ["a2", "b2"]]  # a3, a4 never sent
    assert results["a2"] is Outcome.RETURNED and results["n1"] is Outcome.NACKED
    assert results["a3"] is None and results["a4"] is None  # left pending, untouched
    assert results["b2"] is Outcome.CONFIRMED and results["n2"] is Outcome.CONFIRMED


def test_a_row_that_is_never_sent_also_stops_its_aggregate() -> None:
    rows = [_row(1, "a1", "A", "missing"), _row(2, "a2", "A"), _row(3, "k1", "K", "é" * 200)]
    broker = Scripted({})
    results = _run(broker, rows)
    assert "does not exist" in str(results[0]) and results[1] is None
    assert "255" in str(results[2])
    assert broker.waves == []  # nothing sent at all


def test_connection_lost_between_waves_keeps_the_confirmed_waves() -> None:
    broker = Scripted({}, lose_at_wave=1)
    results = _run(broker)
    assert results[:2] == [Outcome.CONFIRMED] * 2 and results[3] is Outcome.CONFIRMED
    assert results[2] is None and results[4:6] == [None, None]  # a2, a3, b2: not sent


def test_wire_and_header_limits() -> None:
    assert wire_problem("ev", "k" * 255, "id", None) is None
    assert "256 bytes" in str(wire_problem("ev", "k" * 256, "id", None))
    assert "message_id" in str(wire_problem("ev", "k", "m" * 256, None))
    assert "letters, digits" in str(wire_problem("заказы", "k", "id", None))
    assert wire_problem("a-b_c.d:e@f#g,h/i+j k", "k", "id", "text/plain") is None
    assert headers_problem({"a": [1, {"b": -(2**63)}], "n": None, "t": True}) is None
    assert "64 bits" in str(headers_problem({"a": [1, {"b": 2**63}]}))
    assert "128" in str(headers_problem({"x" * 129: 1}))


def test_add_refuses_what_amqp_cannot_carry_and_writes_nothing(tmp_path: Path) -> None:
    rmqkit.outbox.init(f"sqlite:///{tmp_path}/app.db")
    conn = sqlite3.connect(tmp_path / "app.db")
    for bad in (
        {"routing_key": "k" * 256},
        {"exchange": "é" * 128},
        {"headers": {"n": 2**64}},
        {"headers": {"k" * 200: 1}},
        {"message_id": "m" * 300},
    ):
        kwargs = {"exchange": "ev", "routing_key": "k", **bad}
        with pytest.raises(ValueError, match="cannot be published"):
            rmqkit.outbox.add(conn, body=b"x", **kwargs)  # type: ignore[arg-type]
    assert conn.execute("SELECT count(*) FROM rmqkit_outbox").fetchone() == (0,)


def test_pipelined_sends_the_batch_in_one_wave() -> None:
    """``--order pipelined``: one round trip, so a3 and a4 go out although a2 failed."""
    broker = Scripted({"a2": Outcome.RETURNED})
    results = asyncio.run(broker.publish_in_order(ROWS, pipelined=True))
    assert broker.waves == [[r.message_id for r in ROWS]]
    assert results[2] is Outcome.RETURNED and results[4] is results[7] is Outcome.CONFIRMED

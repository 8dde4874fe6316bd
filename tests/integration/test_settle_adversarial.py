"""One more variant of each way a delivery could be left unsettled or hold the window than
tests/integration/test_settle.py shows, as an on-call engineer or an attacker would try them.

Against the real broker with `rmqkit consume` running; asserts on queue depths, the parked
copies' headers and the handler ledger, never on how long anything took.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from rmqkit import headers as h
from rmqkit.broker.codec import MAX_DEPTH
from tests import broker
from tests.consumer_harness import ConsumerProcess, effects, events, wait_until
from tests.handlers import body
from tests.settle_handlers import FAULT

pytestmark = pytest.mark.semantics("4.3")

WORK, PARKING = "jobs.work", "jobs.work.parking"
DEEP = MAX_DEPTH - 1  # tables in tables: with the top-level table, as deep as can be read


def _ids(n: int, prefix: str = "m") -> list[str]:
    return [f"{prefix}-{uuid.uuid4().hex[:12]}" for _ in range(n)]


def _parked(vhost: str) -> dict[str, dict[str, Any]]:
    return {str(p["message_id"]): p["headers"] for p in broker.drain(vhost, PARKING)}


def _until_settled(
    vhost: str, ledger: Path, consumer: ConsumerProcess, ordinary: list[str], parked: int
) -> None:
    def settled() -> bool:
        depth = broker.depths(vhost, [WORK, PARKING])
        return set(effects(ledger)) >= set(ordinary) and depth == {WORK: 0, PARKING: parked}

    assert wait_until(settled, 30), (
        f"{len(set(effects(ledger)) & set(ordinary))} of {len(ordinary)} handled; "
        f"{broker.depths(vhost, [WORK, PARKING])}\n{consumer.output()}"
    )


def _once(ledger: Path, ordinary: list[str]) -> None:
    done = effects(ledger)
    assert all(done[m] == 1 for m in ordinary), "an ordinary message was applied twice"


def _nested(depth: int) -> dict[str, Any]:
    table: dict[str, Any] = {"leaf": "x"}
    for _ in range(depth):
        table = {"n": table}
    return table


def test_odd_headers_park_or_retry_and_never_stop_the_consumer(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    """Failing messages with a header table nested 99 deep (the deepest the client's decoder
    reads; a deeper one fails the connection, see docs/consume.md), rmqkit's own headers holding
    values of the wrong type (a table, a list, a byte array, a decimal, a boolean), x-death as a
    string, then 30 ordinary ones, prefetch 5. Each odd one is parked with its reason (one at
    once as permanent, one after its retries as exhausted), the ordinary ones handled once."""
    from decimal import Decimal

    odd_headers: dict[str, Any] = {
        "deep": _nested(DEEP),
        h.ATTEMPT: {"not": "a count"},
        h.FIRST_FAILED_AT: ["not", "a", "time"],
        h.ORIGINAL_EXCHANGE: bytearray(b"\xff\xfe"),
        h.ORIGINAL_ROUTING_KEY: Decimal("1.5"),
        h.DELAY_EXCHANGE: True,
        "x-death": "not a list",
        "x-delivery-count": "many",
    }
    permanent, transient = _ids(1, "permanent")[0], _ids(1, "transient")[0]
    broker.publish_with_ids(
        jobs_vhost,
        "jobs",
        "job",
        [
            (permanent, body(id=permanent, permanent=True)),
            (transient, body(id=transient, **{"raise": "KeyError"})),
        ],
        headers=lambda i: odd_headers,
    )
    ordinary = _ids(30)
    broker.publish_with_ids(jobs_vhost, "jobs", "job", [(m, body(id=m)) for m in ordinary])
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(jobs_vhost, ledger, "--prefetch", "5")
    consumers.append(consumer)

    _until_settled(jobs_vhost, ledger, consumer, ordinary, 2)
    assert consumer.stop() == 0, consumer.output()
    _once(ledger, ordinary)
    parked = _parked(jobs_vhost)
    assert parked[permanent][h.PARK_REASON] == "permanent", parked[permanent]
    assert parked[transient][h.PARK_REASON] == "exhausted", parked[transient]
    assert parked[transient][h.ATTEMPT] == 4  # the topology's max_attempts: all retries ran
    deep = parked[permanent]["deep"]
    for _ in range(DEEP):
        deep = deep["n"]
    assert deep == {"leaf": "x"}  # kept on the parked copy as it came


def test_a_body_whose_model_recurses_is_parked_undecodable(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    """Valid JSON, but the handler's model parses a field nested 100,000 deep: RecursionError
    out of the model (not a ValidationError). Before, it escaped the handler's run unsettled;
    now the message is parked undecodable and the 30 behind it are handled."""
    (poison,) = _ids(1, "deep")
    payload = "[" * 100_000 + "]" * 100_000
    ordinary = _ids(30)
    messages = [
        (poison, json.dumps({"id": poison, "payload": payload}).encode()),
        *[(m, json.dumps({"id": m}).encode()) for m in ordinary],
    ]
    broker.publish_with_ids(jobs_vhost, "jobs", "job", messages)
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(
        jobs_vhost, ledger, "--prefetch", "5", handler="tests.settle_handlers:by_model"
    )
    consumers.append(consumer)

    _until_settled(jobs_vhost, ledger, consumer, ordinary, 1)
    assert consumer.stop() == 0, consumer.output()
    _once(ledger, ordinary)
    headers = _parked(jobs_vhost)[poison]
    assert headers[h.PARK_REASON] == "undecodable", headers
    assert headers[h.ERROR_TYPE] == "RecursionError"
    assert len(headers[h.TRACEBACK]) <= h.TRACEBACK_MAX_CHARS


def test_errors_in_rmqkit_itself_park_as_internal_error(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    """Faults injected into rmqkit's own path (tests.settle_handlers): the dispatcher raising
    before the handler, a retry copy that cannot be encoded, a handler error whose str()
    raises. Each message is parked (internal_error with the traceback, or retried as the
    ordinary failure it is), and the 30 ordinary messages behind them are handled once."""
    route, copy, unprintable = _ids(1, "route")[0], _ids(1, "copy")[0], _ids(1, "print")[0]
    broker.publish_with_ids(
        jobs_vhost,
        "jobs",
        "job",
        [
            (route, body(id=route)),
            (copy, body(id=copy, **{"raise": "KeyError"})),
            (unprintable, body(id=unprintable, unprintable=True)),
        ],
        headers=lambda i: {FAULT: ["route", "copy", "none"][i]},
    )
    ordinary = _ids(30)
    broker.publish_with_ids(jobs_vhost, "jobs", "job", [(m, body(id=m)) for m in ordinary])
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(
        jobs_vhost, ledger, "--prefetch", "5", handler="tests.settle_handlers:unprintable_error"
    )
    consumers.append(consumer)

    # the unprintable error is transient (KeyError-like): retried, then exhausted
    _until_settled(jobs_vhost, ledger, consumer, ordinary, 3)
    assert consumer.stop() == 0, consumer.output()
    _once(ledger, ordinary)
    parked = _parked(jobs_vhost)
    for mid in (route, copy):
        headers = parked[mid]
        assert headers[h.PARK_REASON] == "internal_error", headers
        assert "Traceback (most recent call last)" in headers[h.TRACEBACK]
        assert len(headers[h.TRACEBACK]) <= h.TRACEBACK_MAX_CHARS
    assert "injected fault in the dispatcher" in parked[route][h.ERROR_MESSAGE]
    assert parked[route][FAULT] == "route"  # the delivery's headers kept where they can be
    assert FAULT not in parked[copy]  # its headers were what could not be written
    assert parked[unprintable][h.PARK_REASON] == "exhausted", parked[unprintable]
    assert "str() of the" in parked[unprintable][h.ERROR_MESSAGE]
    assert "internal error on a delivery" in consumer.output()


def test_a_message_no_copy_can_be_made_of_comes_back_until_the_broker_parks_it(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    """Not even a parking copy without its headers can be published: the consumer closes its
    channel rather than hold the delivery unsettled, the broker redelivers it, and its
    delivery limit (3 in jobs.toml) dead-letters it into parking. Messages published after
    are handled as usual."""
    (doomed,) = _ids(1, "doomed")
    broker.publish_with_ids(
        jobs_vhost,
        "jobs",
        "job",
        [(doomed, body(id=doomed, permanent=True))],
        headers=lambda i: {FAULT: "always"},
    )
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(
        jobs_vhost, ledger, "--prefetch", "5", handler="tests.settle_handlers:unprintable_error"
    )
    consumers.append(consumer)
    assert wait_until(lambda: broker.depths(jobs_vhost, [PARKING])[PARKING] == 1, 40), (
        consumer.output()
    )
    ordinary = _ids(20)
    broker.publish_with_ids(jobs_vhost, "jobs", "job", [(m, body(id=m)) for m in ordinary])
    _until_settled(jobs_vhost, ledger, consumer, ordinary, 1)
    assert consumer.stop() == 0, consumer.output()
    _once(ledger, ordinary)
    headers = _parked(jobs_vhost)[doomed]
    assert h.PARK_REASON not in headers  # parked by the broker, not by rmqkit
    assert any(d["reason"] == "delivery_limit" for d in headers["x-death"]), headers
    assert "closing the channel so the broker redelivers it" in consumer.output()


def test_two_slow_messages_in_a_window_of_three(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    """Two 8 s handlers among the first messages of a window of 3, then 200 fast ones: the one
    free slot keeps handling fast messages while both slow ones run (before: 1 at most)."""
    slow = _ids(2, "slow")
    fast = _ids(200)
    messages = [(slow[0], body(id=slow[0], sleep=8)), (fast[0], body(id=fast[0]))]
    messages += [(slow[1], body(id=slow[1], sleep=8)), *[(m, body(id=m)) for m in fast[1:]]]
    broker.publish_with_ids(jobs_vhost, "jobs", "job", messages)
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(jobs_vhost, ledger, "--prefetch", "3")
    consumers.append(consumer)

    assert wait_until(lambda: set(slow) <= set(effects(ledger)), 30), consumer.output()
    finished_at = {m: t for m, _, kind, t in events(ledger) if kind == "effect"}
    first_slow_done = min(finished_at[m] for m in slow)
    during = sum(1 for m in fast if m in finished_at and finished_at[m] < first_slow_done)
    assert during >= 100, f"only {during} of 200 fast messages handled beside two slow ones"
    _until_settled(jobs_vhost, ledger, consumer, [*slow, *fast], 0)
    assert consumer.stop() == 0, consumer.output()
    _once(ledger, [*slow, *fast])

"""Every delivery the consumer takes ends acked, retried or parked, and a slow message holds one
slot of the window, not the window. Against the real broker, with `rmqkit consume` running.

Asserts on what the broker holds (queue depths, the parked copies' headers) and on the handler
ledger (each ordinary message applied exactly once), never on how long anything took: the slow
message test counts how many fast messages were applied before the slow one finished.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from rmqkit import headers as h
from rmqkit.crypto import encrypt_fields, generate_keyring
from tests import broker
from tests.consumer_harness import ConsumerProcess, effects, events, wait_until
from tests.handlers import body

pytestmark = pytest.mark.semantics("4.3")

WORK, PARKING = "jobs.work", "jobs.work.parking"
MAX_INT64 = 2**63 - 1


def _ids(n: int, prefix: str = "m") -> list[str]:
    return [f"{prefix}-{uuid.uuid4().hex[:12]}" for _ in range(n)]


def _parked(vhost: str) -> dict[str, dict[str, Any]]:
    return {str(p["message_id"]): p["headers"] for p in broker.drain(vhost, PARKING)}


def _settled(vhost: str, ledger: Path, ordinary: list[str], parked: int) -> bool:
    done = set(effects(ledger)) >= set(ordinary)
    depth = broker.depths(vhost, [WORK, PARKING])
    return done and depth[WORK] == 0 and depth[PARKING] == parked


def _check_handled_once(ledger: Path, ordinary: list[str]) -> None:
    done = effects(ledger)
    assert set(ordinary) <= set(done)
    twice = {m: n for m, n in done.items() if m in set(ordinary) and n != 1}
    assert not twice, f"{len(twice)} ordinary messages applied more than once"


def with_env(monkeypatch: pytest.MonkeyPatch, **extra: str) -> None:
    """Pass ``extra`` to the consumers this test starts (the harness passes no RMQKIT_*)."""
    plain = broker.cli_env
    monkeypatch.setattr(broker, "cli_env", lambda vhost=None: {**plain(vhost), **extra})


def test_a_poison_body_is_parked_and_the_200_behind_it_are_handled_once(
    jobs_vhost: str,
    tmp_path: Path,
    consumers: list[ConsumerProcess],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An encrypted body holding an escaped lone surrogate (what JavaScript writes for a string
    cut inside an emoji), then 200 ordinary messages, prefetch 20.

    Before: the dispatcher let the decryption's UnicodeEncodeError escape, nothing was logged
    and the delivery was never settled; with the window's first tag unsettled no ack went out,
    19 messages were handled and then nothing (and again after every restart)."""
    ring = generate_keyring()
    with_env(monkeypatch, RMQKIT_KEYRING=ring.to_json())
    poison_id = _ids(1, "poison")[0]
    sealed = encrypt_fields(
        json.dumps({"id": poison_id, "customer": {"name": "Ada"}}).encode(),
        ["customer.name"],
        [],
        ring,
    )
    poison = sealed[:-1] + b',"note":"\\ud83d"}'
    ordinary = _ids(200)
    messages = [(poison_id, poison), *[(m, body(id=m)) for m in ordinary]]
    broker.publish_with_ids(jobs_vhost, "jobs", "job", messages)
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(jobs_vhost, ledger, "--prefetch", "20")
    consumers.append(consumer)

    def settled() -> bool:
        # The poison is parked, or (a decryption that keeps the escape as it is) handled.
        parked = broker.depths(jobs_vhost, [PARKING])[PARKING]
        return _settled(jobs_vhost, ledger, ordinary, parked or 0) and (
            parked == 1 or poison_id in effects(ledger)
        )

    assert wait_until(settled, 25), (
        f"{len(effects(ledger))} handled; {broker.depths(jobs_vhost, [WORK, PARKING])}\n"
        + consumer.output()
    )
    assert consumer.stop() == 0, consumer.output()
    _check_handled_once(ledger, ordinary)
    parked = _parked(jobs_vhost)
    assert set(parked) <= {poison_id}
    if parked:
        headers = parked[poison_id]
        # The decryption reports it undecryptable; should anything else in the path fail on
        # it, it is parked as an internal error with the traceback.
        assert headers[h.PARK_REASON] in {"undecryptable", "internal_error"}, headers
        if headers[h.PARK_REASON] == "internal_error":
            assert "Traceback" in headers[h.TRACEBACK]
    assert broker.depths(jobs_vhost, [WORK]) == {WORK: 0}


def test_attempt_and_x_death_counts_of_2_63_minus_1_are_parked(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    """A failing message whose rmqkit-attempt is 2**63-1, one whose x-death count is, then 50
    ordinary ones, prefetch 20.

    Before: attempt 2**63 went into the parking copy, which could not be encoded; the log said
    "will be redelivered" but the channel stayed open, so the delivery was never settled and
    the consumer stopped after the window."""
    huge_attempt, huge_death = _ids(1, "attempt")[0], _ids(1, "death")[0]
    death = {"queue": WORK, "reason": "rejected", "count": MAX_INT64, "exchange": "jobs"}
    broker.publish_with_ids(
        jobs_vhost,
        "jobs",
        "job",
        [
            (huge_attempt, body(id=huge_attempt, **{"raise": "KeyError"})),
            (huge_death, body(id=huge_death, **{"raise": "KeyError"})),
        ],
        headers=lambda i: {h.ATTEMPT: MAX_INT64} if i == 0 else {"x-death": [death]},
    )
    ordinary = _ids(50)
    broker.publish_with_ids(jobs_vhost, "jobs", "job", [(m, body(id=m)) for m in ordinary])
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(jobs_vhost, ledger, "--prefetch", "20")
    consumers.append(consumer)

    # Both end parked exhausted. 4.0+ may ignore a client's x-death: that one is then retried
    # through the tiers first (a few seconds) and parked at attempt 4.
    assert wait_until(lambda: _settled(jobs_vhost, ledger, ordinary, 2), 30), (
        f"{len(effects(ledger))} handled; {broker.depths(jobs_vhost, [WORK, PARKING])}\n"
        + consumer.output()
    )
    assert consumer.stop() == 0, consumer.output()
    _check_handled_once(ledger, ordinary)
    parked = _parked(jobs_vhost)
    assert set(parked) == {huge_attempt, huge_death}
    for headers in parked.values():
        assert headers[h.PARK_REASON] == "exhausted", headers
    assert parked[huge_attempt][h.ATTEMPT] == MAX_INT64  # the count as far as it can be written
    death_attempt = parked[huge_death][h.ATTEMPT]
    assert death_attempt == MAX_INT64 or (broker.version() >= (4, 0) and death_attempt == 4)


def test_a_slow_message_holds_one_slot_not_the_window(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    """An 8 s handler at the head of the window, then 500 fast messages, prefetch 20.

    Before: acks went out only as the finished prefix of the tags, so the slow message's
    unacked tag held the window: 19 fast messages were handled while it ran, 19 slots idle.
    Now the finished ones are acked past it: nearly all 500 are handled before it finishes."""
    (slow,) = _ids(1, "slow")
    fast = _ids(500)
    broker.publish_with_ids(jobs_vhost, "jobs", "job", [(slow, body(id=slow, sleep=8))])
    broker.publish_with_ids(jobs_vhost, "jobs", "job", [(m, body(id=m)) for m in fast])
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(jobs_vhost, ledger, "--prefetch", "20")
    consumers.append(consumer)

    assert wait_until(lambda: slow in effects(ledger), 30), consumer.output()
    finished_at = {m: t for m, _, kind, t in events(ledger) if kind == "effect"}
    during = sum(1 for m in fast if m in finished_at and finished_at[m] < finished_at[slow])
    assert during >= 400, f"only {during} of 500 fast messages handled while the slow one ran"
    assert wait_until(lambda: _settled(jobs_vhost, ledger, [slow, *fast], 0), 20)
    assert consumer.stop() == 0, consumer.output()
    _check_handled_once(ledger, [slow, *fast])


def test_the_watchdog_names_a_delivery_unsettled_past_the_handler_timeout(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    """A handler that ignores its timeout's cancellation and runs 6 s past a 1 s timeout: the
    log names the delivery (message id, queue, tag, age) while it is unsettled; it is acked
    when the handler finally returns (late, but done), and the messages beside it go on."""
    (stuck,) = _ids(1, "stuck")
    ordinary = _ids(20)
    messages = [(stuck, body(id=stuck, stubborn=6)), *[(m, body(id=m)) for m in ordinary]]
    broker.publish_with_ids(jobs_vhost, "jobs", "job", messages)
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(
        jobs_vhost,
        ledger,
        "--prefetch",
        "5",
        "--handler-timeout",
        "1s",
        handler="tests.settle_handlers:stubborn",
    )
    consumers.append(consumer)
    named = f"(message_id {stuck}) from {WORK} unsettled for"
    assert wait_until(lambda: named in consumer.output(), 20), consumer.output()
    assert stuck not in effects(ledger)  # named while it was still running
    assert wait_until(lambda: _settled(jobs_vhost, ledger, [stuck, *ordinary], 0), 20)
    assert consumer.stop() == 0, consumer.output()
    _check_handled_once(ledger, [stuck, *ordinary])
    line = next(x for x in consumer.output().splitlines() if named in x)
    assert "delivery 1 " in line and "past the handler timeout" in line, line

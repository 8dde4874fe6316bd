"""The rmqkit_broker fixture on the real broker, and run_handler checked against the real consumer:
the same handler, body and headers through both must end the same way (parked with the same
reason and headers, or acked), or run_handler must refuse with a clear error.

Each test has a vhost of its own (the fixture's: one per use, deleted after the test).
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import rmqkit
from rmqkit import headers as h
from rmqkit.parking.model import ParkedMessage
from rmqkit.settings import Settings, load_settings
from rmqkit.testing import HandlerAborted, HandlerResult, RmqkitBroker, run_handler, run_retries
from tests import broker

QUEUE = "tp.work"
TOPOLOGY = """
[exchanges.tp]
type = "direct"

[queues."tp.work"]
bind = [{ exchange = "tp", routing_key = "tp" }]
retry_delays = ["300ms"]
jitter = 0.0
jitter_slots = 1
max_attempts = 2
delivery_limit = 5
permanent_errors = ["LookupError"]
"""
# Written per failure; the rest of the copy's headers must be equal between the two.
PER_RUN = {h.FIRST_FAILED_AT, h.LAST_FAILED_AT, h.HOST, h.PID, h.TRACEBACK}


@pytest.fixture
def rmqkit_settings() -> Settings:
    """The broker under test (RMQKIT_TEST_*), as every integration test reaches it."""
    return load_settings(url=broker.BASE_URL, management_url=broker.MGMT)


@pytest.fixture
def topology(tmp_path: Path) -> Path:
    path = tmp_path / "tp.toml"
    path.write_text(TOPOLOGY)
    return path


class Job(BaseModel):
    do: str


def handle(job: Job) -> None:
    """One handler for every case: the body says what to do."""
    if job.do == "ok":
        return
    if job.do == "permanent":
        raise rmqkit.Permanent("job refused")
    if job.do == "missing":
        raise KeyError("no such customer")  # a LookupError: permanent in the topology
    if job.do == "flaky":
        raise ConnectionError("service down")
    raise ValueError(f"unknown job {job.do!r}")


def _comparable(headers: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in headers.items():
        if key in PER_RUN or key.startswith("x-"):
            continue
        out[key] = value.decode() if isinstance(value, bytes) else value
    return out


def _assert_agree(parked: ParkedMessage, predicted: HandlerResult) -> None:
    assert predicted.action == "park", predicted
    assert parked.reason == predicted.reason
    assert parked.error_type == predicted.error_type
    assert parked.error_message == predicted.error_message
    assert _comparable(parked.headers) == _comparable(predicted.headers)


def _by_id(parked: list[ParkedMessage]) -> dict[str | None, ParkedMessage]:
    return {p.message_id: p for p in parked}


def test_run_handler_predicts_what_the_consumer_does(
    rmqkit_broker: RmqkitBroker, topology: Path
) -> None:
    rmqkit_broker.declare(topology)
    bodies = {
        "ok": b'{"do": "ok"}',
        "permanent": b'{"do": "permanent"}',
        "missing": b'{"do": "missing"}',
        "flaky": b'{"do": "flaky"}',
        "invalid": b'{"do": 5}',
        "not-json": b"\xff\xfe not json",
    }
    for message_id, body in bodies.items():
        rmqkit_broker.publish("tp", "tp", body, message_id=message_id, headers={"tenant": "t1"})

    settled = rmqkit_broker.consume_until_idle(handle, QUEUE, timeout_s=20)

    depths = rmqkit_broker.depths()
    assert depths[QUEUE] == 0
    assert depths["tp.work.parking"] == 5
    assert settled == 7  # six deliveries, and the flaky one's retry
    parked = _by_id(rmqkit_broker.parked(QUEUE))
    assert set(parked) == set(bodies) - {"ok"}
    assert run_handler(handle, bodies["ok"], topology=topology).action == "ack"
    for message_id, body in bodies.items():
        if message_id == "ok":
            continue
        found = parked[message_id]
        predicted = run_retries(
            handle,
            body,
            topology=topology,
            message_id=message_id,
            exchange="tp",
            routing_key="tp",
            headers={"tenant": "t1"},
        )[-1]
        _assert_agree(found, predicted)
    reasons = {mid: p.reason for mid, p in parked.items()}
    assert reasons == {
        "permanent": "permanent",
        "missing": "permanent",
        "flaky": "exhausted",
        "invalid": "undecodable",
        "not-json": "undecodable",
    }
    assert parked["flaky"].attempts == 2


def test_retry_copies_wait_in_the_tier_run_handler_names(
    rmqkit_broker: RmqkitBroker, tmp_path: Path
) -> None:
    # A long tier, so that the copy is still waiting when the consumer is idle.
    slow = tmp_path / "slow.toml"
    slow.write_text(TOPOLOGY.replace('retry_delays = ["300ms"]', 'retry_delays = ["30s"]'))
    rmqkit_broker.declare(slow)
    rmqkit_broker.publish("tp", "tp", b'{"do": "flaky"}', message_id="m1")
    predicted = run_handler(handle, b'{"do": "flaky"}', topology=slow)
    assert (predicted.action, predicted.tier, predicted.target_queue) == (
        "retry",
        0,
        "tp.work.wait.30s",
    )
    # The first delivery only: the copy is left in its wait queue (not waited for).
    rmqkit_broker.consume_until_idle(handle, QUEUE, waiting=False, idle_s=0.2, timeout_s=10)
    depths = rmqkit_broker.depths(QUEUE, "tp.work.wait.30s", "tp.work.parking")
    assert depths == {QUEUE: 0, "tp.work.wait.30s": 1, "tp.work.parking": 0}


# --- adversarial: try to make run_handler and the consumer disagree ------------------------------


def test_a_handler_that_mutates_the_headers(rmqkit_broker: RmqkitBroker, topology: Path) -> None:
    def meddles(message: rmqkit.Message) -> None:
        message.headers["tenant"] = "changed"
        message.headers[h.ATTEMPT] = 7  # says this delivery is past max_attempts
        message.headers[h.PARK_REASON] = "forged"
        raise ConnectionError("down")

    rmqkit_broker.declare(topology)
    rmqkit_broker.publish("tp", "tp", b"{}", message_id="mut", headers={"tenant": "t1"})
    rmqkit_broker.consume_until_idle(meddles, QUEUE, timeout_s=15)
    [parked] = rmqkit_broker.parked(QUEUE)
    predicted = run_retries(
        meddles,
        b"{}",
        topology=topology,
        message_id="mut",
        exchange="tp",
        routing_key="tp",
        headers={"tenant": "t1"},
    )
    assert [r.action for r in predicted] == ["park"]  # the forged attempt counts in both
    _assert_agree(parked, predicted[-1])


def test_a_body_that_is_not_utf8_for_a_text_handler(
    rmqkit_broker: RmqkitBroker, topology: Path
) -> None:
    def as_text(text: str) -> None:
        assert text

    body = b"caf\xe9 \xff"
    rmqkit_broker.declare(topology)
    rmqkit_broker.publish("tp", "tp", body, message_id="latin1")
    rmqkit_broker.consume_until_idle(as_text, QUEUE, timeout_s=15)
    [parked] = rmqkit_broker.parked(QUEUE)
    predicted = run_handler(
        as_text, body, topology=topology, message_id="latin1", exchange="tp", routing_key="tp"
    )
    assert predicted.reason == "undecodable"
    _assert_agree(parked, predicted)
    assert parked.body == body


@pytest.mark.parametrize("attempt_header", [2**63 - 1, -5, "12", "garbage"])
def test_attempt_headers_out_of_range_or_typed_by_hand(
    rmqkit_broker: RmqkitBroker, topology: Path, attempt_header: Any
) -> None:
    rmqkit_broker.declare(topology)
    headers = {h.ATTEMPT: attempt_header}
    rmqkit_broker.publish("tp", "tp", b'{"do": "flaky"}', message_id="a", headers=headers)
    rmqkit_broker.consume_until_idle(handle, QUEUE, timeout_s=15)
    [parked] = rmqkit_broker.parked(QUEUE)
    predicted = run_retries(
        handle,
        b'{"do": "flaky"}',
        topology=topology,
        headers=headers,
        message_id="a",
        exchange="tp",
        routing_key="tp",
    )
    _assert_agree(parked, predicted[-1])
    assert parked.attempts == predicted[-1].attempt
    assert rmqkit_broker.depths(QUEUE)[QUEUE] == 0


@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit])
def test_base_exceptions_take_no_decision_in_either(
    rmqkit_broker: RmqkitBroker, topology: Path, raised: type[BaseException]
) -> None:
    def aborts(message: rmqkit.Message) -> None:
        raise raised()

    with pytest.raises(HandlerAborted, match=raised.__name__):
        run_handler(aborts, b"{}", topology=topology)
    rmqkit_broker.declare(topology)
    rmqkit_broker.publish("tp", "tp", b"{}", message_id="abort")
    escaped: BaseException | None = None
    try:
        rmqkit_broker.consume_until_idle(aborts, QUEUE, timeout_s=5)
    except BaseException as exc:  # the consumer does not catch it: it stops, unsettled
        escaped = exc
    assert isinstance(escaped, raised)
    # Not acked, retried or parked: back in the work queue for the broker to redeliver.
    depths = rmqkit_broker.depths(QUEUE, "tp.work.parking", "tp.work.wait.300ms")
    assert depths == {QUEUE: 1, "tp.work.parking": 0, "tp.work.wait.300ms": 0}


# The consumer's side drops the coroutine unawaited (Python warns): that is what is shown here.
@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
def test_a_handler_returning_a_coroutine_without_awaiting_it(
    rmqkit_broker: RmqkitBroker, topology: Path
) -> None:
    ran: list[str] = []

    async def side_effect() -> None:
        ran.append("async")
        raise ConnectionError("never seen by the consumer")

    async def forgets(message: rmqkit.Message) -> Any:
        return side_effect()  # not awaited

    def sync_returns(message: rmqkit.Message) -> Any:
        return side_effect()  # a plain def's awaitable: the consumer awaits it

    from rmqkit.testing import UnawaitedResult

    with pytest.raises(UnawaitedResult, match="without awaiting"):
        run_handler(forgets, b"{}", topology=topology)
    assert ran == []

    rmqkit_broker.declare(topology)
    rmqkit_broker.publish("tp", "tp", b"{}", message_id="forgot")
    rmqkit_broker.consume_until_idle(forgets, QUEUE, timeout_s=10)
    # The consumer acked it, and the coroutine never ran: what run_handler refuses to hide.
    assert rmqkit_broker.depths(QUEUE, "tp.work.parking") == {QUEUE: 0, "tp.work.parking": 0}
    assert ran == []

    rmqkit_broker.publish("tp", "tp", b"{}", message_id="sync")
    rmqkit_broker.consume_until_idle(sync_returns, QUEUE, timeout_s=15)
    [parked] = rmqkit_broker.parked(QUEUE)
    predicted = run_retries(
        sync_returns, b"{}", topology=topology, message_id="sync", exchange="tp", routing_key="tp"
    )
    _assert_agree(parked, predicted[-1])
    assert parked.reason == "exhausted"


def test_the_vhost_is_deleted_after_a_failing_test(tmp_path: Path) -> None:
    (tmp_path / "test_fails.py").write_text(
        textwrap.dedent(
            f"""
            import pytest
            from rmqkit.settings import load_settings

            @pytest.fixture
            def rmqkit_settings():
                return load_settings(url={broker.BASE_URL!r}, management_url={broker.MGMT!r})

            def test_fails(rmqkit_broker):
                print("VHOST=" + rmqkit_broker.vhost + "=")
                assert rmqkit_broker.depths() == {{}}
                raise AssertionError("boom")
            """
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-s", "-p", "no:cacheprovider", "test_fails.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    found = re.search(r"VHOST=([^=\s]+)=", result.stdout)
    assert found is not None, result.stdout
    vhost = found.group(1)
    assert vhost.startswith("rmqkit-pytest-")
    assert broker.api("GET", f"/vhosts/{broker.q(vhost)}").status_code == 404


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str() of this error fails")


def odd_failures(message: rmqkit.Message) -> None:
    if message.message_id == "unprintable":
        raise Unprintable()
    raise rmqkit.Retry(delay_s=1e9, reason="later, much later")  # past every tier: the longest


def test_an_unprintable_error_and_a_retry_past_every_tier(
    rmqkit_broker: RmqkitBroker, topology: Path
) -> None:
    rmqkit_broker.declare(topology)
    for message_id in ("unprintable", "far"):
        rmqkit_broker.publish("tp", "tp", b"{}", message_id=message_id)
    rmqkit_broker.consume_until_idle(odd_failures, QUEUE, timeout_s=15)
    parked = _by_id(rmqkit_broker.parked(QUEUE))
    assert set(parked) == {"unprintable", "far"}
    for message_id, found in parked.items():
        predicted = run_retries(
            odd_failures,
            b"{}",
            topology=topology,
            message_id=message_id,
            exchange="tp",
            routing_key="tp",
        )
        assert [r.action for r in predicted] == ["retry", "park"]
        _assert_agree(found, predicted[-1])


def test_consume_until_idle_gives_up_after_its_timeout(
    rmqkit_broker: RmqkitBroker, topology: Path
) -> None:
    import time

    def slow(message: rmqkit.Message) -> None:
        time.sleep(2)

    rmqkit_broker.declare(topology)
    rmqkit_broker.publish("tp", "tp", b"{}", message_id="slow")
    with pytest.raises(TimeoutError, match=r"not idle after 0\.5s"):
        rmqkit_broker.consume_until_idle(slow, QUEUE, timeout_s=0.5)
    # stopped with its grace: the handler finished and the message was acked, nothing parked
    assert rmqkit_broker.depths(QUEUE, "tp.work.parking") == {QUEUE: 0, "tp.work.parking": 0}

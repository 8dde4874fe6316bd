"""rmqkit.testing.run_handler: every outcome the consumer can take on one message, no broker."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import rmqkit
from rmqkit import headers as h
from rmqkit.errors import ConfigError, UsageError
from rmqkit.testing import (
    HandlerAborted,
    UnawaitedResult,
    run_handler,
    run_handler_async,
    run_retries,
)

ROOT = Path(__file__).resolve().parents[2]
JOBS = ROOT / "tests" / "topologies" / "jobs.toml"  # tiers 1s, 2s; max_attempts 4


class Order(BaseModel):
    id: int
    amount: float


class PaymentDeclined(Exception):
    pass


class CardExpired(PaymentDeclined):
    pass


def ok_sync(message: rmqkit.Message) -> None:
    pass


async def ok_async(order: Order) -> None:
    assert order.id >= 0


def flaky(message: rmqkit.Message) -> None:
    raise ConnectionError("the payment service is down")


async def flaky_async(message: rmqkit.Message) -> None:
    await asyncio.sleep(0)
    raise ConnectionError("the payment service is down")


def declined(message: rmqkit.Message) -> None:
    raise CardExpired("card 4242 expired")


def permanent(message: rmqkit.Message) -> None:
    raise rmqkit.Permanent("order 7 was cancelled")


def reads_json(message: rmqkit.Message) -> None:
    message.json()


def takes_model(order: Order) -> None:
    pass


def wants_retry_in_5s(message: rmqkit.Message) -> None:
    raise rmqkit.Retry(delay_s=1.5, reason="rate limited")


def test_success_is_an_ack_for_sync_and_async_handlers() -> None:
    assert run_handler(ok_sync, b"anything").action == "ack"
    result = run_handler(ok_async, b'{"id": 1, "amount": 9.5}')
    assert (result.action, result.headers, result.reason) == ("ack", {}, None)


def test_a_transient_error_retries_at_the_tier_of_its_attempt() -> None:
    # jobs.toml: tiers 1s and 2s, 4 attempts; the last tier repeats
    tiers = [run_handler(flaky, b"{}", topology=JOBS, attempt=n) for n in (1, 2, 3)]
    assert [(r.action, r.tier, r.delay_s) for r in tiers] == [
        ("retry", 0, 1.0),
        ("retry", 1, 2.0),
        ("retry", 1, 2.0),
    ]
    first = tiers[0]
    assert first.target_queue is not None and first.target_queue.startswith("jobs.work.wait.1s")
    assert first.error_type == "ConnectionError"
    assert first.error_message == "the payment service is down"
    assert first.headers[h.ATTEMPT] == 1
    assert first.headers[h.ORIGIN_QUEUE] == "jobs.work"
    assert h.PARK_REASON not in first.headers


def test_async_handlers_retry_the_same_way() -> None:
    result = run_handler(flaky_async, b"{}", topology=JOBS, attempt=2)
    assert (result.action, result.tier, result.error_type) == ("retry", 1, "ConnectionError")


def test_the_last_attempt_parks_as_exhausted() -> None:
    result = run_handler(flaky, b"{}", topology=JOBS, attempt=4)
    assert (result.action, result.reason, result.target_queue) == (
        "park",
        "exhausted",
        "jobs.work.parking",
    )
    assert result.headers[h.ATTEMPT] == 4
    assert result.traceback is not None and "ConnectionError" in result.traceback
    # max_attempts given as a keyword wins over the file's, as `consume --max-attempts` does
    assert run_handler(flaky, b"{}", topology=JOBS, attempt=2, max_attempts=2).reason == (
        "exhausted"
    )


def test_the_attempt_is_read_from_the_headers_too() -> None:
    result = run_handler(flaky, b"{}", topology=JOBS, headers={h.ATTEMPT: 3})
    assert (result.attempt, result.reason) == (4, "exhausted")


def test_without_a_topology_the_file_defaults_apply() -> None:
    # defaults: tiers 1s, 10s, 60s, 300s and 5 attempts
    assert run_handler(flaky, b"", attempt=4).delay_s == 300.0
    assert run_handler(flaky, b"", attempt=5).reason == "exhausted"
    assert run_handler(flaky, b"", retry_delays=["5s"], attempt=1).delay_s == 5.0


def test_no_retry_tiers_park_the_first_failure() -> None:
    assert run_handler(flaky, b"", retry_delays=[]).reason == "exhausted"


def test_permanent_parks_at_once() -> None:
    result = run_handler(permanent, b"{}", topology=JOBS)
    assert (result.action, result.reason, result.error_type) == (
        "park",
        "permanent",
        "rmqkit.Permanent",
    )
    assert result.error_message == "order 7 was cancelled"


def test_permanent_error_patterns_match_the_type_and_its_bases() -> None:
    assert run_handler(declined, b"", permanent_errors=["CardExpired"]).reason == "permanent"
    assert run_handler(declined, b"", permanent_errors=["PaymentDeclined"]).reason == "permanent"
    qualified = f"{__name__}.PaymentDeclined"
    assert run_handler(declined, b"", permanent_errors=[qualified]).reason == "permanent"
    assert run_handler(declined, b"", permanent_errors=["ValueError"]).action == "retry"


def test_permanent_errors_from_the_topology(tmp_path: Path) -> None:
    path = tmp_path / "pay.toml"
    path.write_text(
        textwrap.dedent(
            """
            [exchanges.pay]
            [queues."pay.work"]
            bind = [{ exchange = "pay", routing_key = "pay" }]
            retry_delays = ["1s"]
            permanent_errors = ["PaymentDeclined"]
            """
        )
    )
    assert run_handler(declined, b"", topology=path).reason == "permanent"
    assert run_handler(flaky, b"", topology=path).action == "retry"


def test_an_undecodable_body_parks_as_undecodable() -> None:
    result = run_handler(reads_json, b"\xff not json")
    assert (result.action, result.reason) == ("park", "undecodable")
    assert result.error_type == "rmqkit.DecodeError"
    not_json = run_handler(takes_model, b"not json")
    assert not_json.reason == "undecodable"


def test_a_body_failing_the_model_parks_as_undecodable_before_the_handler_runs() -> None:
    calls: list[Order] = []

    def handler(order: Order) -> None:
        calls.append(order)

    result = run_handler(handler, b'{"id": "seven", "amount": 1}')
    assert (result.action, result.reason) == ("park", "undecodable")
    assert result.error_message is not None and "id" in result.error_message
    assert "seven" not in result.error_message  # the body's values are never quoted
    assert calls == []
    assert run_handler(handler, '{"id": 7, "amount": 1}').action == "ack"
    assert calls == [Order(id=7, amount=1)]


def test_retry_with_a_delay_picks_the_tier() -> None:
    result = run_handler(wants_retry_in_5s, b"", topology=JOBS)
    assert (result.action, result.delay_s, result.error_message) == ("retry", 2.0, "rate limited")


def test_a_handler_timeout_is_a_transient_failure() -> None:
    async def slow(message: rmqkit.Message) -> None:
        await asyncio.sleep(5)

    result = run_handler(slow, b"", handler_timeout_s=0.05)
    assert (result.action, result.error_type) == ("retry", "rmqkit.HandlerTimeout")


def test_a_handler_given_as_module_function(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "g_unit_handlers.py").write_text(
        "import rmqkit\n"
        "def handle(message: rmqkit.Message) -> None:\n"
        "    raise rmqkit.Permanent('no such customer')\n"
    )
    monkeypatch.chdir(tmp_path)
    result = run_handler("g_unit_handlers:handle", b"{}")
    assert (result.reason, result.error_message) == ("permanent", "no such customer")
    with pytest.raises(ConfigError, match="has no attribute"):
        run_handler("g_unit_handlers:missing", b"{}")


def test_the_copy_keeps_the_route_and_message_headers() -> None:
    result = run_handler(
        flaky, b"", exchange="orders", routing_key="order.new", headers={"tenant": "acme"}
    )
    assert result.headers["tenant"] == "acme"
    assert result.headers[h.ORIGINAL_EXCHANGE] == "orders"
    assert result.headers[h.ORIGINAL_ROUTING_KEY] == "order.new"


def test_the_callers_headers_are_not_changed() -> None:
    given: dict[str, Any] = {"tenant": "acme"}

    def meddles(message: rmqkit.Message) -> None:
        message.headers["tenant"] = "other"
        raise ConnectionError("down")

    result = run_handler(meddles, b"", headers=given)
    assert given == {"tenant": "acme"}
    assert result.headers["tenant"] == "other"  # as the consumer's copy would carry it


def test_keyboard_interrupt_and_system_exit_are_not_outcomes() -> None:
    def interrupted(message: rmqkit.Message) -> None:
        raise KeyboardInterrupt

    async def exits(message: rmqkit.Message) -> None:
        raise SystemExit(3)

    for handler in (interrupted, exits):
        with pytest.raises(HandlerAborted, match="not an Exception") as caught:
            run_handler(handler, b"")
        assert isinstance(caught.value.__cause__, KeyboardInterrupt | SystemExit)


def test_bad_arguments_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="attempt"):
        run_handler(ok_sync, b"", attempt=0)
    with pytest.raises(UsageError, match="max_attempts"):
        run_handler(ok_sync, b"", max_attempts=0)
    with pytest.raises(UsageError, match="retry_delays"):
        run_handler(ok_sync, b"", topology=JOBS, retry_delays=["1s"])
    with pytest.raises(ConfigError, match="no work queue"):
        run_handler(ok_sync, b"", topology=JOBS, queue="nope")


def test_inside_an_event_loop_run_handler_async_is_the_one_to_use() -> None:
    async def main() -> str:
        with pytest.raises(UsageError, match="run_handler_async"):
            run_handler(ok_sync, b"")
        return (await run_handler_async(flaky, b"", attempt=5)).action

    assert asyncio.run(main()) == "park"


def test_run_retries_follows_the_copies_to_the_end() -> None:
    results = run_retries(flaky, b"{}", topology=JOBS, exchange="jobs", routing_key="job")
    assert [(r.action, r.attempt, r.tier) for r in results] == [
        ("retry", 1, 0),
        ("retry", 2, 1),
        ("retry", 3, 1),
        ("park", 4, None),
    ]
    last = results[-1]
    assert last.reason == "exhausted"
    # the producer's route is kept although the retries came back through the default exchange
    assert last.headers[h.ORIGINAL_EXCHANGE] == "jobs"
    assert last.headers[h.ORIGINAL_ROUTING_KEY] == "job"
    assert last.headers[h.FIRST_FAILED_AT] == results[0].headers[h.FIRST_FAILED_AT]
    assert [r.action for r in run_retries(ok_sync, b"")] == ["ack"]


def test_an_async_handler_returning_an_unawaited_coroutine_is_refused() -> None:
    async def send() -> None:
        raise AssertionError("never runs")

    async def forgets(message: rmqkit.Message) -> object:
        return send()

    def plain(message: rmqkit.Message) -> object:
        return send()  # a plain def's awaitable is awaited by the consumer

    with pytest.raises(UnawaitedResult, match="without awaiting"):
        run_handler(forgets, b"")
    assert run_handler(plain, b"").error_type == "AssertionError"


def test_checks_before_the_handler_too_large_and_missing_message_id(tmp_path: Path) -> None:
    path = tmp_path / "strict.toml"
    path.write_text(
        textwrap.dedent(
            """
            [exchanges.s]
            [queues."s.work"]
            bind = [{ exchange = "s", routing_key = "s" }]
            require_message_id = true
            max_message_bytes = 8
            """
        )
    )
    calls: list[bytes] = []

    def handler(body: bytes) -> None:
        calls.append(body)

    assert run_handler(handler, b"123456789", topology=path).reason == "too_large"
    assert run_handler(handler, b"1", topology=path, message_id=None).reason == (
        "missing_message_id"
    )
    assert run_handler(handler, b"1", topology=path).action == "ack"
    assert calls == [b"1"]


def test_the_pytest_plugin_is_registered_and_light() -> None:
    import importlib.metadata
    import subprocess
    import sys

    plugins = {e.name: e.value for e in importlib.metadata.entry_points(group="pytest11")}
    assert plugins.get("rmqkit") == "rmqkit.testing.plugin"
    # pytest loads it in every run of every project that has rmqkit installed: nothing heavy
    code = (
        "import sys, rmqkit.testing.plugin\n"
        "heavy = ('aio_pika', 'aiormq', 'pamqp', 'httpx', 'pydantic', 'rmqkit.consumer',"
        " 'rmqkit.broker', 'rmqkit.topology', 'rmqkit.testing.handlers')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


def test_a_handler_taking_a_transaction_gets_the_one_given() -> None:
    seen: list[object] = []

    def with_tx(message: rmqkit.Message, tx: rmqkit.Transaction) -> None:
        seen.append(tx)
        raise ConnectionError("store down")

    with pytest.raises(UsageError, match="transaction="):
        run_handler(with_tx, b"")
    stand_in = object()
    assert run_handler(with_tx, b"", transaction=stand_in).action == "retry"
    assert seen == [stand_in]

"""rmqkit.consumer.hooks without a broker: the Hooks checks, where a consumer finds its hooks,
the events built from decisions (nothing decrypted in them), and the hook caller: a hook that
raises, hangs (async or def, or swallows its cancellation) is logged by name and the next
event goes on; a backlog is bounded. Also runs docs/hooks.md's Sentry recipe against a fake
``sentry_sdk``."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import sys
import threading
import time
import types
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import rmqkit
from rmqkit import headers as h
from rmqkit.consumer.decision import Failed, HandlerTimeout, Park, RetryLater, decide
from rmqkit.consumer.hooks import (
    HookRunner,
    Hooks,
    OutcomeEvent,
    copy_event,
    hook_name,
    hooks_for,
    internal_error_event,
    success_event,
)
from rmqkit.consumer.loading import handler_from_callable
from rmqkit.consumer.policy import QueuePolicy
from rmqkit.errors import ConfigError, UsageError

DOCS = Path(__file__).resolve().parents[2] / "docs" / "hooks.md"
POLICY = QueuePolicy(
    queue="jobs.work",
    parking_queue="jobs.work.parking",
    retry_delays_ms=(1000, 2000),
    max_attempts=3,
    wait_queues=(("jobs.work.wait.1s",), ("jobs.work.wait.2s",)),
)


class _Config:
    """What copy_event reads of a ConsumerConfig."""

    queue = "jobs.work"
    tier_names = ("1s", "2s")


def event(kind: str = "park", **more: Any) -> OutcomeEvent:
    return OutcomeEvent(kind, "jobs.work", "m-1", 1, **more)  # type: ignore[arg-type]


def decided(outcome: Any, headers: dict[str, Any] | None = None) -> RetryLater | Park:
    decision = decide(
        outcome,
        headers,
        POLICY,
        exchange="jobs",
        routing_key="job",
        now=datetime.now(UTC),
        host="h",
        pid=1,
        rand=lambda: 0.0,
    )
    assert isinstance(decision, RetryLater | Park)
    return decision


# --- Hooks and where they come from ------------------------------------------------------------


def test_hooks_refuse_what_cannot_be_a_hook() -> None:
    with pytest.raises(ConfigError, match="on_park"):
        Hooks(on_park="not callable")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="timeout_s"):
        Hooks(timeout_s=0)
    with pytest.raises(ConfigError, match="max_pending"):
        Hooks(max_pending=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        Hooks().timeout_s = 3  # type: ignore[misc]


def on_park_here(e: OutcomeEvent) -> None:
    return None


def test_describe_names_each_hook_for_the_start_line() -> None:
    hooks = Hooks(on_park=on_park_here, timeout_s=2)
    assert hooks.describe() == f"on_park={__name__}.on_park_here (timeout 2s)"
    assert Hooks().describe() == "none (timeout 5s)"
    assert hook_name(lambda e: None).endswith("<lambda>")


async def module_handler(body: bytes) -> None:
    return None


def test_hooks_for_prefers_the_explicit_then_the_handler_module(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loaded = handler_from_callable(module_handler)
    assert hooks_for(None, loaded) is None  # this module defines no rmqkit_hooks
    mine = Hooks(on_park=on_park_here)
    monkeypatch.setattr(sys.modules[__name__], "rmqkit_hooks", mine, raising=False)
    assert hooks_for(None, loaded) is mine
    other = Hooks(on_retry=on_park_here)
    assert hooks_for(other, loaded) is other
    assert hooks_for(Hooks(), loaded) is None  # explicit and empty: off
    with pytest.raises(UsageError):
        hooks_for({"on_park": on_park_here}, loaded)  # type: ignore[arg-type]
    monkeypatch.setattr(sys.modules[__name__], "rmqkit_hooks", {"on_park": on_park_here})
    with pytest.raises(ConfigError, match=r"rmqkit_hooks must be rmqkit\.Hooks"):
        hooks_for(None, loaded)


async def elsewhere_handler(body: bytes) -> None:
    return None


def test_a_routed_handler_s_hooks_come_from_its_routes_module(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    one, two = types.SimpleNamespace(target=module_handler), types.SimpleNamespace(target=print)
    routed = types.SimpleNamespace(
        target=print, routes=types.SimpleNamespace(handlers={"a": one, "b": two})
    )
    assert hooks_for(None, routed) is None  # type: ignore[arg-type]
    mine = Hooks(on_park=on_park_here)
    monkeypatch.setattr(sys.modules[__name__], "rmqkit_hooks", mine, raising=False)
    assert hooks_for(None, routed) is mine  # type: ignore[arg-type]
    other = types.ModuleType("other_routes")
    other.rmqkit_hooks = Hooks(on_retry=on_park_here)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "other_routes", other)
    monkeypatch.setattr(elsewhere_handler, "__module__", "other_routes")
    routed.routes.handlers["c"] = types.SimpleNamespace(target=elsewhere_handler)
    with pytest.raises(ConfigError, match="each define hooks"):
        hooks_for(None, routed)  # type: ignore[arg-type]


# --- the events ----------------------------------------------------------------------------------


def test_park_and_retry_events_carry_the_copy_s_record() -> None:
    exc = ValueError("bad amount")
    park = decided(Failed.from_exception(exc, permanent=True))
    parked = copy_event(_Config(), "m-1", 1, park, Failed.from_exception(exc, permanent=True))  # type: ignore[arg-type]
    assert (parked.kind, parked.reason, parked.target_queue) == (
        "park",
        "permanent",
        "jobs.work.parking",
    )
    assert (parked.exchange, parked.routing_key) == ("jobs", "job")
    assert parked.error_type == "ValueError" and parked.error_message == "bad amount"
    assert parked.exception is exc
    retry = decided(HandlerTimeout(2.0))
    retried = copy_event(_Config(), "m-1", 1, retry, HandlerTimeout(2.0))  # type: ignore[arg-type]
    assert (retried.kind, retried.tier, retried.delay_s, retried.reason) == (
        "retry",
        "1s",
        1.0,
        None,
    )
    assert retried.target_queue == "jobs.work.wait.1s" and retried.exception is None
    assert retried.error_type == "rmqkit.HandlerTimeout"


def test_a_masked_outcome_gives_no_exception_and_the_withheld_text() -> None:
    secret = "SENTINEL-4411"
    masked = dataclasses.replace(
        Failed.from_exception(ValueError(f"bad {secret}")),
        exc_message="<withheld: the message had decrypted fields>",
        exception=None,
    )
    made = copy_event(_Config(), "m-1", 2, decided(masked), masked)  # type: ignore[arg-type]
    assert made.exception is None and secret not in repr(made)
    assert made.error_message == "<withheld: the message had decrypted fields>"


def test_event_repr_leaves_out_the_exception_and_success_reads_the_kept_route() -> None:
    exc = RuntimeError("x" * 50)
    assert "xxxx" not in repr(event(exception=exc))
    deliver = types.SimpleNamespace(exchange="", routing_key="jobs.work")
    kept = {h.ORIGINAL_EXCHANGE: b"jobs", h.ORIGINAL_ROUTING_KEY: "job"}
    made = success_event("jobs.work", "m-1", 2, deliver, kept)
    assert (made.kind, made.exchange, made.routing_key, made.attempt) == (
        "success",
        "jobs",
        "job",
        2,
    )
    first = success_event(
        "jobs.work", "m-1", 1, types.SimpleNamespace(exchange="jobs", routing_key="job"), {}
    )
    assert (first.exchange, first.routing_key) == ("jobs", "job")


def test_internal_error_event_withholds_on_a_decrypting_consumer() -> None:
    exc = KeyError("SENTINEL-99")
    shown = internal_error_event("q", "m", ("m", 3), exc, withhold=False)
    assert shown.reason == "internal_error" and shown.attempt == 3 and shown.exception is exc
    hidden = internal_error_event("q", "m", None, exc, withhold=True)
    assert hidden.exception is None and hidden.error_message is None and hidden.attempt == 1
    assert "SENTINEL" not in repr(hidden)


# --- calling the hooks ---------------------------------------------------------------------------


async def _run_events(runner: HookRunner, events: list[OutcomeEvent], wait_s: float = 5) -> None:
    task = asyncio.create_task(runner.run())
    try:
        for one in events:
            runner.emit(one)
        await runner.drain(wait_s)
    finally:
        task.cancel()
        runner.close()


def test_async_and_sync_hooks_get_their_own_events_in_order() -> None:
    seen: list[tuple[str, str | None, str]] = []

    async def on_park(e: OutcomeEvent) -> None:
        seen.append(("park", e.message_id, threading.current_thread().name))

    def on_retry(e: OutcomeEvent) -> None:
        seen.append(("retry", e.message_id, threading.current_thread().name))

    runner = HookRunner(Hooks(on_park=on_park, on_retry=on_retry))
    events = [
        OutcomeEvent("park", "q", "a", 1),
        OutcomeEvent("retry", "q", "b", 1),
        OutcomeEvent("success", "q", "c", 1),  # no on_success: not queued at all
        OutcomeEvent("park", "q", "d", 1),
    ]
    asyncio.run(_run_events(runner, events))
    assert [(k, m) for k, m, _ in seen] == [("park", "a"), ("retry", "b"), ("park", "d")]
    assert seen[1][2] == "rmqkit-hook-on_retry"  # a def hook: in a thread of its own
    assert seen[0][2] == threading.main_thread().name
    assert runner.called == 3 and runner.failed == 0


def test_a_raising_hook_is_logged_by_name_and_the_next_event_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[str | None] = []

    def on_park(e: OutcomeEvent) -> None:
        if e.message_id == "a":
            raise ValueError("the tracker is down")
        seen.append(e.message_id)

    runner = HookRunner(Hooks(on_park=on_park))
    with caplog.at_level(logging.ERROR, logger="rmqkit.consumer.hooks"):
        asyncio.run(_run_events(runner, [event_id("a"), event_id("b")]))
    assert seen == ["b"]
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    text = record.getMessage()
    assert (
        "hook on_park" in text and "on_park" in text and "ValueError: the tracker is down" in text
    )
    assert "outcome (park) stands" in text
    assert record.exc_info is not None
    assert getattr(record, "message_id", None) == "a"
    assert runner.failed == 1


def test_a_hook_that_exits_or_cancels_itself_does_not_end_the_caller(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[str | None] = []

    def exits(e: OutcomeEvent) -> None:
        if e.message_id == "a":
            sys.exit(3)
        seen.append(e.message_id)

    async def cancels(e: OutcomeEvent) -> None:
        if e.message_id == "a":
            raise asyncio.CancelledError
        seen.append(e.message_id)

    for hook in (exits, cancels):
        runner = HookRunner(Hooks(on_park=hook))
        with caplog.at_level(logging.ERROR, logger="rmqkit.consumer.hooks"):
            asyncio.run(_run_events(runner, [event_id("a"), event_id("b")]))
        assert runner.failed == 1
    assert seen == ["b", "b"]
    assert any("HookFailed: SystemExit: 3" in r.getMessage() for r in caplog.records)
    assert any("task was cancelled" in r.getMessage() for r in caplog.records)


def event_id(message_id: str) -> OutcomeEvent:
    return OutcomeEvent("park", "q", message_id, 1)


@pytest.mark.timing
@pytest.mark.parametrize("style", ["async", "sync", "stubborn"])
def test_a_hung_hook_is_abandoned_at_its_timeout(
    style: str, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[str | None] = []
    release = threading.Event()

    async def hang_async(e: OutcomeEvent) -> None:
        if e.message_id == "a":
            await asyncio.sleep(60)
        seen.append(e.message_id)

    async def stubborn(e: OutcomeEvent) -> None:  # swallows its cancellation once
        if e.message_id == "a":
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                await asyncio.sleep(30)
        seen.append(e.message_id)

    def hang_sync(e: OutcomeEvent) -> None:
        if e.message_id == "a":
            release.wait(60)
        seen.append(e.message_id)

    hook = {"async": hang_async, "sync": hang_sync, "stubborn": stubborn}[style]
    runner = HookRunner(Hooks(on_park=hook, timeout_s=0.3))
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="rmqkit.consumer.hooks"):
        asyncio.run(_run_events(runner, [event_id("a"), event_id("b")]))
    elapsed = time.monotonic() - started
    release.set()
    assert seen[:1] == ["b"]
    assert 0.25 < elapsed < 2.0, elapsed
    assert any("did not return within 0.3s" in r.getMessage() for r in caplog.records)
    assert runner.failed == 1


def test_hung_def_hooks_past_the_thread_cap_are_skipped(caplog: pytest.LogCaptureFixture) -> None:
    from rmqkit.consumer import hooks as module

    release = threading.Event()

    def hang(e: OutcomeEvent) -> None:
        release.wait(60)

    runner = HookRunner(Hooks(on_park=hang, timeout_s=0.05))
    count = module.MAX_HUNG_THREADS + 3
    try:
        with caplog.at_level(logging.ERROR, logger="rmqkit.consumer.hooks"):
            asyncio.run(_run_events(runner, [event_id(str(i)) for i in range(count)]))
    finally:
        release.set()
    skipped = [r for r in caplog.records if "HookSkipped" in r.getMessage()]
    assert len(skipped) == 3
    assert runner.failed == count


def test_a_backlog_past_max_pending_is_dropped_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[str | None] = []

    async def main() -> None:
        runner = HookRunner(Hooks(on_park=lambda e: seen.append(e.message_id), max_pending=3))
        with caplog.at_level(logging.WARNING, logger="rmqkit.consumer.hooks"):
            for i in range(5):  # the caller task is not running yet
                runner.emit(event_id(str(i)))
        assert runner.dropped == 2
        await _run_events(runner, [])

    asyncio.run(main())
    assert seen == ["0", "1", "2"]
    assert any("hook events dropped" in r.getMessage() for r in caplog.records)


def test_expected_events_fire_only_when_confirmed() -> None:
    seen: list[str | None] = []

    async def main() -> None:
        runner = HookRunner(Hooks(on_park=lambda e: seen.append(e.message_id)))
        tracker_a, tracker_b = object(), object()
        runner.expect(tracker_a, 1, event_id("confirmed"))
        runner.expect(tracker_b, 1, event_id("other channel, refused"))
        runner.confirmed(tracker_a, 1)
        runner.forget(tracker_a, 1)
        runner.forget(tracker_b, 1)
        runner.confirmed(tracker_b, 1)  # forgotten: nothing
        await _run_events(runner, [])

    asyncio.run(main())
    assert seen == ["confirmed"]


def test_close_reports_what_was_left(caplog: pytest.LogCaptureFixture) -> None:
    runner = HookRunner(Hooks(on_park=lambda e: None))
    runner.emit(event_id("left"))
    with caplog.at_level(logging.WARNING, logger="rmqkit.consumer.hooks"):
        runner.close()
    assert any("1 hook event(s) not delivered" in r.getMessage() for r in caplog.records)


# --- the Sentry recipe of docs/hooks.md ----------------------------------------------------------


def _recipe() -> str:
    text = DOCS.read_text(encoding="utf-8")
    section = text[text.index("## Recipe: Sentry") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    return match.group(1)


def test_the_sentry_recipe_reports_parked_messages_with_tags(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[str, Any, dict[str, Any]]] = []
    fake = types.ModuleType("sentry_sdk")
    fake.capture_exception = lambda error=None, **kw: calls.append(("exception", error, kw))  # type: ignore[attr-defined]
    fake.capture_message = lambda message, level=None, **kw: calls.append(  # type: ignore[attr-defined]
        ("message", message, {"level": level, **kw})
    )
    monkeypatch.setitem(sys.modules, "sentry_sdk", fake)
    # Until the top-level names are exported the recipe reads them from here.
    monkeypatch.setattr(rmqkit, "Hooks", Hooks, raising=False)
    monkeypatch.setattr(rmqkit, "OutcomeEvent", OutcomeEvent, raising=False)
    namespace: dict[str, Any] = {}
    exec(compile(_recipe(), str(DOCS), "exec"), namespace)
    hooks = namespace["rmqkit_hooks"]
    assert isinstance(hooks, Hooks) and hooks.on_park is namespace["report_parked"]
    error = ValueError("bad amount")
    hooks.on_park(OutcomeEvent("park", "jobs.work", "m-1", 2, reason="permanent", exception=error))
    hooks.on_park(
        OutcomeEvent(
            "park", "jobs.work", "m-2", 1, reason="undecodable", error_type="rmqkit.Undecodable"
        )
    )
    (kind, first, kw), (kind2, text, kw2) = calls
    assert kind == "exception" and first is error
    assert kw["tags"] == {"queue": "jobs.work", "park_reason": "permanent"}
    assert kw["extras"]["attempt"] == 2
    assert kind2 == "message" and "undecodable" in text and kw2["level"] == "error"
    assert kw2["tags"] == {"queue": "jobs.work", "park_reason": "undecodable"}

"""Handler loading (every error's one line, exit 78), argument building, and the classification of
every way a handler can end into an outcome; plus rmqkit.Message and the public exceptions."""

from __future__ import annotations

import asyncio
import pickle
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import FrozenInstanceError
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aio_pika.message import IncomingMessage
from aiormq.abc import DeliveredMessage
from pamqp import commands as spec
from pamqp.header import ContentHeader

from rmqkit import headers as h
from rmqkit.consumer import handler as handler_module
from rmqkit.consumer.attempts import attempt_number
from rmqkit.consumer.decision import (
    Failed,
    HandlerOutcome,
    HandlerTimeout,
    Park,
    Success,
    Undecodable,
    decide,
)
from rmqkit.consumer.handler import HandlerInput, LoadedHandler, load_handler, run_handler
from rmqkit.consumer.loading import handler_from_callable
from rmqkit.consumer.message import DecodeError, Message, Permanent, Retry
from rmqkit.consumer.policy import QueuePolicy
from rmqkit.errors import ConfigError, ExitCode
from tests.unit.handlers_fixture import ok

ROOT = Path(__file__).resolve().parents[2]
PKG = "tests.unit.handlers_fixture"
ORDER_JSON = b'{"id": 7, "sku": "A-1"}'


@pytest.fixture(autouse=True)
def _isolated() -> Iterator[None]:
    """load_handler puts a directory first on sys.path; the fixture module records calls."""
    saved_path = list(sys.path)
    ok.received.clear()
    ok.threads.clear()
    ok.tasks.clear()
    ok.release.clear()
    ok.finished.clear()
    yield
    ok.release.set()  # never leave a blocked handler thread behind
    sys.path[:] = saved_path


def load(name: str) -> LoadedHandler:
    return load_handler(f"{PKG}.{name}", cwd=ROOT)


def run(
    handler: LoadedHandler,
    message: Message,
    *,
    timeout_s: float | None = None,
    permanent_types: frozenset[str] = frozenset(),
    **kwargs: Any,
) -> HandlerOutcome:
    return asyncio.run(
        run_handler(
            handler, message, timeout_s=timeout_s, permanent_types=permanent_types, **kwargs
        )
    )


def load_error(spec_text: str, cwd: Path = ROOT) -> str:
    with pytest.raises(ConfigError) as caught:
        load_handler(spec_text, cwd=cwd)
    error = caught.value
    assert error.exit_code == ExitCode.CONFIG == 78
    text = str(error)
    assert "\n" not in text and "Traceback" not in text
    return text


# --- loading errors: one exact line each ---------------------------------------------------------

FORM = "expected 'module:function' (e.g. 'myapp.handlers:handle')"


ACCEPTED = (
    "a handler takes, chosen by annotation and in any order, at most one body parameter (a "
    "pydantic model, dict, bytes, str or another type pydantic validates), one rmqkit.Message "
    "(or one unannotated parameter) and, with --dedupe, one rmqkit.Transaction"
)


@pytest.mark.parametrize("bad", ["mod:", ":handle", "my-app:handle"])
def test_spec_without_module_and_function_names_the_expected_form(bad: str) -> None:
    assert load_error(bad) == f"cannot load handler '{bad}': {FORM}"


@pytest.mark.parametrize("bad", ["orders", "orders.handle"])
def test_spec_without_function_is_a_routed_module_and_names_both_forms(bad: str) -> None:
    # No ':function' is a module of @rmqkit.handler functions; one that is not found may be a
    # ':function' left out, so the line names both forms.
    assert load_error(bad) == (
        f"cannot load handler '{bad}': module '{bad}' not found (searched {ROOT} and the "
        f"Python path); {FORM}, or a module of @rmqkit.handler functions ('myapp.handlers', "
        "optionally 'myapp.handlers[routing-key]')"
    )


def test_missing_module() -> None:
    assert load_error("nosuch.module:handle") == (
        "cannot load handler 'nosuch.module:handle': module 'nosuch.module' not found "
        f"(searched {ROOT} and the Python path)"
    )


def test_missing_submodule_of_an_existing_package() -> None:
    assert load_error(f"{PKG}.nosuch:handle") == (
        f"cannot load handler '{PKG}.nosuch:handle': module '{PKG}.nosuch' not found "
        f"(searched {ROOT} and the Python path)"
    )


def test_module_that_imports_a_missing_module_names_the_inner_one() -> None:
    assert load_error(f"{PKG}.broken_import:handle") == (
        f"cannot load handler '{PKG}.broken_import:handle': importing module "
        f"'{PKG}.broken_import' failed: module 'rmqkit_nonexistent_dependency' not found"
    )


def test_module_with_a_bad_from_import() -> None:
    text = load_error(f"{PKG}.bad_name_import:handle")
    assert text.startswith(
        f"cannot load handler '{PKG}.bad_name_import:handle': importing module "
        f"'{PKG}.bad_name_import' failed: ImportError: cannot import name "
        "'rmqkit_no_such_name' from 'os'"
    )


def test_module_raising_at_import_gives_its_error_on_one_line() -> None:
    assert load_error(f"{PKG}.raises_at_import:handle") == (
        f"cannot load handler '{PKG}.raises_at_import:handle': importing module "
        f"'{PKG}.raises_at_import' failed: RuntimeError: settings missing: DATABASE_URL is not set"
    )


def test_module_with_a_syntax_error(tmp_path: Path) -> None:
    name = "rmqkit_probe_bad_syntax"
    (tmp_path / f"{name}.py").write_text("def handle(message:\n    pass\n")
    try:
        text = load_error(f"{name}:handle", cwd=tmp_path)
    finally:
        sys.modules.pop(name, None)
    assert text.startswith(
        f"cannot load handler '{name}:handle': importing module '{name}' failed: SyntaxError: "
    )
    assert f"({name}.py, line 1)" in text


def test_missing_attribute() -> None:
    assert load_error(f"{PKG}.ok:missing") == (
        f"cannot load handler '{PKG}.ok:missing': module '{PKG}.ok' has no attribute 'missing'"
    )


def test_missing_nested_attribute() -> None:
    assert load_error(f"{PKG}.ok:Handlers.Nope.handle") == (
        f"cannot load handler '{PKG}.ok:Handlers.Nope.handle': '{PKG}.ok:Handlers' has no "
        "attribute 'Nope'"
    )


def test_not_callable() -> None:
    assert load_error(f"{PKG}.ok:NOT_CALLABLE") == (
        f"cannot load handler '{PKG}.ok:NOT_CALLABLE': '{PKG}.ok:NOT_CALLABLE' is not callable "
        "(its type is int)"
    )


def test_no_argument() -> None:
    assert load_error(f"{PKG}.ok:no_args") == (
        f"cannot load handler '{PKG}.ok:no_args': '{PKG}.ok:no_args' takes no argument; {ACCEPTED}"
    )


def test_two_required_arguments() -> None:
    # (message: Message, other: int) is a Message and a body now; two parameters for the
    # Message (one annotated, one not) are still refused.
    assert load("ok:two_args").describe() == (
        f"sync (thread pool) {PKG}.ok:two_args(message: Message, other: int)"
    )

    def two_args(message: Message, other) -> None:  # type: ignore[no-untyped-def]
        pass

    with pytest.raises(ConfigError) as caught:
        handler_from_callable(two_args, "t:two_args")
    assert str(caught.value) == (
        "cannot load handler 't:two_args': 't:two_args' takes 2 required arguments (message: "
        "Message, other) that would each receive the rmqkit.Message (an unannotated parameter "
        f"receives it); {ACCEPTED}"
    )


def test_required_keyword_only_argument() -> None:
    assert load_error(f"{PKG}.ok:keyword_only") == (
        f"cannot load handler '{PKG}.ok:keyword_only': '{PKG}.ok:keyword_only' has required "
        f"keyword-only arguments (flag), which rmqkit cannot fill; {ACCEPTED}"
    )


def test_generator_function() -> None:
    assert load_error(f"{PKG}.ok:generator") == (
        f"cannot load handler '{PKG}.ok:generator': '{PKG}.ok:generator' is a generator "
        "function; a handler is an 'async def' or 'def' function that returns when the message "
        "is handled"
    )


def test_annotation_pydantic_cannot_build() -> None:
    assert load_error(f"{PKG}.ok:unsupported_annotation") == (
        f"cannot load handler '{PKG}.ok:unsupported_annotation': parameter 'thing' is annotated "
        "NotAModel, which rmqkit cannot build from a message body "
        "(PydanticSchemaGenerationError); annotate it with rmqkit.Message, bytes, str, a "
        "pydantic model or a JSON type such as dict"
    )


def test_unresolvable_string_annotation() -> None:
    assert load_error(f"{PKG}.future_hints:handle_unresolvable") == (
        f"cannot load handler '{PKG}.future_hints:handle_unresolvable': cannot resolve the "
        "annotation 'UndefinedModel' of parameter 'payment': NameError: name 'UndefinedModel' "
        "is not defined"
    )


# --- loading what works --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "is_async", "kind", "input_type", "description"),
    [
        ("handle", True, HandlerInput.MESSAGE, None, "async {spec}(message: Message)"),
        (
            "handle_sync",
            False,
            HandlerInput.MESSAGE,
            None,
            "sync (thread pool) {spec}(message: Message)",
        ),
        ("handle_unannotated", True, HandlerInput.MESSAGE, None, "async {spec}(message: Message)"),
        ("handle_order", True, HandlerInput.MODEL, ok.Order, "async {spec}(order: Order)"),
        ("handle_bytes", True, HandlerInput.BODY, None, "async {spec}(body: bytes)"),
        ("handle_text", True, HandlerInput.TEXT, None, "async {spec}(text: str)"),
        (
            "handle_dict",
            True,
            HandlerInput.MODEL,
            dict[str, Any],
            "async {spec}(data: dict[str, Any])",
        ),
        ("handle_any", True, HandlerInput.MODEL, Any, "async {spec}(data: Any)"),
        ("handle_orders", True, HandlerInput.MODEL, list[ok.Order], None),
        ("handle_with_default", True, HandlerInput.MESSAGE, None, None),
        ("handle_star_args", True, HandlerInput.MESSAGE, None, "async {spec}(*args: Message)"),
        ("stateful", True, HandlerInput.MESSAGE, None, None),
        ("Handlers.Nested.handle", True, HandlerInput.MESSAGE, None, None),
        ("sync_returning_coroutine", False, HandlerInput.MESSAGE, None, None),
    ],
)
def test_loaded_handler_knows_how_to_call_the_target(
    name: str, is_async: bool, kind: HandlerInput, input_type: Any, description: str | None
) -> None:
    handler = load(f"ok:{name}")
    assert handler.spec == f"{PKG}.ok:{name}"
    assert handler.is_async is is_async
    assert handler.input is kind
    assert handler.input_type == input_type
    if description is not None:
        assert handler.describe() == description.format(spec=handler.spec)


def test_string_annotations_resolve_in_the_handler_module() -> None:
    payment = load("future_hints:handle_payment")
    assert payment.input is HandlerInput.MODEL
    assert payment.input_type.__name__ == "Payment"
    # Message imported under TYPE_CHECKING only, and a return annotation that cannot resolve:
    # only the parameter's annotation matters.
    message = load("future_hints:handle_message")
    assert message.input is HandlerInput.MESSAGE


def test_module_is_imported_from_the_current_directory_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "rmqkit_probe_cwd_handler"
    (tmp_path / f"{name}.py").write_text("def handle(message):\n    return None\n")
    monkeypatch.chdir(tmp_path)
    try:
        handler = load_handler(f"{name}:handle")
    finally:
        sys.modules.pop(name, None)
    assert sys.path[0] == str(tmp_path.resolve())
    assert handler.is_async is False
    assert run(handler, Message(b"")) == Success()


# --- arguments -----------------------------------------------------------------------------------


def test_async_handler_gets_the_message_and_no_task_is_created() -> None:
    message = Message(b"x", message_id="m-1")
    assert run(load("ok:handle"), message) == Success()
    assert ok.received == [message]

    async def main() -> tuple[HandlerOutcome, asyncio.Task[Any] | None]:
        outcome = await run_handler(
            load("ok:record_task"), message, timeout_s=None, permanent_types=frozenset()
        )
        return outcome, asyncio.current_task()

    outcome, outer = asyncio.run(main())
    assert outcome == Success()
    assert ok.tasks == [outer]  # awaited in the caller's task, not a task of its own


def test_sync_handler_runs_in_another_thread() -> None:
    message = Message(b"x")
    assert run(load("ok:handle_sync"), message) == Success()
    assert ok.received == [message]
    assert ok.threads and ok.threads[0] != threading.current_thread().name
    assert ok.threads[0] != "MainThread"


def test_sync_handler_runs_in_the_given_executor_with_the_callers_context() -> None:
    handler = load("ok:record_context_sync")

    async def main(executor: ThreadPoolExecutor) -> HandlerOutcome:
        ok.request_id.set("req-42")
        return await run_handler(
            handler, Message(b""), timeout_s=None, permanent_types=frozenset(), executor=executor
        )

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="rmqkit-handlers") as executor:
        assert asyncio.run(main(executor)) == Success()
    assert ok.threads[0].startswith("rmqkit-handlers")
    assert ok.received == ["req-42"]


def test_sync_handler_context_without_executor() -> None:
    async def main() -> HandlerOutcome:
        ok.request_id.set("req-7")
        return await run_handler(
            load("ok:record_context_sync"),
            Message(b""),
            timeout_s=None,
            permanent_types=frozenset(),
        )

    assert asyncio.run(main()) == Success()
    assert ok.received == ["req-7"]


def test_sync_wrapper_returning_a_coroutine_is_awaited() -> None:
    message = Message(b"x")
    assert run(load("ok:sync_returning_coroutine"), message) == Success()
    assert ok.received == [message]


@pytest.mark.parametrize("name", ["handle_order", "handle_order_sync"])
def test_pydantic_model_parameter_gets_the_validated_body(name: str) -> None:
    assert run(load(f"ok:{name}"), Message(ORDER_JSON)) == Success()
    assert ok.received == [ok.Order(id=7, sku="A-1")]


@pytest.mark.parametrize("name", ["handle_order", "handle_order_sync"])
def test_pydantic_validation_failure_is_undecodable_and_the_handler_never_runs(name: str) -> None:
    outcome = run(load(f"ok:{name}"), Message(b'{"id": "seven"}'))
    assert outcome == Undecodable(
        "the body does not validate as Order: id: Input should be a valid integer, unable to "
        "parse string as an integer; sku: Field required"
    )
    assert ok.received == []


def test_body_that_is_not_json_is_undecodable_for_a_model() -> None:
    outcome = run(load("ok:handle_order"), Message(b"not json"))
    assert isinstance(outcome, Undecodable)
    assert outcome.exc_type == "rmqkit.Undecodable"
    assert outcome.detail.startswith("the body does not validate as Order: Invalid JSON: ")
    assert ok.received == []


def test_bytes_text_dict_any_and_list_parameters() -> None:
    assert run(load("ok:handle_bytes"), Message(b"\xff raw")) == Success()
    assert run(load("ok:handle_text"), Message("héllo".encode())) == Success()
    assert run(load("ok:handle_dict"), Message(b'{"a": 1}')) == Success()
    assert run(load("ok:handle_any"), Message(b"[1, 2]")) == Success()
    assert run(load("ok:handle_orders"), Message(b"[" + ORDER_JSON + b"]")) == Success()
    assert ok.received == [b"\xff raw", "héllo", {"a": 1}, [1, 2], [ok.Order(id=7, sku="A-1")]]


def test_bytes_parameter_gets_the_very_body_object() -> None:
    body = b"x" * 1000
    assert run(load("ok:handle_bytes"), Message(body)) == Success()
    assert ok.received[0] is body


def test_text_that_is_not_utf8_is_undecodable() -> None:
    outcome = run(load("ok:handle_text"), Message(b"\xff\xfe"))
    assert isinstance(outcome, Undecodable)
    assert outcome.detail.startswith("the body is not valid UTF-8: ")


def test_dict_parameter_rejects_a_json_array() -> None:
    outcome = run(load("ok:handle_dict"), Message(b"[1]"))
    assert outcome == Undecodable(
        "the body does not validate as dict[str, Any]: Input should be an object"
    )


def test_star_args_and_optional_extra_parameters() -> None:
    message = Message(b"")
    assert run(load("ok:handle_star_args"), message) == Success()
    assert run(load("ok:handle_with_default"), message) == Success()
    assert ok.received == [(message,), (message, 1)]


def test_callable_instance_with_async_call() -> None:
    before = ok.stateful.seen
    assert run(load("ok:stateful"), Message(b"")) == Success()
    assert ok.stateful.seen == before + 1


# --- outcomes ------------------------------------------------------------------------------------


def test_permanent_is_a_permanent_failure() -> None:
    outcome = run(load("ok:raise_permanent"), Message(b""))
    assert isinstance(outcome, Failed)
    assert outcome.permanent is True
    assert outcome.exc_type == "rmqkit.consumer.message.Permanent"
    assert outcome.exc_message == "no such customer"
    assert "raise_permanent" in outcome.traceback_text()


def test_retry_is_transient_with_the_requested_delay() -> None:
    outcome = run(load("ok:raise_retry"), Message(b""))
    assert isinstance(outcome, Failed)
    assert (outcome.permanent, outcome.retry_delay_s) == (False, 5)
    assert outcome.exc_type == "rmqkit.consumer.message.Retry"
    assert outcome.exc_message == "rate limited"


def test_retry_without_delay_uses_the_attempts_tier() -> None:
    outcome = run(load("ok:raise_retry_default"), Message(b""))
    assert isinstance(outcome, Failed)
    assert (outcome.permanent, outcome.retry_delay_s) == (False, None)
    assert outcome.exc_message == "the handler asked for a retry"


@pytest.mark.parametrize("name", ["raise_value_error", "raise_value_error_sync"])
def test_other_exception_is_transient(name: str) -> None:
    outcome = run(load(f"ok:{name}"), Message(b""))
    assert isinstance(outcome, Failed)
    assert (outcome.permanent, outcome.retry_delay_s) == (False, None)
    assert (outcome.exc_type, outcome.exc_message) == ("ValueError", "database is down")
    assert "Exception" in outcome.base_types
    assert name in outcome.traceback_text()


@pytest.mark.parametrize(
    ("listed", "permanent"),
    [
        (frozenset({"ValueError"}), True),
        (frozenset({"builtins.ValueError"}), True),
        (frozenset({"Exception"}), True),
        (frozenset({"KeyError", "TypeError"}), False),
        (frozenset(), False),
    ],
)
def test_listed_permanent_types(listed: frozenset[str], permanent: bool) -> None:
    outcome = run(load("ok:raise_value_error"), Message(b""), permanent_types=listed)
    assert isinstance(outcome, Failed)
    assert outcome.permanent is permanent


@pytest.mark.parametrize(
    "listed", [f"{PKG}.ok.Conflict", "ok.Conflict", "Conflict", f"{PKG}.ok.VersionConflict"]
)
def test_listed_base_class_covers_a_raised_subclass(listed: str) -> None:
    outcome = run(load("ok:raise_subclass"), Message(b""), permanent_types=frozenset({listed}))
    assert isinstance(outcome, Failed)
    assert outcome.permanent is True
    assert outcome.exc_type == f"{PKG}.ok.VersionConflict"


def test_not_listed_similar_name_stays_transient() -> None:
    listed = frozenset({"Conflicts", "onflict"})
    outcome = run(load("ok:raise_subclass"), Message(b""), permanent_types=listed)
    assert isinstance(outcome, Failed)
    assert outcome.permanent is False


def test_decide_parks_a_subclass_of_a_listed_base_even_if_run_handler_was_not_told() -> None:
    outcome = run(load("ok:raise_subclass"), Message(b""))
    policy = QueuePolicy(
        queue="q",
        parking_queue="q.parking",
        retry_delays_ms=(1000,),
        max_attempts=5,
        wait_queues=(("q.wait.1",),),
        permanent_errors=frozenset({"Conflict"}),
    )
    decision = decide(
        outcome, {}, policy, exchange="", routing_key="q", now=datetime.now(UTC), host="h", pid=1
    )
    assert isinstance(decision, Park)
    assert decision.reason == h.ParkingReason.PERMANENT


@pytest.mark.parametrize("name", ["handle_json", "handle_json_sync"])
def test_message_json_on_garbage_inside_the_handler_is_undecodable(name: str) -> None:
    outcome = run(load(f"ok:{name}"), Message(b"{not json"))
    assert isinstance(outcome, Undecodable)
    assert outcome.exc_type == "rmqkit.consumer.message.DecodeError"
    assert outcome.detail.startswith("the body is not valid JSON: Expecting property name")
    assert name in outcome.traceback
    assert ok.received == []


def test_decode_error_raised_by_the_handler_is_undecodable() -> None:
    outcome = run(load("ok:raise_decode_error"), Message(b""))
    assert isinstance(outcome, Undecodable)
    assert outcome.detail == "custom format broken"


def test_validation_error_raised_inside_the_handler_is_undecodable() -> None:
    outcome = run(load("ok:handle_validate_inside"), Message(b'{"id": 1}'))
    assert isinstance(outcome, Undecodable)
    assert outcome.detail == "the body does not validate as Order: sku: Field required"
    assert outcome.exc_type.endswith("ValidationError")


def test_a_validation_error_inside_the_handler_keeps_the_bodys_values_out_of_its_traceback() -> (
    None
):
    # pydantic's str() quotes input values; the traceback is stored with a parked message and
    # logged, and the body may hold decrypted personal data (issue 16)
    body = b'{"id": "SENTINEL-in-id", "qty": "SENTINEL-in-qty"}'
    outcome = run(load("ok:handle_validate_inside"), Message(body))
    assert isinstance(outcome, Undecodable)
    assert "SENTINEL" not in outcome.detail
    assert "SENTINEL" not in outcome.traceback
    assert "handle_validate_inside" in outcome.traceback  # the frames are kept
    assert outcome.traceback.rstrip().endswith(outcome.detail)


def test_handlers_own_timeout_error_is_transient_not_a_handler_timeout() -> None:
    outcome = run(load("ok:raise_own_timeout"), Message(b""), timeout_s=30)
    assert isinstance(outcome, Failed)
    assert outcome.exc_type == "TimeoutError"
    assert outcome.exc_message == "upstream timed out"


@pytest.mark.timing
def test_async_handler_timeout() -> None:
    started = time.monotonic()
    outcome = run(load("ok:sleep_forever"), Message(b""), timeout_s=0.05)
    assert outcome == HandlerTimeout(0.05)
    assert time.monotonic() - started < 2


def test_handler_that_turns_the_timeouts_cancellation_into_an_error_still_timed_out() -> None:
    outcome = run(load("ok:swallow_cancel_then_raise"), Message(b""), timeout_s=0.05)
    assert outcome == HandlerTimeout(0.05)


@pytest.mark.timing
def test_sync_handler_timeout_leaves_the_thread_to_finish() -> None:
    handler = load("ok:block_sync")

    async def main() -> tuple[HandlerOutcome, float, bool]:
        started = time.monotonic()
        outcome = await run_handler(
            handler, Message(b""), timeout_s=0.05, permanent_types=frozenset()
        )
        elapsed = time.monotonic() - started
        still_running = not ok.finished.is_set()  # a thread cannot be stopped
        ok.release.set()  # else asyncio.run waits for it when it shuts its executor down
        return outcome, elapsed, still_running

    outcome, elapsed, still_running = asyncio.run(main())
    assert outcome == HandlerTimeout(0.05)
    assert elapsed < 2
    assert still_running
    assert ok.finished.wait(5)


def test_timeout_runs_in_the_callers_task_and_leaves_it_uncancelled() -> None:
    async def main() -> None:
        me = asyncio.current_task()
        assert me is not None
        outcome = await run_handler(
            load("ok:record_task"), Message(b""), timeout_s=5, permanent_types=frozenset()
        )
        assert outcome == Success()
        assert ok.tasks == [me]
        outcome = await run_handler(
            load("ok:sleep_forever"), Message(b""), timeout_s=0.02, permanent_types=frozenset()
        )
        assert outcome == HandlerTimeout(0.02)
        assert me.cancelling() == 0
        await asyncio.sleep(0.05)  # no cancellation left over for the caller's next await
        assert handler_module._watchdog().pending == 0

    asyncio.run(main())


def test_handler_that_swallows_the_timeouts_cancellation_finished_late_but_succeeded() -> None:
    async def main() -> None:
        outcome = await run_handler(
            load("ok:swallow_cancel_and_return"),
            Message(b""),
            timeout_s=0.02,
            permanent_types=frozenset(),
        )
        assert outcome == Success()
        assert ok.received == ["cancel swallowed"]
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0
        await asyncio.sleep(0.01)

    asyncio.run(main())


@pytest.mark.timing
def test_many_concurrent_handlers_each_get_their_own_timeout() -> None:
    handler = load("ok:sleep_briefly")

    async def one(duration_s: float, timeout_s: float) -> HandlerOutcome:
        message = Message(str(duration_s).encode())
        return await run_handler(handler, message, timeout_s=timeout_s, permanent_types=frozenset())

    async def main() -> list[HandlerOutcome]:
        # A long timeout first, then shorter ones: the shared timer must move earlier.
        calls = [one(0.01, 10.0)]
        calls += [one(5.0 if i % 2 else 0.01, 0.1 + i / 1000) for i in range(100)]
        started = time.monotonic()
        outcomes = await asyncio.gather(*calls)
        assert time.monotonic() - started < 2
        assert handler_module._watchdog().pending == 0
        return outcomes

    outcomes = asyncio.run(main())
    assert outcomes[0] == Success()
    for i, outcome in enumerate(outcomes[1:]):
        assert outcome == (HandlerTimeout(0.1 + i / 1000) if i % 2 else Success())


def test_external_cancellation_during_a_timed_call_leaves_nothing_pending() -> None:
    handler = load("ok:sleep_forever")

    async def main() -> None:
        task = asyncio.create_task(
            run_handler(handler, Message(b""), timeout_s=0.2, permanent_types=frozenset())
        )
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert handler_module._watchdog().pending == 0
        await asyncio.sleep(0.3)  # the timer fires on nothing

    asyncio.run(main())


def test_fast_handler_within_its_timeout_succeeds() -> None:
    assert run(load("ok:handle"), Message(b""), timeout_s=5) == Success()
    assert run(load("ok:sleep_sync"), Message(b""), timeout_s=5) == Success()


@pytest.mark.parametrize(
    ("name", "timeout_s"),
    [("sleep_forever", None), ("sleep_forever", 30.0), ("block_sync", None), ("block_sync", 30.0)],
)
def test_cancellation_propagates(name: str, timeout_s: float | None) -> None:
    handler = load(f"ok:{name}")

    async def main() -> None:
        task = asyncio.create_task(
            run_handler(handler, Message(b""), timeout_s=timeout_s, permanent_types=frozenset())
        )
        await asyncio.sleep(0.05)
        task.cancel()
        try:
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            ok.release.set()

    asyncio.run(main())


def test_cancelled_error_raised_by_the_handler_propagates() -> None:
    with pytest.raises(asyncio.CancelledError):
        run(load("ok:raise_cancelled"), Message(b""))


# --- Message -------------------------------------------------------------------------------------


def delivery(
    body: bytes = b'{"x": 1}', headers: dict[str, Any] | None = None, **properties: Any
) -> IncomingMessage:
    props = spec.Basic.Properties(headers=headers, **properties)
    deliver = spec.Basic.Deliver(
        consumer_tag="ctag",
        delivery_tag=7,
        redelivered=True,
        exchange="orders",
        routing_key="orders.created",
    )
    return IncomingMessage(
        DeliveredMessage(
            delivery=deliver,
            header=ContentHeader(properties=props),
            body=body,
            channel=None,  # type: ignore[arg-type]
        )
    )


def test_from_delivery_copies_the_fields_without_copying_the_body() -> None:
    stamp = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    incoming = delivery(
        b"payload",
        {"trace": "t-1"},
        message_id="m-1",
        content_type="application/json",
        correlation_id="c-1",
        timestamp=stamp,
    )
    message = Message.from_delivery(incoming, queue="orders.work", wait_queues=())
    assert message.body is incoming.body
    assert message.headers is incoming.headers
    assert message == Message(
        b"payload",
        headers={"trace": "t-1"},
        message_id="m-1",
        routing_key="orders.created",
        exchange="orders",
        redelivered=True,
        attempt=1,
        content_type="application/json",
        correlation_id="c-1",
        timestamp=stamp,
        delivery_tag=7,
    )


def test_from_delivery_without_properties() -> None:
    message = Message.from_delivery(delivery(b""), queue="q")
    assert (message.headers, message.message_id, message.attempt) == ({}, None, 1)
    assert (message.content_type, message.correlation_id, message.timestamp) == (None, None, None)


X_DEATH_REJECTED = {
    "x-death": [
        {
            "count": 2,
            "reason": "rejected",
            "queue": "q",
            "time": datetime(2024, 5, 1, tzinfo=UTC),
            "exchange": "",
            "routing-keys": ["q"],
        }
    ]
}
X_DEATH_EXPIRED = {
    "x-death": [
        {"count": 3, "reason": "expired", "queue": "q.wait.1", "exchange": "", "routing-keys": []}
    ]
}


@pytest.mark.parametrize(
    ("headers", "attempt"),
    [
        (None, 1),
        ({"trace": "x"}, 1),
        ({h.ATTEMPT: 2}, 3),
        ({h.ATTEMPT: "4"}, 5),
        (X_DEATH_REJECTED, 3),
        ({**X_DEATH_REJECTED, h.ATTEMPT: 1}, 4),
        (X_DEATH_EXPIRED, 4),
    ],
)
def test_attempt_matches_attempt_number(headers: dict[str, Any] | None, attempt: int) -> None:
    message = Message.from_delivery(delivery(headers=headers), queue="q", wait_queues=("q.wait.1",))
    assert message.attempt == attempt
    assert attempt == attempt_number(headers, "q", wait_queues=("q.wait.1",))


def test_message_json() -> None:
    assert Message(b'{"a": [1, 2]}').json() == {"a": [1, 2]}
    assert Message('{"k": "ü"}'.encode("utf-16")).json() == {"k": "ü"}


@pytest.mark.parametrize("body", [b"", b"{", b"\xff\xfe\xfa", b"[" * 100_000])
def test_message_json_on_garbage_raises_decode_error(body: bytes) -> None:
    with pytest.raises(DecodeError) as caught:
        Message(body).json()
    assert isinstance(caught.value, Permanent)
    assert isinstance(caught.value, ValueError)
    assert str(caught.value).startswith("the body is not valid JSON: ")


def test_message_is_frozen_slotted_hashable_and_its_repr_hides_the_body() -> None:
    message = Message(b"secret card number", message_id="m-1", attempt=2)
    with pytest.raises(FrozenInstanceError):
        message.attempt = 3  # type: ignore[misc]
    assert not hasattr(message, "__dict__")
    assert hash(message) == hash(Message(b"secret card number", message_id="m-1", attempt=2))
    assert repr(message) == (
        "Message(message_id='m-1', routing_key='', attempt=2, redelivered=False, body=<18 bytes>)"
    )


def test_retry_exception() -> None:
    assert (Retry(2.5).delay_s, str(Retry(2.5))) == (2.5, "the handler asked for a retry in 2.5 s")
    assert str(Retry(reason="busy")) == "busy"
    copy = pickle.loads(pickle.dumps(Retry(3, "busy")))
    assert (type(copy), copy.delay_s, copy.reason, str(copy)) == (Retry, 3, "busy", "busy")
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="delay_s"):
            Retry(bad)


# --- HandlerThreads: sync handlers that hang (issue 9, finding 4) --------------------------------


def _sync(target: Any) -> LoadedHandler:
    return LoadedHandler(
        spec="t:f", target=target, is_async=False, parameter="m", input=HandlerInput.MESSAGE
    )


def test_a_sync_handlers_timeout_counts_from_its_start_not_from_its_wait_for_a_thread() -> None:
    from rmqkit.consumer.threads import HandlerThreads

    threads = HandlerThreads(1, spare=0)  # one thread: the second call must wait for it

    async def main() -> tuple[HandlerOutcome, HandlerOutcome, float]:
        started = time.monotonic()
        first = asyncio.create_task(
            run_handler(
                _sync(lambda m: time.sleep(0.4)),
                Message(b""),
                timeout_s=5,
                permanent_types=frozenset(),
                executor=threads,
            )
        )
        await asyncio.sleep(0.05)
        second = await run_handler(
            _sync(lambda m: None),
            Message(b""),
            timeout_s=0.1,  # shorter than its wait for the thread
            permanent_types=frozenset(),
            executor=threads,
        )
        return await first, second, time.monotonic() - started

    try:
        first, second, elapsed = asyncio.run(main())
    finally:
        threads.close()
    assert first == Success() and second == Success()
    assert elapsed >= 0.35  # the second one did wait for the thread
    assert threads.busy == 0 and threads.stuck == 0


def test_a_call_past_its_timeout_is_stuck_until_it_ends_and_spares_serve_the_rest() -> None:
    from rmqkit.consumer.threads import HandlerThreads

    release = threading.Event()
    threads = HandlerThreads(1)  # one thread plus one spare
    changes: list[int] = []
    threads.on_change = lambda: changes.append(threads.stuck)

    async def main() -> tuple[HandlerOutcome, HandlerOutcome, bool]:
        hung = await run_handler(
            _sync(lambda m: release.wait(10)),
            Message(b""),
            timeout_s=0.05,
            permanent_types=frozenset(),
            executor=threads,
        )
        exhausted = threads.exhausted
        healthy = await run_handler(
            _sync(lambda m: None),
            Message(b""),
            timeout_s=0.5,
            permanent_types=frozenset(),
            executor=threads,
        )
        release.set()
        for _ in range(100):  # the stuck call's end reaches the loop through call_soon_threadsafe
            if not threads.stuck:
                break
            await asyncio.sleep(0.02)
        return hung, healthy, exhausted

    try:
        hung, healthy, exhausted = asyncio.run(main())
    finally:
        release.set()
        threads.close()
    assert hung == HandlerTimeout(0.05)
    assert exhausted  # the one stuck call holds as many threads as may run at once
    assert healthy == Success()  # the spare thread ran it at once
    assert changes == [1, 0]
    assert threads.busy == 0 and not threads.exhausted


# --- building the argument fails in ways that are not a ValidationError ---------------------


def _converting(convert: Any) -> LoadedHandler:
    async def target(argument: Any) -> None:
        return None

    return LoadedHandler(
        spec="t:f",
        target=target,
        is_async=True,
        parameter="m",
        input=HandlerInput.MODEL,
        convert=convert,
    )


def test_a_body_nested_too_deeply_for_the_model_is_undecodable() -> None:
    """A RecursionError while building the argument is poison, not an escape (before, it left
    run_handler and the delivery unsettled)."""
    import json

    def convert(message: Message) -> Any:
        return json.loads(message.body)

    outcome = run(_converting(convert), Message(b"[" * 100_000 + b"]" * 100_000))
    assert isinstance(outcome, Undecodable)
    assert outcome.exc_type == "RecursionError"
    assert "nested too deeply" in outcome.detail


def test_a_validator_raising_its_own_error_is_a_handler_failure() -> None:
    def convert(message: Message) -> Any:
        raise LookupError("no such customer")

    outcome = run(_converting(convert), Message(b"{}"))
    assert isinstance(outcome, Failed) and outcome.exc_type == "LookupError"
    listed = run(_converting(convert), Message(b"{}"), permanent_types=frozenset({"LookupError"}))
    assert isinstance(listed, Failed) and listed.permanent


def test_an_error_whose_str_raises_is_still_an_outcome() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("cannot print")

    async def target(message: Message) -> None:
        raise Unprintable()

    handler = LoadedHandler(
        spec="t:f", target=target, is_async=True, parameter="m", input=HandlerInput.MESSAGE
    )
    outcome = run(handler, Message(b""))
    assert isinstance(outcome, Failed)
    assert outcome.exc_message == "<str() of the Unprintable failed>"
    assert "Unprintable" in outcome.traceback_text()

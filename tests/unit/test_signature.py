"""Handler signatures: parameters chosen by annotation, in any order (rmqkit.consumer.signature)."""

from __future__ import annotations

import asyncio
import functools
import re
from typing import Any

import pytest
from pydantic import BaseModel

import rmqkit
from rmqkit.consumer.decision import HandlerOutcome, Success, Undecodable
from rmqkit.consumer.handler import run_handler
from rmqkit.consumer.loading import LoadedHandler, handler_from_callable
from rmqkit.consumer.signature import ACCEPTED, HandlerInput, Role
from rmqkit.errors import ConfigError
from rmqkit.testing import run_handler as simulate

Message = rmqkit.Message
Transaction = rmqkit.Transaction


class Order(BaseModel):
    id: int


seen: list[tuple[Any, ...]] = []
TX = object()  # a stand-in: run_handler passes it through untouched


def run(handler: LoadedHandler, message: Message, transaction: Any = None) -> HandlerOutcome:
    async def main() -> HandlerOutcome:
        return await run_handler(
            handler, message, timeout_s=None, permanent_types=frozenset(), transaction=transaction
        )

    return asyncio.run(main())


def refused(target: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        handler_from_callable(target, "t:h")
    text = str(caught.value)
    assert text.startswith("cannot load handler 't:h': ") and "\n" not in text
    return text


# --- the forms that work -------------------------------------------------------------------------


async def model_then_message(order: Order, message: Message) -> None:
    seen.append(("model_then_message", order, message))


async def message_then_model(message: Message, order: Order) -> None:
    seen.append(("message_then_model", message, order))


def sync_body_message_tx(body: bytes, tx: Transaction, message: Message) -> None:
    seen.append(("sync_body_message_tx", body, tx, message))


async def tx_first(tx: Transaction, order: Order) -> None:
    seen.append(("tx_first", tx, order))


async def model_tx(order: Order, tx: Transaction) -> None:
    seen.append(("model_tx", order, tx))


async def unannotated_and_model(message, order: Order) -> None:  # type: ignore[no-untyped-def]
    seen.append(("unannotated_and_model", message, order))


async def text_and_message(text: str, message: Message) -> None:
    seen.append(("text_and_message", text, message))


async def dict_and_message(data: dict[str, int], message: Message) -> None:
    seen.append(("dict_and_message", data, message))


async def defaults_kept(order: Order, retries: int = 3, message: Message | None = None) -> None:
    # ``retries`` keeps its default; ``message`` (after it) is passed by name
    seen.append(("defaults_kept", order, retries, message))


async def positional_only(order: Order, message: Message, /) -> None:
    seen.append(("positional_only", order, message))


async def optional_keyword_only(order: Order, *, flag: bool = False) -> None:
    seen.append(("optional_keyword_only", order, flag))


async def with_kwargs(order: Order, message: Message, **extra: Any) -> None:
    seen.append(("with_kwargs", order, message, extra))


class Handlers:
    async def method(self, message: Message, order: Order) -> None:
        seen.append(("method", message, order))


@pytest.mark.parametrize(
    ("target", "shown", "kind"),
    [
        (model_then_message, "async t:h(order: Order, message: Message)", HandlerInput.MODEL),
        (message_then_model, "async t:h(message: Message, order: Order)", HandlerInput.MODEL),
        (
            sync_body_message_tx,
            "sync (thread pool) t:h(body: bytes, tx: Transaction, message: Message)",
            HandlerInput.BODY,
        ),
        (tx_first, "async t:h(tx: Transaction, order: Order)", HandlerInput.MODEL),
        (model_tx, "async t:h(order: Order, tx: Transaction)", HandlerInput.MODEL),
        (
            unannotated_and_model,
            "async t:h(message: Message, order: Order)",
            HandlerInput.MODEL,
        ),
        (text_and_message, "async t:h(text: str, message: Message)", HandlerInput.TEXT),
        (
            dict_and_message,
            "async t:h(data: dict[str, int], message: Message)",
            HandlerInput.MODEL,
        ),
        (defaults_kept, "async t:h(order: Order, message: Message)", HandlerInput.MODEL),
        (positional_only, "async t:h(order: Order, message: Message)", HandlerInput.MODEL),
        (optional_keyword_only, "async t:h(order: Order)", HandlerInput.MODEL),
        (with_kwargs, "async t:h(order: Order, message: Message)", HandlerInput.MODEL),
        (Handlers().method, "async t:h(message: Message, order: Order)", HandlerInput.MODEL),
    ],
)
def test_each_form_loads_and_describes_its_full_signature(
    target: Any, shown: str, kind: HandlerInput
) -> None:
    loaded = handler_from_callable(target, "t:h")
    assert loaded.describe() == shown
    assert loaded.input is kind
    assert loaded.takes_transaction == ("Transaction" in shown)


def test_arguments_arrive_by_annotation_in_declared_order() -> None:
    seen.clear()
    message = Message(b'{"id": 7}', message_id="m-1", headers={"k": "v"}, attempt=2)
    for target in (
        model_then_message,
        message_then_model,
        unannotated_and_model,
        defaults_kept,
        positional_only,
        with_kwargs,
        Handlers().method,
    ):
        assert run(handler_from_callable(target), message) == Success()
    order = Order(id=7)
    assert seen == [
        ("model_then_message", order, message),
        ("message_then_model", message, order),
        ("unannotated_and_model", message, order),
        ("defaults_kept", order, 3, message),
        ("positional_only", order, message),
        ("with_kwargs", order, message, {}),
        ("method", message, order),
    ]


def test_the_transaction_goes_to_its_parameter_wherever_it_is() -> None:
    seen.clear()
    message = Message(b'{"id": 1}', message_id="m-2")
    assert run(handler_from_callable(tx_first), message, TX) == Success()
    assert run(handler_from_callable(model_tx), message, TX) == Success()
    assert run(handler_from_callable(sync_body_message_tx), message, TX) == Success()
    assert seen == [
        ("tx_first", TX, Order(id=1)),
        ("model_tx", Order(id=1), TX),
        ("sync_body_message_tx", b'{"id": 1}', TX, message),
    ]


def test_text_and_dict_bodies_beside_the_message() -> None:
    seen.clear()
    message = Message(b'{"a": 1}')
    assert run(handler_from_callable(text_and_message), message) == Success()
    assert run(handler_from_callable(dict_and_message), message) == Success()
    assert seen == [
        ("text_and_message", '{"a": 1}', message),
        ("dict_and_message", {"a": 1}, message),
    ]


def test_a_body_that_fails_validation_never_reaches_a_multi_parameter_handler() -> None:
    seen.clear()
    outcome = run(handler_from_callable(message_then_model), Message(b'{"id": "x"}'))
    assert isinstance(outcome, Undecodable)
    assert outcome.detail.startswith("the body does not validate as Order: id:")
    assert seen == []


def test_plan_roles_are_in_declared_order() -> None:
    loaded = handler_from_callable(sync_body_message_tx, "t:h")
    assert loaded.signature is not None
    roles = [p.role for p in loaded.signature.parameters]
    assert roles == [Role.BODY, Role.TRANSACTION, Role.MESSAGE]
    assert loaded.parameter == "body"


def test_string_annotations_resolve_in_the_handlers_module() -> None:
    # This module has ``from __future__ import annotations``: every annotation is a string.
    loaded = handler_from_callable(model_then_message)
    assert loaded.input_type is Order


def test_run_handler_of_rmqkit_testing_takes_the_new_forms() -> None:
    seen.clear()
    result = simulate(message_then_model, b'{"id": 3}', message_id="m-3")
    assert result.action == "ack"
    assert seen[0][2] == Order(id=3) and seen[0][1].message_id == "m-3"
    with_tx = simulate(tx_first, b'{"id": 4}', transaction=TX)
    assert with_tx.action == "ack" and seen[-1] == ("tx_first", TX, Order(id=4))


# --- the refusals --------------------------------------------------------------------------------


async def two_models(order: Order, other: Order) -> None: ...


async def two_messages(message: Message, again: Message) -> None: ...


async def two_unannotated(message, again) -> None:  # type: ignore[no-untyped-def]
    ...


async def two_transactions(tx: Transaction, again: Transaction) -> None: ...


async def kwargs_only(**extra: Any) -> None: ...


async def required_keyword(order: Order, *, tenant: str) -> None: ...


async def positional_only_after_default(order: Order, retries: int = 3, /, *rest: Any) -> None: ...


def test_two_body_parameters_are_refused_naming_both() -> None:
    assert refused(two_models) == (
        "cannot load handler 't:h': 't:h' takes 2 required arguments (order: Order, other: "
        f"Order) that would each receive the message body; {ACCEPTED}"
    )


def test_two_message_parameters_are_refused_annotated_or_not() -> None:
    expected = "that would each receive the rmqkit.Message (an unannotated parameter receives it)"
    assert "(message: Message, again: Message) " + expected in refused(two_messages)
    assert "(message, again) " + expected in refused(two_unannotated)


def test_two_transactions_are_refused() -> None:
    assert (
        "(tx: Transaction, again: Transaction) that would each receive the rmqkit.Transaction"
        in (refused(two_transactions))
    )


def test_kwargs_only_is_refused_with_what_is_accepted() -> None:
    assert refused(kwargs_only) == (
        f"cannot load handler 't:h': 't:h' takes only **kwargs; name its parameters instead; "
        f"{ACCEPTED}"
    )


def test_required_keyword_only_is_refused() -> None:
    assert refused(required_keyword) == (
        "cannot load handler 't:h': 't:h' has required keyword-only arguments (tenant), which "
        f"rmqkit cannot fill; {ACCEPTED}"
    )


def test_no_parameter_is_refused() -> None:
    async def nothing() -> None: ...

    assert refused(nothing) == f"cannot load handler 't:h': 't:h' takes no argument; {ACCEPTED}"


def test_a_positional_only_parameter_after_a_default_cannot_be_passed() -> None:
    async def bad(order: Order, retries: int = 3, message: Message | None = None, /) -> None: ...

    assert "positional-only parameter 'message' after one left at its default" in refused(bad)
    # ``*rest`` after defaults is fine: nothing needs passing there
    assert handler_from_callable(positional_only_after_default, "t:h").describe() == (
        "async t:h(order: Order)"
    )


class NotAModel:
    pass


def test_an_annotation_pydantic_cannot_build_names_the_parameter() -> None:
    async def odd(message: Message, thing: NotAModel) -> None: ...

    text = refused(odd)
    assert "parameter 'thing' is annotated NotAModel, which rmqkit cannot build" in text


def test_a_transaction_handler_still_needs_dedupe() -> None:
    """Without --dedupe a handler taking a Transaction is refused, wherever the parameter is."""
    from rmqkit.consumer.dedupe import dedupe_config

    for target in (tx_first, model_tx, sync_body_message_tx):
        with pytest.raises(
            ConfigError, match=re.escape("takes a rmqkit.Transaction: run it with --dedupe")
        ):
            dedupe_config(None, handler_from_callable(target, "t:h"))
    assert dedupe_config(None, handler_from_callable(model_then_message, "t:h")) is None


def test_a_partial_fills_what_it_binds() -> None:
    async def three(order: Order, message: Message, other: int) -> None:
        seen.append(("three", order, message, other))

    seen.clear()
    loaded = handler_from_callable(functools.partial(three, other=5), "t:h")
    assert loaded.describe() == "async t:h(order: Order, message: Message)"
    message = Message(b'{"id": 2}')
    assert run(loaded, message) == Success()
    assert seen == [("three", Order(id=2), message, 5)]

"""Routed handlers: ``@rmqkit.handler(TYPE)``, module specs, Router (rmqkit.consumer.routing)."""

from __future__ import annotations

import asyncio
import re
import textwrap
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import rmqkit
from rmqkit import headers as h
from rmqkit.consumer.handler import run_handler
from rmqkit.consumer.loading import LoadedHandler, handler_from_callable, load_handler
from rmqkit.consumer.outcomes import HandlerOutcome, Success, Undecodable, UnroutableType
from rmqkit.consumer.routing import RouteBy, Router
from rmqkit.errors import ConfigError, UsageError
from rmqkit.testing import run_handler as simulate
from tests import routing_handlers

Message = rmqkit.Message


def run(handler: LoadedHandler, message: Message, transaction: Any = None) -> HandlerOutcome:
    async def main() -> HandlerOutcome:
        return await run_handler(
            handler, message, timeout_s=None, permanent_types=frozenset(), transaction=transaction
        )

    return asyncio.run(main())


@pytest.fixture
def module_file(tmp_path: Path) -> Callable[[str], str]:
    """Write a module into tmp_path; returns its importable name."""
    count = 0

    def write(source: str) -> str:
        nonlocal count
        count += 1
        name = f"routes_{tmp_path.name.replace('-', '_')}_{count}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        return name

    return write


MODULE = """
from __future__ import annotations
from typing import Any
import rmqkit
from pydantic import BaseModel

seen: list[Any] = []

class Order(BaseModel):
    id: int

@rmqkit.handler("order.created")
async def created(order: Order, message: rmqkit.Message) -> None:
    seen.append(("created", order.id, message.message_id))

@rmqkit.handler("order.paid")
@rmqkit.handler("order.settled")
def paid(message: rmqkit.Message) -> None:
    seen.append(("paid", message.headers.get("type")))

also_created = created  # an alias: one route, not two

def not_a_route(message: rmqkit.Message) -> None:
    seen.append(("not_a_route",))
"""


def _loaded(module_file: Callable[[str], str], tmp_path: Path, **kw: Any) -> LoadedHandler:
    return load_handler(module_file(MODULE), cwd=tmp_path, **kw)


def test_a_module_spec_loads_its_decorated_handlers(
    module_file: Callable[[str], str], tmp_path: Path
) -> None:
    loaded = _loaded(module_file, tmp_path)
    assert loaded.routes is not None
    assert sorted(loaded.routes.handlers) == ["order.created", "order.paid", "order.settled"]
    name = loaded.spec
    assert loaded.describe() == (
        f"{name} routed by header:type {{order.created: async {name}:created(order: Order, "
        f"message: Message), order.paid: sync (thread pool) {name}:paid(message: Message), "
        f"order.settled: sync (thread pool) {name}:paid(message: Message)}}"
    )
    assert not loaded.is_async  # one route is sync: the consumer makes handler threads


def test_each_message_runs_the_route_its_type_header_names(
    module_file: Callable[[str], str], tmp_path: Path
) -> None:
    loaded = _loaded(module_file, tmp_path)
    module = __import__(loaded.spec)
    message = Message(b'{"id": 5}', message_id="m-1", headers={"type": "order.created"})
    assert run(loaded, message) == Success()
    assert run(loaded, Message(b"", headers={"type": "order.settled"})) == Success()
    assert module.seen == [("created", 5, "m-1"), ("paid", "order.settled")]


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"type": None},
        {"type": 1},
        {"type": ["order.created"]},
        {"type": b"\xff\xfe"},
        {"kind": "order.created"},
        {"type": "created"},  # the handler's attribute name
        {"type": "also_created"},  # an alias's name
        {"type": "not_a_route"},  # an undecorated function's name
        {"type": "seen"},
        {"type": "__init__"},
        {"type": "Order"},
        {"type": "ORDER.CREATED"},
        {"type": "Order.Created"},
        {"type": " order.created"},
        {"type": "order.created "},
        {"type": "order.created\t"},
        {"type": "order.created\x00"},
        {"type": "order.*"},
        {"type": "order.#"},
        {"type": ""},
    ],
)
def test_a_type_no_route_names_exactly_runs_nothing(
    module_file: Callable[[str], str], tmp_path: Path, headers: dict[str, Any]
) -> None:
    loaded = _loaded(module_file, tmp_path)
    module = __import__(loaded.spec)
    outcome = run(loaded, Message(b'{"id": 5}', headers=headers))
    assert isinstance(outcome, UnroutableType) and isinstance(outcome, Undecodable)
    assert outcome.exc_type == "rmqkit.UnroutableType"
    assert "handled types: order.created, order.paid, order.settled" in outcome.detail
    assert module.seen == []


def test_a_bytes_type_header_is_read_as_utf8(
    module_file: Callable[[str], str], tmp_path: Path
) -> None:
    loaded = _loaded(module_file, tmp_path)
    assert run(loaded, Message(b"", headers={"type": b"order.paid"})) == Success()


def test_the_reason_quotes_the_type_bounded(
    module_file: Callable[[str], str], tmp_path: Path
) -> None:
    loaded = _loaded(module_file, tmp_path)
    outcome = run(loaded, Message(b"", headers={"type": "x" * 10_000}))
    assert isinstance(outcome, UnroutableType)
    assert len(outcome.detail) < 300
    assert "(header 'type')" in outcome.detail
    missing = run(loaded, Message(b""))
    assert isinstance(missing, UnroutableType)
    assert missing.detail.startswith("the message has no type (header 'type' is missing")


def test_a_routed_body_its_handler_cannot_decode_is_undecodable_not_unroutable(
    module_file: Callable[[str], str], tmp_path: Path
) -> None:
    loaded = _loaded(module_file, tmp_path)
    outcome = run(loaded, Message(b'{"id": "x"}', headers={"type": "order.created"}))
    assert type(outcome) is Undecodable
    assert outcome.detail.startswith("the body does not validate as Order")


def test_route_by_another_header_and_by_routing_key(
    module_file: Callable[[str], str], tmp_path: Path
) -> None:
    by_event = _loaded(module_file, tmp_path, route_by="header:event")
    assert by_event.spec.endswith("[header:event]")
    assert run(by_event, Message(b"", headers={"event": "order.paid"})) == Success()
    assert isinstance(run(by_event, Message(b"", headers={"type": "order.paid"})), UnroutableType)

    by_key = _loaded(module_file, tmp_path, route_by="routing-key")
    assert by_key.spec.endswith("[routing-key]")
    assert run(by_key, Message(b"", routing_key="order.paid")) == Success()
    # A retry copy comes back with the work queue's name as routing key: the producer's is in
    # its original-routing-key header.
    retried = Message(b"", routing_key="jobs.work", headers={h.ORIGINAL_ROUTING_KEY: "order.paid"})
    assert run(by_key, retried) == Success()
    assert isinstance(run(by_key, Message(b"", routing_key="jobs.work")), UnroutableType)
    assert isinstance(run(by_key, Message(b"")), UnroutableType)


def test_the_spec_records_route_by_for_the_workers(
    module_file: Callable[[str], str], tmp_path: Path
) -> None:
    first = _loaded(module_file, tmp_path, route_by="routing-key")
    again = load_handler(first.spec, cwd=tmp_path)  # what a worker does with config.handler
    assert again.spec == first.spec
    assert again.routes is not None and str(again.routes.route_by) == "routing-key"
    default = load_handler(first.spec.split("[")[0], cwd=tmp_path, route_by="header:type")
    assert "[" not in default.spec  # the default is not written
    with pytest.raises(UsageError, match="give one of them"):
        load_handler(first.spec, cwd=tmp_path, route_by="header:type")


@pytest.mark.parametrize(
    "text", ["event", "header:", "header: type", "header", "routing-key:x", "routing_key", ""]
)
def test_a_bad_route_by_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError) as caught:
        RouteBy.parse(text)
    assert "expected 'header:NAME' (e.g. 'header:type') or 'routing-key'" in str(caught.value)


def test_route_by_with_one_handler_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="--route-by applies to a module"):
        load_handler("tests.routing_handlers:handle_paid", route_by="routing-key")


def test_two_handlers_for_one_type_name_both(
    module_file: Callable[[str], str], tmp_path: Path
) -> None:
    name = module_file(
        """
        import rmqkit

        @rmqkit.handler("order.created")
        async def first(message: rmqkit.Message) -> None: ...

        @rmqkit.handler("order.created")
        async def second(message: rmqkit.Message) -> None: ...
        """
    )
    with pytest.raises(ConfigError) as caught:
        load_handler(name, cwd=tmp_path)
    assert str(caught.value) == (
        f"module '{name}': two handlers for type 'order.created': {name}:first and "
        f"{name}:second; keep one"
    )


def test_a_module_without_decorated_handlers_names_the_fix(
    module_file: Callable[[str], str], tmp_path: Path
) -> None:
    name = module_file(
        """
        import rmqkit
        from tests.routing_handlers import handle_created  # routes in its own module only

        async def handle(message: rmqkit.Message) -> None: ...
        """
    )
    with pytest.raises(ConfigError) as caught:
        load_handler(name, cwd=tmp_path)
    assert str(caught.value) == (
        f"module '{name}' has no handler decorated @rmqkit.handler(\"TYPE\"): decorate its "
        f"handlers, or name one handler as 'module:function' (e.g. '{name}:handle')"
    )


def test_a_route_with_a_bad_signature_is_refused_at_load(
    module_file: Callable[[str], str], tmp_path: Path
) -> None:
    name = module_file(
        """
        import rmqkit

        @rmqkit.handler("a")
        async def fine(message: rmqkit.Message) -> None: ...

        @rmqkit.handler("b")
        async def bad(message: rmqkit.Message, again: rmqkit.Message) -> None: ...
        """
    )
    with pytest.raises(ConfigError, match=rf"cannot load handler '{name}:bad': .* 2 required"):
        load_handler(name, cwd=tmp_path)


def test_routes_taking_a_transaction_need_dedupe_and_one_kind(
    module_file: Callable[[str], str], tmp_path: Path
) -> None:
    from rmqkit.consumer.dedupe import dedupe_config

    name = module_file(
        """
        import rmqkit

        @rmqkit.handler("a")
        async def with_tx(message: rmqkit.Message, tx: rmqkit.Transaction) -> None:
            tx.seen = message.message_id

        @rmqkit.handler("b")
        async def plain(body: bytes) -> None: ...
        """
    )
    loaded = load_handler(name, cwd=tmp_path)
    assert loaded.takes_transaction
    with pytest.raises(
        ConfigError, match=re.escape("takes a rmqkit.Transaction: run it with --dedupe")
    ):
        dedupe_config(None, loaded)
    tx = types.SimpleNamespace()
    message = Message(b"", message_id="m-9", headers={"type": "a"})
    assert run(loaded, message, tx) == Success() and tx.seen == "m-9"

    mixed = module_file(
        """
        import rmqkit

        @rmqkit.handler("a")
        async def with_tx(message: rmqkit.Message, tx: rmqkit.Transaction) -> None: ...

        @rmqkit.handler("b")
        def sync(body: bytes) -> None: ...
        """
    )
    with pytest.raises(ConfigError, match="mix 'async def' and 'def' handlers"):
        load_handler(mixed, cwd=tmp_path)


@pytest.mark.parametrize("bad", ["", " x", "x ", None, 3])
def test_the_decorator_refuses_an_empty_or_padded_type(bad: Any) -> None:
    with pytest.raises(ConfigError, match=re.escape("@rmqkit.handler needs a non-empty type")):
        rmqkit.handler(bad)


def test_the_decorator_returns_the_function_unchanged() -> None:
    async def f(message: Message) -> None: ...

    assert rmqkit.handler("t")(f) is f
    assert handler_from_callable(f).routes is None  # still loadable as one handler


def test_a_module_object_and_a_router_are_handlers_too() -> None:
    from_module = handler_from_callable(routing_handlers)
    assert from_module.routes is not None
    assert sorted(from_module.routes.handlers) == ["order.created", "order.paid"]

    seen: list[str] = []
    router = Router(route_by="header:event")

    @router.handler("ping")
    async def ping(message: Message) -> None:
        seen.append("ping")

    def pong(body: bytes) -> None:
        seen.append(body.decode())

    router.add("pong", pong)
    with pytest.raises(ConfigError, match="two handlers for type 'ping'"):
        router.add("ping", ping)
    loaded = handler_from_callable(router)
    assert loaded.spec == "router"
    assert run(loaded, Message(b"", headers={"event": "ping"})) == Success()
    assert seen == ["ping"]
    assert isinstance(run(loaded, Message(b"", headers={"type": "ping"})), UnroutableType)


def test_rmqkit_testing_run_handler_takes_a_routed_module(tmp_path: Path) -> None:
    import os

    os.environ["RMQKIT_TEST_LEDGER"] = str(tmp_path / "ledger.db")
    try:
        handled = simulate(
            routing_handlers, b'{"amount": 1}', headers={"type": "order.paid"}, message_id="p-1"
        )
        assert handled.action == "ack"
        assert (tmp_path / "out" / "paid-p-1").exists()
        by_name = simulate("tests.routing_handlers", b"{}", headers={"type": "handle_paid"})
        assert by_name.action == "park"
        assert isinstance(by_name.outcome, UnroutableType)
        assert by_name.reason == "unroutable_type"
        assert by_name.error_type == "rmqkit.UnroutableType"
        assert not (tmp_path / "out" / "paid-test-message").exists()
        bad_body = simulate(routing_handlers, b"not json", headers={"type": "order.created"})
        assert bad_body.action == "park" and bad_body.reason == "undecodable"
        # a transient failure of a route retries like any handler's
        retry = simulate(
            routing_handlers, b'{"id": "o", "fail": 1}', headers={"type": "order.created"}
        )
        assert retry.action == "retry"
    finally:
        del os.environ["RMQKIT_TEST_LEDGER"]


def test_the_embedded_consumer_takes_a_routed_module_object_or_spec() -> None:
    settings = rmqkit.load_settings(
        url="amqp://guest:guest@127.0.0.1:5999/", management_url="http://127.0.0.1:15999"
    )
    for handler in (routing_handlers, "tests.routing_handlers", "tests.routing_handlers[header:x]"):
        consumer = rmqkit.Consumer(handler, queue="q", settings=settings)  # type: ignore[arg-type]
        assert consumer is not None
    with pytest.raises(ConfigError, match="has no handler decorated"):
        rmqkit.Consumer(types.ModuleType("empty"), queue="q", settings=settings)  # type: ignore[arg-type]

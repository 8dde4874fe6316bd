"""rmqkit.Consumer's constructor, without a broker: handlers given as objects are checked as
``rmqkit consume`` checks a ``module:function`` (the same loading code), and bad arguments
are refused before anything connects."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

import rmqkit
from rmqkit.consumer.loading import HandlerInput, handler_from_callable

SETTINGS = rmqkit.load_settings(
    url="amqp://guest:guest@127.0.0.1:5999/", management_url="http://127.0.0.1:15999"
)


class Order(BaseModel):
    id: str


async def takes_order(order: Order) -> None:
    return None


def takes_two(order: Order, other: int) -> None:
    return None


class Service:
    async def handle(self, body: bytes) -> None:
        return None


class AsyncCallable:
    async def __call__(self, message: rmqkit.Message) -> None:
        return None


def generator(message: rmqkit.Message) -> Iterator[None]:
    yield None


def test_objects_are_loaded_like_specs() -> None:
    loaded = handler_from_callable(takes_order)
    assert loaded.is_async and loaded.input is HandlerInput.MODEL and loaded.input_type is Order
    assert loaded.spec.endswith(":takes_order")
    method = handler_from_callable(Service().handle)
    assert method.is_async and method.input is HandlerInput.BODY
    assert handler_from_callable(AsyncCallable()).is_async
    partial = handler_from_callable(functools.partial(takes_two, other=1))
    assert not partial.is_async and partial.input is HandlerInput.MODEL


@pytest.mark.parametrize(
    ("handler", "needle"),
    [
        (lambda: None, "takes no argument"),
        (takes_two, "takes 2 required arguments"),
        (generator, "generator function"),
        (42, "not callable"),
        ("no_colon_here", "expected 'module:function'"),
        ("tests.nowhere:handle", "not found"),
    ],
)
def test_a_handler_that_cannot_be_one_is_refused_at_construction(handler: Any, needle: str) -> None:
    with pytest.raises(rmqkit.ConfigError, match=needle):
        rmqkit.Consumer(handler, queue="q", settings=SETTINGS)


@pytest.mark.parametrize(
    "options",
    [
        {"queue": ""},
        {"queue": "  "},
        {"queue": "q", "prefetch": 0},
        {"queue": "q", "prefetch": 70000},
        {"queue": "q", "concurrency": 0},
        {"queue": "q", "max_attempts": 0},
        {"queue": "q", "handler_timeout_s": 0},
        {"queue": "q", "handler_timeout_s": float("nan")},
        {"queue": "q", "grace_s": -1},
        {"queue": "q", "grace_s": float("nan")},
        {"queue": "q", "start_timeout_s": 0},
    ],
)
def test_bad_arguments_are_usage_errors(options: dict[str, Any]) -> None:
    with pytest.raises(rmqkit.UsageError):
        rmqkit.Consumer(takes_order, settings=SETTINGS, **options)


def test_a_transaction_handler_without_dedupe_fails_start_before_connecting() -> None:
    async def with_tx(order: Order, tx: rmqkit.Transaction) -> None:
        return None

    consumer = rmqkit.Consumer(with_tx, queue="q", settings=SETTINGS)
    with pytest.raises(rmqkit.ConfigError, match="--dedupe"):
        asyncio.run(consumer.start())
    assert not consumer.consuming
    asyncio.run(consumer.stop())  # nothing started: nothing to do


def test_a_missing_topology_file_is_refused_at_construction(tmp_path: Any) -> None:
    with pytest.raises(rmqkit.TopologyFileError):
        rmqkit.Consumer(takes_order, queue="q", topology=tmp_path / "none.toml", settings=SETTINGS)

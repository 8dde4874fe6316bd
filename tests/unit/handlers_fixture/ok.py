"""Handlers that load: every supported parameter kind, sync and async, and the outcome cases."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from typing import Any

from pydantic import BaseModel

from rmqkit.consumer.message import DecodeError, Message, Permanent, Retry

received: list[Any] = []
threads: list[str] = []  # names of the threads sync handlers ran in
tasks: list[asyncio.Task[Any] | None] = []
request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="unset")


class Order(BaseModel):
    id: int
    sku: str


class Conflict(Exception):
    """A base class listed as permanent in the tests."""


class VersionConflict(Conflict):
    pass


async def handle(message: Message) -> None:
    received.append(message)


async def record_task(message: Message) -> None:
    tasks.append(asyncio.current_task())


def record_context_sync(message: Message) -> None:
    threads.append(threading.current_thread().name)
    received.append(request_id.get())


def handle_sync(message: Message) -> None:
    threads.append(threading.current_thread().name)
    received.append(message)


async def handle_unannotated(message):  # type: ignore[no-untyped-def]
    received.append(message)


async def handle_order(order: Order) -> None:
    received.append(order)


def handle_order_sync(order: Order) -> None:
    threads.append(threading.current_thread().name)
    received.append(order)


async def handle_bytes(body: bytes) -> None:
    received.append(body)


async def handle_text(text: str) -> None:
    received.append(text)


async def handle_dict(data: dict[str, Any]) -> None:
    received.append(data)


async def handle_any(data: Any) -> None:
    received.append(data)


async def handle_orders(orders: list[Order]) -> None:
    received.append(orders)


async def handle_with_default(message: Message, extra: int = 1) -> None:
    received.append((message, extra))


async def handle_star_args(*args: Any) -> None:
    received.append(args)


async def handle_json(message: Message) -> None:
    received.append(message.json())


def handle_json_sync(message: Message) -> None:
    received.append(message.json())


async def handle_validate_inside(message: Message) -> None:
    Order.model_validate_json(message.body)


async def raise_permanent(message: Message) -> None:
    raise Permanent("no such customer")


async def raise_decode_error(message: Message) -> None:
    raise DecodeError("custom format broken")


async def raise_retry(message: Message) -> None:
    raise Retry(5, "rate limited")


async def raise_retry_default(message: Message) -> None:
    raise Retry()


async def raise_value_error(message: Message) -> None:
    raise ValueError("database is down")


def raise_value_error_sync(message: Message) -> None:
    raise ValueError("database is down")


async def raise_subclass(message: Message) -> None:
    raise VersionConflict("stale version 3")


async def raise_own_timeout(message: Message) -> None:
    raise TimeoutError("upstream timed out")


async def raise_cancelled(message: Message) -> None:
    raise asyncio.CancelledError()


async def sleep_forever(message: Message) -> None:
    await asyncio.sleep(3600)


async def swallow_cancel_then_raise(message: Message) -> None:
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        raise RuntimeError("cleanup failed while cancelled") from None


async def swallow_cancel_and_return(message: Message) -> None:
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        received.append("cancel swallowed")


async def sleep_briefly(message: Message) -> None:
    await asyncio.sleep(float(message.body or b"0.01"))


release = threading.Event()
finished = threading.Event()


def block_sync(message: Message) -> None:
    release.wait(10)
    finished.set()


def sleep_sync(message: Message) -> None:
    time.sleep(0.01)


def sync_returning_coroutine(message: Message) -> Any:
    return handle(message)


class Stateful:
    def __init__(self) -> None:
        self.seen = 0

    async def __call__(self, message: Message) -> None:
        self.seen += 1


stateful = Stateful()


class Handlers:
    class Nested:
        @staticmethod
        async def handle(message: Message) -> None:
            received.append(message)


# --- not handlers ---------------------------------------------------------------------------------
NOT_CALLABLE = 42


def no_args() -> None:
    pass


def two_args(message: Message, other: int) -> None:
    pass


def keyword_only(message: Message, *, flag: bool) -> None:
    pass


def generator(message: Message) -> Any:
    yield message


class NotAModel:
    pass


async def unsupported_annotation(thing: NotAModel) -> None:
    pass

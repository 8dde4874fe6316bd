"""Handlers for the settle tests (tests/integration/test_settle*.py): every delivery settled.

They record into the same SQLite ledger as tests/handlers.py (RMQKIT_TEST_LEDGER), so the tests
read them with tests.consumer_harness.effects/events.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pydantic import BaseModel, field_validator

import rmqkit
from tests.handlers import handle, record

__all__ = ["FAULT", "by_model", "handle", "stubborn", "unprintable_error"]


class Job(BaseModel):
    """A job whose ``payload`` is JSON in a string, parsed by the model itself."""

    id: str
    payload: str = "{}"

    @field_validator("payload")
    @classmethod
    def _parses(cls, value: str) -> str:
        # json.loads of a payload nested deeper than Python's recursion limit raises
        # RecursionError: not a ValueError, so pydantic lets it through as it is.
        json.loads(value)
        return value


async def by_model(job: Job) -> None:
    """The handler's argument is built by the model (a RecursionError comes out of it)."""
    record(job.id, 1, "attempt")
    record(job.id, 1, "effect")


async def stubborn(message: rmqkit.Message) -> None:
    """``handle``, but a body with ``"stubborn": seconds`` sleeps that long and ignores the
    handler timeout's cancellation (the delivery stays undecided meanwhile)."""
    order: dict[str, Any] = message.json()
    if order.get("stubborn"):
        record(message.message_id, message.attempt, "attempt")
        deadline = asyncio.get_running_loop().time() + float(order["stubborn"])
        while (left := deadline - asyncio.get_running_loop().time()) > 0:
            try:
                await asyncio.sleep(left)
            except asyncio.CancelledError:
                continue  # ignores the cancellation and runs on
        record(message.message_id, message.attempt, "effect")
        return
    await handle(message)


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this error cannot be printed")


async def unprintable_error(message: rmqkit.Message) -> None:
    """``handle``, but a body with ``"unprintable": true`` raises an exception whose str()
    raises in turn (the consumer's error formatting fails, not the handler)."""
    order: dict[str, Any] = message.json()
    if order.get("unprintable"):
        record(message.message_id, message.attempt, "attempt")
        raise _Unprintable()
    await handle(message)


# --- faults injected into rmqkit's own per-message path ------------------------------------------
# A delivery whose header FAULT names a fault makes rmqkit's code (not the handler) fail on it:
#   "route": the dispatcher raises before the handler runs;
#   "copy": every copy that carries the delivery's headers cannot be encoded;
#   "always": no copy of it can be encoded at all (not even one without its headers).
FAULT = "test-fault"
UNWRITABLE = 2**64  # no AMQP integer type holds it: encoding the copy's headers fails


def _install_faults() -> None:
    from rmqkit.consumer import copies, delivery

    route = delivery.delivered_route
    copy_properties = copies.copy_properties

    def faulty_route(exchange: str, routing_key: str, headers: Any) -> tuple[str, str]:
        if (headers or {}).get(FAULT) == "route":
            raise RuntimeError("injected fault in the dispatcher")
        return route(exchange, routing_key, headers)

    def faulty_copy(original: Any, headers: Any) -> Any:
        fault = (original.headers or {}).get(FAULT)
        if (fault == "copy" and headers.get(FAULT) == "copy") or fault == "always":
            headers = {**headers, "unwritable": UNWRITABLE}
        return copy_properties(original, headers)

    delivery.delivered_route = faulty_route  # type: ignore[assignment]
    copies.copy_properties = faulty_copy  # type: ignore[assignment]


_install_faults()

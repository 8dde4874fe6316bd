"""Handlers for the settle tests (tests/integration/test_settle*.py): every delivery settled.

They record into the same SQLite ledger as tests/handlers.py (RMQKIT_TEST_LEDGER), so the tests
read them with tests.consumer_harness.effects/events.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, field_validator

import rmqkit
from tests.handlers import handle, record

__all__ = ["by_model", "handle", "unprintable_error"]


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

"""Handlers for tests/integration/test_encryption_leaks.py and its adversarial module: each
fails with an error whose text spells a decrypted value one way or another, as careless
handlers do. The body's ``mode`` picks the spelling; ``customer.name`` holds the value."""

from __future__ import annotations

import base64
import json
import urllib.parse
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ValidationError

import rmqkit


class _Number(BaseModel):
    n: int


def _spelled(body: dict[str, Any]) -> str:
    value = str(body["customer"]["name"])
    mode = body["mode"]
    if mode == "json":
        return json.dumps(body)
    if mode == "repr":
        return repr(body)
    if mode == "ascii":
        return ascii(body)
    if mode == "raw":
        return f"no such customer: {value}"
    if mode == "url":
        return "GET /customers?name=" + urllib.parse.quote_plus(value)
    if mode == "split":  # across two lines of the message (and so of the traceback)
        return f"first half {value[: len(value) // 2]}\n  second half {value[len(value) // 2 :]}"
    if mode == "base64":
        return "payload " + base64.b64encode(value.encode()).decode()
    raise AssertionError(mode)


def leak(message: rmqkit.Message) -> None:
    """Fail permanently, the error quoting the decrypted value as ``mode`` says; ``pydantic``:
    a ValidationError's text (its truncated ``input_value``) re-raised as another error;
    ``chained``: the value only in the cause and in a note."""
    body = message.json()
    mode = body["mode"]
    if mode == "pydantic":
        try:
            _Number(n=body["customer"]["name"])
        except ValidationError as exc:
            raise rmqkit.Permanent(f"validation failed: {exc}") from None
    if mode == "chained":
        try:
            raise KeyError(body["customer"]["name"])
        except KeyError as exc:
            error = rmqkit.Permanent("lookup failed")
            error.add_note(f"while looking up {body['customer']['name']!r}")
            raise error from exc
    raise rmqkit.Permanent(_spelled(body))


def _never(value: str) -> str:
    raise ValueError(f"unknown customer {value}")


class Customer(BaseModel):
    name: Annotated[str, AfterValidator(_never)]


class Order(BaseModel):
    mode: str
    customer: Customer


def typed(order: Order) -> None:
    """Never runs: the decrypted body fails the model's own validator, whose message quotes
    the value (parked undecodable)."""
    raise AssertionError(order)

"""Models marking fields ``rmqkit.Sensitive`` and a handler taking one (issue 16), for
tests/integration/test_sensitive_model.py.

The handler appends the model it received (by field name) as one JSON line to the file
RMQKIT_TEST_OUT, so the test reads what the handler got after the consumer decrypted it.
"""

from __future__ import annotations

import json
import os
from typing import Annotated

from pydantic import BaseModel

import rmqkit

# The work queue these models go through: the topology encrypts customer.name only, tax_id is
# marked on the model alone (the consumer warns about it at start).
TOPOLOGY = """
[exchanges.people]
type = "direct"
[queues."people.work"]
bind = [{ exchange = "people", routing_key = "person" }]
retry_delays = []
sensitive_fields = ["customer.name"]
encrypt = true
"""


class Customer(BaseModel):
    """Nested: its ``name`` is encrypted at ``customer.name``."""

    name: Annotated[str, rmqkit.Sensitive()]
    tier: str = "standard"


class Person(BaseModel):
    """``customer.name`` and ``tax_id`` (blind-indexed) are marked; ``id`` is not."""

    id: str
    customer: Customer | None = None
    tax_id: Annotated[str, rmqkit.Sensitive(blind_index=True)]


async def seen_person(person: Person) -> None:
    """Record the Person the consumer built for the handler."""
    line = (json.dumps(person.model_dump(), sort_keys=True) + "\n").encode()
    fd = os.open(os.environ["RMQKIT_TEST_OUT"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


async def seen_people(people: list[Person]) -> None:
    """Takes a list: its items' marks are array paths ([].customer.name, [].tax_id)."""

"""What the AMQP wire can carry, checked before anything is sent: short-string lengths, table
key lengths, 64-bit integers, and the exchange names the client accepts.

The outbox's ``add`` refuses a row that breaks one of these, and its relay leaves a row written
some other way pending with the reason (rmqkit/outbox/write.py, rmqkit/outbox/amqp.py): the broker
would never take it, so the relay would retry it forever.
"""

from __future__ import annotations

import re
from typing import Final

SHORTSTR_MAX: Final = 255  # AMQP 0-9-1 short strings: exchange, routing key, message_id ...
FIELD_NAME_MAX: Final = 128  # AMQP table field names (pamqp silently truncates longer ones)
INT64: Final = 2**63
# The exchange names rmqkit's AMQP client (pamqp) accepts in a declare: the relay checks that
# an exchange exists with a passive declare, which refuses any other name before it is sent.
EXCHANGE_NAME: Final = re.compile(r"[a-zA-Z0-9\-_.:@#,/+ ]*")


def wire_problem(
    exchange: str, routing_key: str, message_id: str, content_type: str | None
) -> str | None:
    """Why a row with these names cannot be published on the AMQP wire; None if it can.

    The broker would never take such a row, so the relay would retry it forever: ``add``
    refuses it, and the relay leaves a row written some other way pending with this error
    instead of failing the rest of its batch.
    """
    named = {"exchange": exchange, "routing key": routing_key, "message_id": message_id}
    named["content_type"] = content_type or ""
    for what, value in named.items():
        size = len(value.encode())
        if size > SHORTSTR_MAX:
            return f"{what} is {size} bytes; AMQP allows at most {SHORTSTR_MAX}"
    if not EXCHANGE_NAME.fullmatch(exchange):
        return (
            f"exchange {exchange!r}: rmqkit supports exchange names of letters, digits and "
            "-_.:@#,/+ and space only (its AMQP client refuses others)"
        )
    return None


def headers_problem(value: object, path: str = "headers") -> str | None:
    """Why ``value`` (decoded JSON headers) cannot be an AMQP table; None if it can."""
    if isinstance(value, dict):
        for key, item in value.items():
            if len(str(key).encode()) > FIELD_NAME_MAX:
                return f"{path}: a key of {len(str(key).encode())} bytes (AMQP: {FIELD_NAME_MAX})"
            if (problem := headers_problem(item, f"{path}.{key}")) is not None:
                return problem
    elif isinstance(value, list):
        for n, item in enumerate(value):
            if (problem := headers_problem(item, f"{path}[{n}]")) is not None:
                return problem
    elif isinstance(value, int) and not isinstance(value, bool) and not -INT64 <= value < INT64:
        return f"{path}: the integer {value} does not fit AMQP's 64 bits"
    return None

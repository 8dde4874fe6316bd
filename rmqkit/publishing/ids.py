"""Stable message_ids: given, taken from a field, random, or derived from the input (the same
input published again gets the same ids, see ``derived_message_id``)."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final


def new_message_id() -> str:
    """A random message_id (``--random-ids``): a rerun cannot be matched with the first run."""
    return uuid.uuid4().hex


# Fixed namespace of the ids `rmqkit publish` derives (UUID version 5 semantics: SHA-1 of the
# namespace and the name). Changing it changes every derived id: never change it.
ID_NAMESPACE: Final = uuid.UUID("4f0b2a3e-6a55-5d0c-9a57-7d9e1c2b8a61")


def derived_message_id(
    exchange: str,
    routing_key: str,
    position: int,
    body: bytes,
    *,
    keyed: Callable[[bytes], bytes] | None = None,
) -> str:
    """The message_id `rmqkit publish` gives a message that has none: a name-based UUID (version 5,
    32 hex digits) of the exchange, the routing key, the input position (1-based line number, or
    --body index) and the body.

    Publishing the same input to the same exchange and key again therefore gives every message the
    same id, so after a lost connection a rerun's duplicates are recognisable by an idempotent
    consumer; identical bodies at different positions, or sent elsewhere, get different ids.

    ``keyed``: an HMAC (the key ring's ``index_digest``) for a body with sensitive fields. An
    unkeyed id of a plaintext body lets anyone who reads the id test guesses of a value (a
    six-digit tax id is a million SHA-1s); keyed, it is as stable (the same input, the same
    id) and cannot be recomputed without the index key. A UUID of version 8 (RFC 9562) then.
    """
    exchange_bytes, key_bytes = exchange.encode(), routing_key.encode()
    # length-prefixed, so no text can move between the parts and give the same name
    name = b"%d:%s%d:%s%d:" % (
        len(exchange_bytes),
        exchange_bytes,
        len(key_bytes),
        key_bytes,
        position,
    )
    if keyed is not None:
        raw = bytearray(keyed(_KEYED_PREFIX + name + body)[:16])
        raw[6] = (raw[6] & 0x0F) | 0x80  # version 8: custom (keyed HMAC-SHA256)
    else:
        digest = hashlib.sha1(ID_NAMESPACE.bytes, usedforsecurity=False)
        digest.update(name)
        digest.update(body)
        raw = bytearray(digest.digest()[:16])
        raw[6] = (raw[6] & 0x0F) | 0x50  # version 5 (what uuid.UUID(..., version=5) sets)
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    return raw.hex()


_KEYED_PREFIX: Final = b"rmqkit-id/1\x00"


@dataclass(frozen=True)
class IdSource:
    """How a message without an explicit message_id gets one.

    ``field``: a dotted path (``order.id``) to take it from: in an NDJSON record (the line's
    object, e.g. ``body.order_id``; ``in_record``), or in a plain line parsed as JSON.
    ``random``: a fresh uuid4 each run (a rerun's duplicates cannot be recognised). Otherwise
    ``derived_message_id``.
    """

    exchange: str = ""
    routing_key: str = ""
    field: str | None = None
    random: bool = False
    in_record: bool = False  # ``field`` is a path in the NDJSON record, not in the body

    @property
    def body_field(self) -> str | None:
        """The path in the message body the id is taken from (None: not from the body, e.g.
        an NDJSON record's own field)."""
        if self.field is None:
            return None
        if not self.in_record:
            return self.field
        return self.field.removeprefix("body.") if self.field.startswith("body.") else None

    @property
    def derives(self) -> bool:
        """Whether an id is derived from the message (``derived_message_id``)."""
        return self.field is None and not self.random

    @property
    def repeatable(self) -> bool:
        """Whether the same input published again gets the same ids."""
        return not self.random

    def message_id(
        self, position: int, body: bytes, routing_key: str | None, record: Any = None
    ) -> str:
        """The id of the message at ``position``; ValueError (the reason) if ``field`` is not
        there. ``record``: the parsed NDJSON object (for plain lines the body is parsed)."""
        if self.field is not None:
            if record is None:
                try:
                    record = json.loads(body)
                except ValueError:
                    raise ValueError(f"--id-from {self.field}: the line is not JSON") from None
            return _field_value(record, self.field)
        if self.random:
            return new_message_id()
        key = self.routing_key if routing_key is None else routing_key
        return derived_message_id(self.exchange, key, position, body)


def _field_value(record: Any, path: str) -> str:
    value = record
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            raise ValueError(f"--id-from {path}: no field {part!r}")
        value = value[part]
    if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
        # the value itself is not quoted: it may be anything, personal data included
        kind = "an empty string" if value == "" else f"a {type(value).__name__} value"
        raise ValueError(f"--id-from {path}: wants a non-empty string or integer, got {kind}")
    return str(value)

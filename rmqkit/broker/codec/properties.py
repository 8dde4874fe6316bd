"""Basic properties on the exact codec: ``TypedProperties``, ``decode_properties``, PROPERTIES.

``TypedProperties`` is a ``pamqp.commands.Basic.Properties`` subclass whose ``unmarshal`` and
``marshal`` use ``rmqkit.broker.codec.wire``. Pass it as a publish's ``properties``: pamqp's
frame code calls ``properties.marshal()``, so the exact types go on the wire with no
patching. Reading typed deliveries needs ``rmqkit.broker.codec.hook``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Final

import pamqp.encode
from pamqp import commands as spec

from rmqkit.broker.codec.fieldtypes import FieldValue, Timestamp
from rmqkit.broker.codec.wire import _U8, _U16, _U64, _decode_table, _encode_table, _span

SHORTSTR, OCTET, TIMESTAMP, TABLE = "shortstr", "octet", "timestamp", "table"
"""The AMQP types of the Basic properties (``Property.kind``)."""


@dataclass(frozen=True, slots=True)
class Property:
    """One Basic property: its AMQP name, pamqp attribute, flag bit and AMQP type."""

    name: str  # the AMQP name, used in records
    attr: str  # pamqp's attribute (``type`` is ``message_type`` there)
    flag: int
    kind: str


PROPERTIES: Final[tuple[Property, ...]] = (
    Property("content_type", "content_type", 0x8000, SHORTSTR),
    Property("content_encoding", "content_encoding", 0x4000, SHORTSTR),
    Property("headers", "headers", 0x2000, TABLE),
    Property("delivery_mode", "delivery_mode", 0x1000, OCTET),
    Property("priority", "priority", 0x0800, OCTET),
    Property("correlation_id", "correlation_id", 0x0400, SHORTSTR),
    Property("reply_to", "reply_to", 0x0200, SHORTSTR),
    Property("expiration", "expiration", 0x0100, SHORTSTR),
    Property("message_id", "message_id", 0x0080, SHORTSTR),
    Property("timestamp", "timestamp", 0x0040, TIMESTAMP),
    Property("type", "message_type", 0x0020, SHORTSTR),
    Property("user_id", "user_id", 0x0010, SHORTSTR),
    Property("app_id", "app_id", 0x0008, SHORTSTR),
    Property("cluster_id", "cluster_id", 0x0004, SHORTSTR),
)
"""Every Basic property in wire order: record name, pamqp attribute, flag bit, AMQP type."""

PROPERTY_NAMES: Final = tuple(p.name for p in PROPERTIES)

_UNPINNED: Final = object()


class TypedProperties(spec.Basic.Properties):
    """``Basic.Properties`` that decode and encode with the exact codec (rmqkit.broker.codec.wire).

    Differences from pamqp's class, all in the direction of "what was on the wire":

    * header values are the typed scalars on decode and are encoded with their own tag; plain
      ints/floats/Decimals/datetimes are encoded as pamqp would;
    * ``timestamp`` decodes to ``Timestamp`` (raw seconds, no millisecond guess);
    * ``None`` means absent and ``""`` is sent as a present empty string (pamqp drops ``""``);
      ``cluster_id`` defaults to None, may hold a value (RabbitMQ delivers whatever a publisher
      set), and ``delivery_mode``/``priority`` are any octet;
    * a short string that is not UTF-8 is held with surrogate escapes and written back as it was;
    * the ``message_id`` the object was built (or decoded) with is what ``marshal()`` sends when
      it was absent or empty: aiormq's ``basic_publish`` writes a random UUID into a properties
      object without one, for its own return bookkeeping, and that must not reach the wire. Set
      the id when building the object, not afterwards.
    """

    _pinned_message_id: object

    def __init__(
        self,
        content_type: str | None = None,
        content_encoding: str | None = None,
        headers: Mapping[str, FieldValue] | None = None,
        delivery_mode: int | None = None,
        priority: int | None = None,
        correlation_id: str | None = None,
        reply_to: str | None = None,
        expiration: str | None = None,
        message_id: str | None = None,
        timestamp: int | datetime | None = None,
        message_type: str | None = None,
        user_id: str | None = None,
        app_id: str | None = None,
        cluster_id: str | None = None,
    ) -> None:
        super().__init__()
        values = {
            "content_type": content_type,
            "content_encoding": content_encoding,
            "headers": headers,
            "delivery_mode": delivery_mode,
            "priority": priority,
            "correlation_id": correlation_id,
            "reply_to": reply_to,
            "expiration": expiration,
            "message_id": message_id,
            "timestamp": timestamp,
            "message_type": message_type,
            "user_id": user_id,
            "app_id": app_id,
            "cluster_id": cluster_id,
        }
        for attr, value in values.items():
            setattr(self, attr, value)
        self._pin_message_id()
        self.validate()

    def _pin_message_id(self) -> None:
        self._pinned_message_id = _UNPINNED if self.message_id else self.message_id

    def validate(self) -> None:
        """Octets in range; unlike pamqp, any delivery_mode octet and a set cluster_id pass."""
        for attr in ("delivery_mode", "priority"):
            value = getattr(self, attr, None)
            if value is not None and not (isinstance(value, int) and 0 <= value <= 255):
                raise ValueError(f"{attr} must be an octet (0..255), not {value!r}")

    def wire_message_id(self) -> str | None:
        """The message_id ``marshal()`` sends (see the class docstring)."""
        pinned = self._pinned_message_id
        return self.message_id if pinned is _UNPINNED else pinned  # type: ignore[return-value]

    def marshal(self) -> bytes:
        flags = 0
        parts: list[bytes] = []
        for prop in PROPERTIES:
            value = (
                self.wire_message_id() if prop.attr == "message_id" else getattr(self, prop.attr)
            )
            if value is None:
                continue
            flags |= prop.flag
            try:
                parts.append(_encode_property(prop, value))
            except (TypeError, ValueError) as error:
                raise type(error)(f"{prop.name}: {error}") from None
        return _U16.pack(flags) + b"".join(parts)

    def unmarshal(self, flags: int, data: bytes) -> None:
        data = bytes(data)
        pos = 0
        for prop in PROPERTIES:
            if not flags & prop.flag:
                continue
            value: object
            if prop.kind == SHORTSTR:
                end = _span(data, pos + 1, data[pos], len(data), prop.name)
                value = data[pos + 1 : end].decode("utf-8", "surrogateescape")
            elif prop.kind == OCTET:
                end = _span(data, pos, 1, len(data), prop.name)
                value = data[pos]
            elif prop.kind == TIMESTAMP:
                end = _span(data, pos, 8, len(data), prop.name)
                value = int.__new__(Timestamp, _U64.unpack_from(data, pos)[0])
            else:
                value, end = _decode_table(data, pos, len(data), 0)
            setattr(self, prop.attr, value)
            pos = end
        self._pin_message_id()


def _encode_property(prop: Property, value: object) -> bytes:
    if prop.kind == SHORTSTR:
        if not isinstance(value, str):
            raise TypeError(f"expected a string, not {type(value).__name__}")
        raw = value.encode("utf-8", "surrogateescape")
        if len(raw) > 255:
            raise ValueError(f"{len(raw)} bytes; a short string holds at most 255")
        return _U8.pack(len(raw)) + raw
    if prop.kind == OCTET:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255:
            raise ValueError(f"expected an octet (0..255), not {value!r}")
        return _U8.pack(value)
    if prop.kind == TIMESTAMP:
        if isinstance(value, datetime):
            value = Timestamp.from_datetime(value)
        elif isinstance(value, time.struct_time):
            return pamqp.encode.timestamp(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"expected seconds (int) or a datetime, not {type(value).__name__}")
        return _U64.pack(Timestamp(value))
    if not isinstance(value, Mapping):
        raise TypeError(f"expected a table (dict), not {type(value).__name__}")
    return _encode_table(value, 0)


def decode_properties(data: bytes) -> TypedProperties:
    """Property flags + property list (a content header after its first 12 bytes)."""
    data = bytes(data)
    flags, pos = 0, 0
    for word in range(4):  # Basic uses one flag word; a set bit 0 announces another
        _span(data, pos, 2, len(data), "property flags")
        partial: int = _U16.unpack_from(data, pos)[0]
        flags |= (partial & 0xFFFE) << (16 * word)
        pos += 2
        if not partial & 1:
            break
    properties = TypedProperties()
    properties.unmarshal(flags, data[pos:])
    return properties


def copy_properties(
    original: spec.Basic.Properties, headers: Mapping[str, FieldValue]
) -> TypedProperties:
    """Properties for a copy of a delivered message (retry, park, replay): persistent, the same
    ``message_id`` and metadata, ``headers`` replaced.

    No ``expiration``: a copy must not expire in a wait or parking queue. No ``user_id``: the
    broker refuses one that is not the publishing user's (406 closes the channel).
    """
    return TypedProperties(
        content_type=original.content_type,
        content_encoding=original.content_encoding,
        headers=headers,
        delivery_mode=2,
        priority=original.priority,
        correlation_id=original.correlation_id,
        reply_to=original.reply_to,
        message_id=original.message_id,
        timestamp=original.timestamp,
        message_type=original.message_type,
        app_id=original.app_id,
    )


Properties = spec.Basic.Properties
"""The client's Basic properties class (``TypedProperties`` is a subclass): a delivery's
``header.properties``, and what a publish takes."""

__all__ = [
    "OCTET",
    "PROPERTIES",
    "PROPERTY_NAMES",
    "SHORTSTR",
    "TABLE",
    "TIMESTAMP",
    "Properties",
    "Property",
    "TypedProperties",
    "copy_properties",
    "decode_properties",
]

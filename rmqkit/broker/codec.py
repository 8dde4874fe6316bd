"""Exact, typed codec for parked messages: AMQP wire values ⇄ NDJSON export records.

``rmqkit parking export`` writes one JSON record per message and ``import`` publishes the records
back; the two must round-trip exactly, header field types included (docs/export-format.md). pamqp,
the codec under aiormq and aio-pika (4.0.1 checked), cannot do that by itself:

* it decodes every integer width (``b B s u I i l L``) to a plain ``int`` and, on encode, picks the
  smallest width that fits: a 16-bit ``s`` holding 5 goes back as 8-bit ``b``, a 32-bit ``I``
  holding 300 as ``s``; unsigned ``B``/``u``/``i`` come back signed when the value allows;
* a Python ``float`` is always encoded as 32-bit ``f`` (``d`` cannot be produced, doubles lose
  precision);
* a ``T`` timestamp above 0xFFFFFFFF is taken for milliseconds and divided by 1000, and the encoder
  writes whole seconds, so such a value comes back 1000 times smaller; a value past year 9999
  (e.g. 2**64-1, which RabbitMQ accepts) makes the decoder raise, which closes the connection;
* a long string that is not UTF-8 decodes to ``bytes``, which the encoder refuses; a table key or a
  short-string property that is not UTF-8 makes the decoder raise (connection closed);
* the encoder sorts table keys, cuts keys to 128 bytes, and drops properties that are ``""``.

This module therefore has its own wire codec and a value model that keeps the type of every value:

* **Typed scalars** ``Int8`` ``UInt8`` ``Int16`` ``UInt16`` ``Int32`` ``UInt32`` ``Int64``
  ``Int64L`` ``Timestamp`` ``Float32`` ``Float64`` ``AmqpDecimal``. Each is a subclass of
  ``int``/``float``/``Decimal`` with a ``tag`` (the AMQP type letter), so code that reads headers as
  plain numbers keeps working. Types that are unambiguous stay plain Python: ``bool`` (``t``),
  ``str`` (``S``), ``bytes`` (``S`` that is not UTF-8), ``bytearray`` (``x``), ``None`` (``V``),
  ``list`` (``A``), ``dict`` (``F``).
* **TypedProperties**, a ``pamqp.commands.Basic.Properties`` subclass whose ``unmarshal`` and
  ``marshal`` use this codec. Pass it to ``aiormq.Channel.basic_publish(properties=...)``: pamqp's
  frame code calls ``properties.marshal()``, so the exact types go on the wire with no patching.
* **Reading** needs one hook, because aiormq decodes frames inside pamqp before any of our code
  sees them, and the widths are gone by then. ``install()`` wraps ``pamqp.frame.
  _unmarshal_header_frame`` (explicit, idempotent, version- and structure-checked). The wrapper is
  inert unless the context variable that ``typed_decoding()`` sets is true in the task that reads
  the socket. aiormq's reader task copies the context of whoever awaits ``aiormq.connect``, so:
  ``with typed_decoding(): conn = await aiormq.connect(url)`` (or ``await connect_typed(url)``)
  gives that one connection typed ``DeliveredMessage.header.properties``; every other connection
  in the process decodes exactly as before.
* **Records** (``message_to_record`` / ``record_to_message``, ``dumps_record`` / ``loads_record``):
  tagged JSON such as ``{"t": "s", "v": 5}``, format version ``"rmqkit_export": 1``.

What RabbitMQ 3.10.8 does with each type (seen, tests/integration/test_codec_roundtrip.py):
classic queues hand the content header back byte for byte. Quorum queues re-encode it to add
``x-delivery-count`` (type ``l``, also at 0, replacing a client-set one); that keeps every type,
``b``/``B``, ``s``/``u``, ``I``/``i`` included, except ``L``, which comes back as ``l`` (same
bytes). Re-encoding also sorts the top-level header keys (nested tables keep their order). The
broker refuses NaN and ±infinity in ``f``/``d`` (connection closed, 541 INTERNAL_ERROR) and
unknown type letters, strips ``BCC``, routes extra copies for ``CC`` (it must be an array of
strings), and checks ``user_id`` against the publishing user, ``expiration`` and
``delivery_mode`` (1 or 2).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import importlib.metadata
import json
import math
import operator
import struct
import time
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any, ClassVar, Final, Self, SupportsFloat, SupportsIndex, TypeAlias

import aiormq
import aiormq.abc
import pamqp.encode
import pamqp.frame
from pamqp import commands as spec
from pamqp.exceptions import UnmarshalingException
from pamqp.header import ContentHeader

from rmqkit.errors import DataError, RmqkitError

FORMAT_VERSION: Final = 1
"""Value of ``"rmqkit_export"`` in every record this module writes and the only one it reads."""

MAX_DEPTH: Final = 100
"""Deepest nesting of tables/arrays the codec accepts (a guard against stack exhaustion)."""

FieldValue: TypeAlias = (
    bool
    | int
    | float
    | Decimal
    | str
    | bytes
    | bytearray
    | datetime
    | time.struct_time
    | list["FieldValue"]
    | dict[str, "FieldValue"]
    | None
)
"""What a header value can be. Decoding yields the typed scalars, never plain int/float/Decimal."""

FieldTable: TypeAlias = dict[str, FieldValue]


# ------------------------------------------------------------------------------------------------
# Typed scalars
# ------------------------------------------------------------------------------------------------


class AmqpInt(int):
    """An int that remembers its AMQP field type. Subclasses fix the tag and the range."""

    __slots__ = ()
    tag: ClassVar[str] = ""
    minimum: ClassVar[int] = 0
    maximum: ClassVar[int] = 0
    wire: ClassVar[struct.Struct]

    def __new__(cls, value: SupportsIndex = 0) -> Self:
        number = operator.index(value)
        if not cls.minimum <= number <= cls.maximum:
            raise ValueError(
                f"{cls.__name__} (AMQP {cls.tag!r}) holds {cls.minimum}..{cls.maximum}, "
                f"not {number}"
            )
        return super().__new__(cls, number)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({int(self)})"

    def __str__(self) -> str:
        return int.__repr__(self)


class Int8(AmqpInt):
    """AMQP ``b``: signed 8-bit (short-short-int)."""

    __slots__ = ()
    tag = "b"
    minimum, maximum = -(2**7), 2**7 - 1
    wire = struct.Struct(">b")


class UInt8(AmqpInt):
    """AMQP ``B``: unsigned 8-bit (short-short-uint)."""

    __slots__ = ()
    tag = "B"
    minimum, maximum = 0, 2**8 - 1
    wire = struct.Struct(">B")


class Int16(AmqpInt):
    """AMQP ``s``: signed 16-bit (short-int)."""

    __slots__ = ()
    tag = "s"
    minimum, maximum = -(2**15), 2**15 - 1
    wire = struct.Struct(">h")


class UInt16(AmqpInt):
    """AMQP ``u``: unsigned 16-bit (short-uint)."""

    __slots__ = ()
    tag = "u"
    minimum, maximum = 0, 2**16 - 1
    wire = struct.Struct(">H")


class Int32(AmqpInt):
    """AMQP ``I``: signed 32-bit (long-int)."""

    __slots__ = ()
    tag = "I"
    minimum, maximum = -(2**31), 2**31 - 1
    wire = struct.Struct(">i")


class UInt32(AmqpInt):
    """AMQP ``i``: unsigned 32-bit (long-uint)."""

    __slots__ = ()
    tag = "i"
    minimum, maximum = 0, 2**32 - 1
    wire = struct.Struct(">I")


class Int64(AmqpInt):
    """AMQP ``l``: signed 64-bit (long-long-int). RabbitMQ's own ``x-delivery-count`` uses it."""

    __slots__ = ()
    tag = "l"
    minimum, maximum = -(2**63), 2**63 - 1
    wire = struct.Struct(">q")


class Int64L(AmqpInt):
    """AMQP ``L``: 64-bit, read as *signed* like RabbitMQ and pamqp do.

    The 0-9-1 grammar calls ``L`` unsigned, but RabbitMQ parses it as ``l`` (a quorum queue
    re-encodes it as ``l``, same bytes) and pamqp decodes it signed. Kept apart from ``Int64`` so
    a classic queue's ``L`` exports and imports as ``L``.
    """

    __slots__ = ()
    tag = "L"
    minimum, maximum = -(2**63), 2**63 - 1
    wire = struct.Struct(">q")


class Timestamp(AmqpInt):
    """AMQP ``T``: unsigned 64-bit count of seconds since the epoch, kept as the raw number.

    Many producers put milliseconds here; this type never guesses (pamqp does, see the module
    docstring). ``to_datetime()`` reads the number as seconds.
    """

    __slots__ = ()
    tag = "T"
    minimum, maximum = 0, 2**64 - 1
    wire = struct.Struct(">Q")

    def to_datetime(self) -> datetime | None:
        """The value as seconds since the epoch, in UTC; None if a datetime cannot hold it."""
        try:
            return datetime.fromtimestamp(int(self), tz=UTC)
        except (OverflowError, OSError, ValueError):
            return None

    @classmethod
    def from_datetime(cls, value: datetime) -> Timestamp:
        """Whole seconds of ``value`` (naive means UTC), as pamqp encodes a datetime."""
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return cls(int(value.timestamp()))


_INT_TYPES: Final[tuple[type[AmqpInt], ...]] = (
    Int8,
    UInt8,
    Int16,
    UInt16,
    Int32,
    UInt32,
    Int64,
    Int64L,
    Timestamp,
)


class Float32(float):
    """AMQP ``f``: IEEE 754 single precision. The value is rounded to 32 bits when built."""

    __slots__ = ()
    tag: ClassVar[str] = "f"
    wire: ClassVar[struct.Struct] = struct.Struct(">f")

    def __new__(cls, value: SupportsFloat = 0.0) -> Self:
        number = float(value)
        try:
            rounded: float = cls.wire.unpack(cls.wire.pack(number))[0]
        except (OverflowError, struct.error) as error:
            raise ValueError(f"Float32 (AMQP 'f') cannot hold {number!r}: {error}") from None
        return super().__new__(cls, rounded)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({float.__repr__(self)})"

    def __str__(self) -> str:
        return float.__repr__(self)


class Float64(float):
    """AMQP ``d``: IEEE 754 double precision."""

    __slots__ = ()
    tag: ClassVar[str] = "d"
    wire: ClassVar[struct.Struct] = struct.Struct(">d")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({float.__repr__(self)})"

    def __str__(self) -> str:
        return float.__repr__(self)


class AmqpDecimal(Decimal):
    """AMQP ``D``: a scale octet (0..255 decimal places) and a 32-bit unscaled value.

    The exponent is part of the value: ``AmqpDecimal("1.50")`` is scale 2, unscaled 150, and
    stays so. The unscaled value is read and written as *signed* 32-bit, as pamqp, the Java and
    .NET clients do (the 0-9-1 grammar says unsigned; RabbitMQ copies the bytes either way).
    """

    __slots__ = ()
    tag: ClassVar[str] = "D"

    def __new__(cls, value: Decimal | str | int = "0") -> Self:
        try:
            number = super().__new__(cls, value)
        except InvalidOperation:
            raise ValueError(f"not a decimal number: {value!r}") from None
        _decimal_parts(number)  # validates
        return number

    @property
    def scale(self) -> int:
        """Number of decimal places (the AMQP scale octet)."""
        return _decimal_parts(self)[0]

    @property
    def unscaled(self) -> int:
        """The integer the wire carries: ``self == unscaled * 10 ** -scale``."""
        return _decimal_parts(self)[1]

    def __repr__(self) -> str:
        return f"AmqpDecimal('{Decimal.__str__(self)}')"


def _decimal_parts(value: Decimal) -> tuple[int, int]:
    sign, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):
        raise ValueError(f"AMQP decimals are finite, not {value}")
    if exponent > 0:
        raise ValueError(
            f"{value} has a positive exponent; AMQP decimals have a scale of 0..255 places, "
            f"write it out (e.g. 100, not 1E+2)"
        )
    if exponent < -255:
        raise ValueError(f"{value} has {-exponent} decimal places; AMQP allows at most 255")
    unscaled = int("".join(map(str, digits)) or "0")
    if sign and unscaled == 0:
        raise ValueError("AMQP decimals have no negative zero")
    unscaled = -unscaled if sign else unscaled
    if not -(2**31) <= unscaled <= 2**31 - 1:
        raise ValueError(f"{value}: the unscaled value {unscaled} does not fit in 32 bits")
    return -exponent, unscaled


def _make_decimal(scale: int, unscaled: int) -> AmqpDecimal:
    digits = tuple(int(c) for c in str(abs(unscaled)))
    return Decimal.__new__(AmqpDecimal, (1 if unscaled < 0 else 0, digits, -scale))


# ------------------------------------------------------------------------------------------------
# Wire decoding
# ------------------------------------------------------------------------------------------------

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_U64 = struct.Struct(">Q")

_Decoder: TypeAlias = Callable[[bytes, int, int, int], tuple[FieldValue, int]]


def _span(data: bytes, pos: int, size: int, limit: int, what: str) -> int:
    end = pos + size
    if end > limit:
        raise ValueError(f"{what} runs past the end of its container ({end} > {limit} bytes)")
    return end


def _length(data: bytes, pos: int, limit: int, what: str) -> tuple[int, int]:
    _span(data, pos, 4, limit, f"{what} length")
    size: int = _U32.unpack_from(data, pos)[0]
    return pos + 4, _span(data, pos + 4, size, limit, what)


def _fixed_decoder(cls: type[AmqpInt] | type[Float32] | type[Float64]) -> _Decoder:
    wire = cls.wire
    size = wire.size
    new: Callable[[type[Any], Any], FieldValue] = (
        int.__new__ if issubclass(cls, int) else float.__new__
    )

    def decode(data: bytes, pos: int, limit: int, depth: int) -> tuple[FieldValue, int]:
        end = _span(data, pos, size, limit, f"{cls.__name__} value")
        return new(cls, wire.unpack_from(data, pos)[0]), end

    return decode


def _decode_bool(data: bytes, pos: int, limit: int, depth: int) -> tuple[FieldValue, int]:
    end = _span(data, pos, 1, limit, "boolean value")
    return data[pos] != 0, end


def _decode_void(data: bytes, pos: int, limit: int, depth: int) -> tuple[FieldValue, int]:
    return None, pos


def _decode_decimal(data: bytes, pos: int, limit: int, depth: int) -> tuple[FieldValue, int]:
    end = _span(data, pos, 5, limit, "decimal value")
    return _make_decimal(data[pos], _I32.unpack_from(data, pos + 1)[0]), end


def _decode_long_string(data: bytes, pos: int, limit: int, depth: int) -> tuple[FieldValue, int]:
    start, end = _length(data, pos, limit, "long string")
    raw = data[start:end]
    try:
        return raw.decode("utf-8"), end
    except UnicodeDecodeError:
        return raw, end


def _decode_byte_array(data: bytes, pos: int, limit: int, depth: int) -> tuple[FieldValue, int]:
    start, end = _length(data, pos, limit, "byte array")
    return bytearray(data[start:end]), end


def _decode_array(data: bytes, pos: int, limit: int, depth: int) -> tuple[FieldValue, int]:
    if depth >= MAX_DEPTH:
        raise ValueError(f"tables and arrays nested deeper than {MAX_DEPTH} levels")
    start, end = _length(data, pos, limit, "array")
    items: list[FieldValue] = []
    pos = start
    while pos < end:
        value, pos = _decode_value(data, pos, end, depth + 1)
        items.append(value)
    return items, end


def _decode_table_value(data: bytes, pos: int, limit: int, depth: int) -> tuple[FieldValue, int]:
    if depth >= MAX_DEPTH:
        raise ValueError(f"tables and arrays nested deeper than {MAX_DEPTH} levels")
    return _decode_table(data, pos, limit, depth + 1)


def _decode_table(data: bytes, pos: int, limit: int, depth: int) -> tuple[FieldTable, int]:
    start, end = _length(data, pos, limit, "table")
    table: FieldTable = {}
    pos = start
    while pos < end:
        key_end = _span(data, pos + 1, data[pos], end, "table key")
        # Keys that are not UTF-8 (RabbitMQ accepts them) survive as surrogate escapes.
        key = data[pos + 1 : key_end].decode("utf-8", "surrogateescape")
        table[key], pos = _decode_value(data, key_end, end, depth)
    return table, end


_DECODERS: dict[int, _Decoder] = {
    ord("t"): _decode_bool,
    ord("S"): _decode_long_string,
    ord("x"): _decode_byte_array,
    ord("D"): _decode_decimal,
    ord("A"): _decode_array,
    ord("F"): _decode_table_value,
    ord("V"): _decode_void,
    **{ord(cls.tag): _fixed_decoder(cls) for cls in (*_INT_TYPES, Float32, Float64)},
}


def _decode_value(data: bytes, pos: int, limit: int, depth: int) -> tuple[FieldValue, int]:
    if pos >= limit:
        raise ValueError("a field value is missing its type byte")
    decoder = _DECODERS.get(data[pos])
    if decoder is None:
        raise ValueError(f"unknown field type {chr(data[pos])!r} (byte 0x{data[pos]:02x})")
    return decoder(data, pos + 1, limit, depth)


def decode_field_value(data: bytes) -> FieldValue:
    """One field value (type byte + payload) to its typed Python form. Raises ValueError."""
    value, end = _decode_value(bytes(data), 0, len(data), 0)
    if end != len(data):
        raise ValueError(f"{len(data) - end} bytes left after the field value")
    return value


def decode_field_table(data: bytes) -> FieldTable:
    """A field table (4-byte length + entries) to a dict of typed values. Raises ValueError."""
    table, end = _decode_table(bytes(data), 0, len(data), 0)
    if end != len(data):
        raise ValueError(f"{len(data) - end} bytes left after the field table")
    return table


# ------------------------------------------------------------------------------------------------
# Wire encoding
# ------------------------------------------------------------------------------------------------


def _encode_value(value: object, out: list[bytes], depth: int) -> None:
    # Order matters: bool is an int, the typed scalars are ints/floats/Decimals.
    if value is None:
        out.append(b"V")
    elif value is True or value is False:
        out.append(b"t\x01" if value else b"t\x00")
    elif isinstance(value, AmqpInt | Float32 | Float64):
        out.append(value.tag.encode())
        out.append(value.wire.pack(value))
    elif isinstance(value, AmqpDecimal):
        scale, unscaled = _decimal_parts(value)
        out.append(b"D" + _U8.pack(scale) + _I32.pack(unscaled))
    elif isinstance(value, str):
        _encode_long(b"S", value.encode("utf-8"), out)
    elif isinstance(value, bytes):
        _encode_long(b"S", value, out)  # a long string that is not UTF-8, as decoded
    elif isinstance(value, bytearray):
        _encode_long(b"x", bytes(value), out)
    elif isinstance(value, list):
        if depth >= MAX_DEPTH:
            raise ValueError(f"tables and arrays nested deeper than {MAX_DEPTH} levels")
        inner: list[bytes] = []
        for item in value:
            _encode_value(item, inner, depth + 1)
        _encode_long(b"A", b"".join(inner), out)
    elif isinstance(value, Mapping):
        if depth >= MAX_DEPTH:
            raise ValueError(f"tables and arrays nested deeper than {MAX_DEPTH} levels")
        out.append(b"F")
        out.append(_encode_table(value, depth + 1))
    elif isinstance(value, int | float | Decimal | datetime | time.struct_time):
        # A plain value has no width of its own: send what pamqp would send for it.
        out.append(pamqp.encode.encode_table_value(_any(value)))
    else:
        raise TypeError(f"no AMQP field type for {type(value).__name__} ({value!r})")


def _any(value: object) -> Any:
    return value


def _encode_long(tag: bytes, payload: bytes, out: list[bytes]) -> None:
    if len(payload) > 0xFFFFFFFF:
        raise ValueError("a long string, byte array or array is limited to 4 GiB")
    out.append(tag + _U32.pack(len(payload)))
    out.append(payload)


def _encode_key(key: object) -> bytes:
    if not isinstance(key, str):
        raise TypeError(f"table keys are strings, not {type(key).__name__} ({key!r})")
    raw = key.encode("utf-8", "surrogateescape")
    if len(raw) > 255:
        raise ValueError(f"table key {key[:40]!r}… is {len(raw)} bytes; the limit is 255")
    return _U8.pack(len(raw)) + raw


def _encode_table(table: Mapping[str, object], depth: int) -> bytes:
    parts: list[bytes] = []
    for key, item in table.items():  # in the table's own order, unlike pamqp (sorted)
        parts.append(_encode_key(key))
        try:
            _encode_value(item, parts, depth)
        except (TypeError, ValueError) as error:
            raise type(error)(f"{key}: {error}") from None
    payload = b"".join(parts)
    return _U32.pack(len(payload)) + payload


def encode_field_value(value: FieldValue) -> bytes:
    """Type byte + payload for ``value``: typed scalars keep their tag, plain values get pamqp's."""
    out: list[bytes] = []
    _encode_value(value, out, 0)
    return b"".join(out)


def encode_field_table(table: Mapping[str, FieldValue]) -> bytes:
    """A field table (4-byte length + entries), keys in the mapping's order."""
    return _encode_table(table, 0)


# ------------------------------------------------------------------------------------------------
# Basic properties
# ------------------------------------------------------------------------------------------------

_SHORTSTR, _OCTET, _TIMESTAMP, _TABLE = "shortstr", "octet", "timestamp", "table"


@dataclass(frozen=True, slots=True)
class _Property:
    name: str  # the AMQP name, used in records
    attr: str  # pamqp's attribute (``type`` is ``message_type`` there)
    flag: int
    kind: str


PROPERTIES: Final[tuple[_Property, ...]] = (
    _Property("content_type", "content_type", 0x8000, _SHORTSTR),
    _Property("content_encoding", "content_encoding", 0x4000, _SHORTSTR),
    _Property("headers", "headers", 0x2000, _TABLE),
    _Property("delivery_mode", "delivery_mode", 0x1000, _OCTET),
    _Property("priority", "priority", 0x0800, _OCTET),
    _Property("correlation_id", "correlation_id", 0x0400, _SHORTSTR),
    _Property("reply_to", "reply_to", 0x0200, _SHORTSTR),
    _Property("expiration", "expiration", 0x0100, _SHORTSTR),
    _Property("message_id", "message_id", 0x0080, _SHORTSTR),
    _Property("timestamp", "timestamp", 0x0040, _TIMESTAMP),
    _Property("type", "message_type", 0x0020, _SHORTSTR),
    _Property("user_id", "user_id", 0x0010, _SHORTSTR),
    _Property("app_id", "app_id", 0x0008, _SHORTSTR),
    _Property("cluster_id", "cluster_id", 0x0004, _SHORTSTR),
)
"""Every Basic property in wire order: record name, pamqp attribute, flag bit, AMQP type."""

PROPERTY_NAMES: Final = tuple(p.name for p in PROPERTIES)

_UNPINNED: Final = object()


class TypedProperties(spec.Basic.Properties):
    """``Basic.Properties`` that decode and encode with this module's exact codec.

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
            if prop.kind == _SHORTSTR:
                end = _span(data, pos + 1, data[pos], len(data), prop.name)
                value = data[pos + 1 : end].decode("utf-8", "surrogateescape")
            elif prop.kind == _OCTET:
                end = _span(data, pos, 1, len(data), prop.name)
                value = data[pos]
            elif prop.kind == _TIMESTAMP:
                end = _span(data, pos, 8, len(data), prop.name)
                value = int.__new__(Timestamp, _U64.unpack_from(data, pos)[0])
            else:
                value, end = _decode_table(data, pos, len(data), 0)
            setattr(self, prop.attr, value)
            pos = end
        self._pin_message_id()


def _encode_property(prop: _Property, value: object) -> bytes:
    if prop.kind == _SHORTSTR:
        if not isinstance(value, str):
            raise TypeError(f"expected a string, not {type(value).__name__}")
        raw = value.encode("utf-8", "surrogateescape")
        if len(raw) > 255:
            raise ValueError(f"{len(raw)} bytes; a short string holds at most 255")
        return _U8.pack(len(raw)) + raw
    if prop.kind == _OCTET:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255:
            raise ValueError(f"expected an octet (0..255), not {value!r}")
        return _U8.pack(value)
    if prop.kind == _TIMESTAMP:
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


# ------------------------------------------------------------------------------------------------
# The one hook into pamqp: typed content headers for connections opened in typed_decoding()
# ------------------------------------------------------------------------------------------------

_TYPED_DECODING: ContextVar[bool] = ContextVar("rmqkit_typed_amqp_decoding", default=False)
SUPPORTED_PAMQP_MAJORS: Final = (3, 4)
"""pamqp major versions ``install()`` accepts (checked with 4.0.1), given the structure checks."""

_EXPECTED_SLOTS: Final = [p.attr for p in PROPERTIES]


class _HeaderFrameHook:
    """Stands in for ``pamqp.frame._unmarshal_header_frame``; inert outside typed_decoding()."""

    def __init__(self, original: Callable[[bytes], ContentHeader]) -> None:
        self.original = original

    def __call__(self, frame_data: bytes) -> ContentHeader:
        if not _TYPED_DECODING.get():
            return self.original(frame_data)
        header = ContentHeader(properties=TypedProperties())
        try:
            header.unmarshal(frame_data)
        except (struct.error, ValueError, IndexError) as error:
            raise UnmarshalingException("ContentHeader", error) from error
        return header


def pamqp_problems() -> list[str]:
    """Why the installed pamqp does not fit the hook (empty when it does)."""
    problems: list[str] = []
    try:
        version = importlib.metadata.version("pamqp")
        major = int(version.split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        version, major = "unknown", -1
    if major not in SUPPORTED_PAMQP_MAJORS:
        problems.append(
            f"pamqp {version} is not a supported major version {SUPPORTED_PAMQP_MAJORS}"
        )
    current = getattr(pamqp.frame, "_unmarshal_header_frame", None)
    if not callable(current):
        problems.append("pamqp.frame._unmarshal_header_frame is missing")
    if "_unmarshal_header_frame" not in pamqp.frame.unmarshal.__code__.co_names:
        problems.append("pamqp.frame.unmarshal no longer calls _unmarshal_header_frame")
    if "unmarshal" not in ContentHeader.unmarshal.__code__.co_names:
        problems.append("ContentHeader.unmarshal no longer calls properties.unmarshal")
    if "marshal" not in ContentHeader.marshal.__code__.co_names:
        problems.append("ContentHeader.marshal no longer calls properties.marshal")
    if list(spec.Basic.Properties.__slots__) != _EXPECTED_SLOTS:
        problems.append("pamqp's Basic.Properties attributes changed")
    if any(spec.Basic.Properties.flags.get(p.attr) != p.flag for p in PROPERTIES):
        problems.append("pamqp's Basic.Properties flag bits changed")
    return problems


def is_installed() -> bool:
    """Whether ``install()`` has put the hook in place."""
    return isinstance(getattr(pamqp.frame, "_unmarshal_header_frame", None), _HeaderFrameHook)


def install() -> None:
    """Put the typed content-header hook into pamqp (idempotent; checks pamqp first).

    Until ``typed_decoding()`` is active in a connection's reader task, the hook calls pamqp's
    own function, so installing it changes nothing for other connections.
    """
    if is_installed():
        return
    problems = pamqp_problems()
    if problems:
        raise RmqkitError(
            "cannot decode AMQP headers with exact types: " + "; ".join(problems) + ". "
            "Install a pamqp version rmqkit supports (4.0.x is tested)."
        )
    # The patch itself, explicit: one module attribute, restored by uninstall().
    setattr(  # noqa: B010
        pamqp.frame,
        "_unmarshal_header_frame",
        _HeaderFrameHook(pamqp.frame._unmarshal_header_frame),
    )


def uninstall() -> None:
    """Restore pamqp's own function (for tests)."""
    current = getattr(pamqp.frame, "_unmarshal_header_frame", None)
    if isinstance(current, _HeaderFrameHook):
        setattr(pamqp.frame, "_unmarshal_header_frame", current.original)  # noqa: B010


@contextlib.contextmanager
def typed_decoding() -> Iterator[None]:
    """Inside this block, content headers decode to ``TypedProperties``; installs the hook.

    The decision is made by the task that reads the socket, which aiormq creates while
    ``aiormq.connect`` runs and which copies the context at that moment: open the connection
    inside the block, and the whole connection decodes typed, for its lifetime.
    """
    install()
    token = _TYPED_DECODING.set(True)
    try:
        yield
    finally:
        _TYPED_DECODING.reset(token)


async def connect_typed(url: str, **kwargs: Any) -> aiormq.abc.AbstractConnection:
    """``aiormq.connect(url)`` whose deliveries carry ``TypedProperties``."""
    with typed_decoding():
        return await aiormq.connect(url, **kwargs)


# ------------------------------------------------------------------------------------------------
# Tagged JSON values
# ------------------------------------------------------------------------------------------------

_SPECIAL_FLOATS: Final = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_TAG_TYPES: Final[dict[str, type[AmqpInt]]] = {cls.tag: cls for cls in _INT_TYPES}
_AMBIGUOUS = (int, float, Decimal, datetime, time.struct_time)


@dataclass
class _Export:
    strict: bool
    inferred: bool = False


def _float_json(value: float) -> float | str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return float(value)


def _b64(raw: bytes | bytearray) -> str:
    return base64.b64encode(raw).decode("ascii")


def value_to_json(value: object, *, strict: bool = True, path: str = "value") -> dict[str, Any]:
    """A header value as tagged JSON, e.g. ``Int16(5)`` → ``{"t": "s", "v": 5}``.

    ``strict`` refuses plain int/float/Decimal/datetime (their AMQP type is unknown: pamqp threw
    it away); without it they are recorded as the type pamqp would send them with.
    """
    return _to_json(value, path, _Export(strict), 0)


def _to_json(value: object, path: str, ctx: _Export, depth: int) -> dict[str, Any]:
    if depth > MAX_DEPTH:
        raise DataError(f"{path}: tables and arrays nested deeper than {MAX_DEPTH} levels")
    if value is None:
        return {"t": "V"}
    if value is True or value is False:
        return {"t": "t", "v": value}
    if isinstance(value, AmqpInt):
        return {"t": value.tag, "v": int(value)}
    if isinstance(value, Float32 | Float64):
        return {"t": value.tag, "v": _float_json(value)}
    if isinstance(value, AmqpDecimal):
        return {"t": "D", "v": Decimal.__str__(value)}
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise DataError(f"{path}: string is not valid Unicode (lone surrogate)") from None
        return {"t": "S", "v": value}
    if isinstance(value, bytes):
        try:
            return {"t": "S", "v": value.decode("utf-8")}
        except UnicodeDecodeError:
            return {"t": "S", "base64": _b64(value)}
    if isinstance(value, bytearray):
        return {"t": "x", "base64": _b64(value)}
    if isinstance(value, list):
        return {
            "t": "A",
            "v": [_to_json(item, f"{path}[{i}]", ctx, depth + 1) for i, item in enumerate(value)],
        }
    if isinstance(value, Mapping):
        return {"t": "F", "v": _table_to_json(value, path, ctx, depth + 1)}
    if isinstance(value, _AMBIGUOUS):
        if ctx.strict:
            raise DataError(
                f"{path}: plain {type(value).__name__} {value!r} has lost its AMQP type "
                "(pamqp decoded it); read messages through rmqkit.broker.codec.typed_decoding() "
                "to export them exactly"
            )
        ctx.inferred = True
        try:
            wire = pamqp.encode.encode_table_value(_any(value))
        except (TypeError, ValueError) as error:
            raise DataError(f"{path}: {error}") from None
        return _to_json(decode_field_value(wire), path, ctx, depth)
    raise DataError(f"{path}: no AMQP field type for {type(value).__name__} ({value!r})")


def _table_to_json(
    table: Mapping[Any, object], path: str, ctx: _Export, depth: int
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, item in table.items():
        if not isinstance(key, str):
            raise DataError(f"{path}: table key {key!r} is not a string")
        out[key] = _to_json(item, f"{path}.{key}", ctx, depth)
    return out


def _fail(path: str, problem: str) -> DataError:
    return DataError(f"{path}: {problem}")


def _keys(obj: Mapping[str, Any], allowed: set[str], path: str) -> None:
    extra = set(obj) - allowed
    if extra:
        raise _fail(path, f"unexpected field(s) {sorted(extra)} for type {obj.get('t')!r}")


def _from_b64(text: object, path: str) -> bytes:
    if not isinstance(text, str):
        raise _fail(path, "base64 must be a string")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as error:
        raise _fail(path, f"not valid base64 ({error})") from None


def _json_float(raw: object, path: str, tag: str) -> float:
    if isinstance(raw, str) and raw in _SPECIAL_FLOATS:
        return _SPECIAL_FLOATS[raw]
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise _fail(path, f"'{tag}' needs a number or one of {sorted(_SPECIAL_FLOATS)}")
    number = float(raw)
    if isinstance(raw, int) and number != raw:
        raise _fail(path, f"{raw} is not exactly a 64-bit float")
    return number


def value_from_json(obj: object, *, path: str = "value") -> FieldValue:
    """Tagged JSON back to a typed value; raises DataError naming ``path`` and the problem."""
    return _from_json(obj, path, 0)


def _from_json(obj: object, path: str, depth: int) -> FieldValue:
    if depth > MAX_DEPTH:
        raise _fail(path, f"tables and arrays nested deeper than {MAX_DEPTH} levels")
    if not isinstance(obj, dict) or not isinstance(obj.get("t"), str):
        raise _fail(path, 'expected a tagged value such as {"t": "s", "v": 5}')
    tag: str = obj["t"]
    if tag == "V":
        _keys(obj, {"t"}, path)
        return None
    if tag == "x" or (tag == "S" and "base64" in obj):
        _keys(obj, {"t", "base64"}, path)
        raw = _from_b64(obj["base64"], path)
        if tag == "x":
            return bytearray(raw)
        try:
            return raw.decode("utf-8")  # the form the decoder produces
        except UnicodeDecodeError:
            return raw
    _keys(obj, {"t", "v"}, path)
    if "v" not in obj:
        raise _fail(path, f'type {tag!r} needs a "v"')
    raw_value = obj["v"]
    if tag in _TAG_TYPES:
        if isinstance(raw_value, bool) or not isinstance(raw_value, int):
            raise _fail(path, f"'{tag}' needs an integer, not {raw_value!r}")
        try:
            return _TAG_TYPES[tag](raw_value)
        except ValueError as error:
            raise _fail(path, str(error)) from None
    if tag == "t":
        if not isinstance(raw_value, bool):
            raise _fail(path, f"'t' needs true or false, not {raw_value!r}")
        return raw_value
    if tag == "f":
        number = _json_float(raw_value, path, tag)
        try:
            single = Float32(number)
        except ValueError as error:
            raise _fail(path, str(error)) from None
        if single != number and not math.isnan(number):
            raise _fail(path, f"{number!r} is not exactly a 32-bit float (nearest: {single!r})")
        return single
    if tag == "d":
        return Float64(_json_float(raw_value, path, tag))
    if tag == "D":
        if not isinstance(raw_value, str):
            raise _fail(path, f"'D' needs a decimal string such as \"1.50\", not {raw_value!r}")
        try:
            return AmqpDecimal(raw_value)
        except ValueError as error:
            raise _fail(path, str(error)) from None
    if tag == "S":
        if not isinstance(raw_value, str):
            raise _fail(path, f"'S' needs a string (or \"base64\"), not {raw_value!r}")
        try:
            raw_value.encode("utf-8")
        except UnicodeEncodeError:
            raise _fail(path, "string is not valid Unicode (lone surrogate)") from None
        return raw_value
    if tag == "A":
        if not isinstance(raw_value, list):
            raise _fail(path, "'A' needs a list of tagged values")
        return [_from_json(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(raw_value)]
    if tag == "F":
        if not isinstance(raw_value, dict):
            raise _fail(path, "'F' needs an object of tagged values")
        return _table_from_json(raw_value, path, depth + 1)
    raise _fail(path, f"unknown type tag {tag!r}")


def _table_from_json(obj: Mapping[str, Any], path: str, depth: int) -> FieldTable:
    table: FieldTable = {}
    for key, item in obj.items():
        try:
            _encode_key(key)
        except (TypeError, ValueError) as error:
            raise _fail(path, str(error)) from None
        table[key] = _from_json(item, f"{path}.{key}", depth)
    return table


def headers_to_json(headers: Mapping[str, object] | None, *, strict: bool = True) -> dict[str, Any]:
    """A header table as ``{key: tagged value}`` (what a record's ``properties.headers`` holds)."""
    return _table_to_json(headers or {}, "headers", _Export(strict), 0)


def headers_from_json(obj: Mapping[str, Any]) -> FieldTable:
    """Inverse of ``headers_to_json``."""
    return _table_from_json(obj, "headers", 0)


# ------------------------------------------------------------------------------------------------
# Records
# ------------------------------------------------------------------------------------------------


def delivery_info(
    delivery: spec.Basic.Deliver | spec.Basic.GetOk, *, queue: str | None = None
) -> dict[str, Any]:
    """Where a delivered message came from, for a record's ``delivery`` field."""
    info: dict[str, Any] = {
        "exchange": delivery.exchange,
        "routing_key": delivery.routing_key,
        "redelivered": bool(delivery.redelivered),
    }
    if queue is not None:
        info["queue"] = queue
    return info


def _properties_to_json(properties: spec.Basic.Properties, ctx: _Export) -> dict[str, Any]:
    typed = isinstance(properties, TypedProperties)
    out: dict[str, Any] = {}
    for prop in PROPERTIES:
        if typed and prop.attr == "message_id":
            value: object = properties.wire_message_id()  # type: ignore[attr-defined]
        else:
            value = getattr(properties, prop.attr, None)
        path = f"properties.{prop.name}"
        if value is None or (value == "" and not typed):  # pamqp never sends ""
            continue
        if prop.kind == _SHORTSTR:
            if not isinstance(value, str):
                raise _fail(path, f"expected a string, not {type(value).__name__}")
            if len(value.encode("utf-8", "surrogateescape")) > 255:
                raise _fail(path, "longer than 255 bytes")
            out[prop.name] = value
        elif prop.kind == _OCTET:
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255:
                raise _fail(path, f"expected an octet (0..255), not {value!r}")
            out[prop.name] = int(value)
        elif prop.kind == _TIMESTAMP:
            if isinstance(value, AmqpInt):
                out[prop.name] = int(value)
            elif ctx.strict:
                raise _fail(
                    path,
                    f"plain {type(value).__name__} {value!r}: pamqp guessed seconds vs "
                    "milliseconds when it decoded it; read messages through "
                    "rmqkit.broker.codec.typed_decoding() to export them exactly",
                )
            else:
                ctx.inferred = True
                try:
                    out[prop.name] = _U64.unpack(pamqp.encode.timestamp(value))[0]  # type: ignore[arg-type]
                except (TypeError, ValueError, struct.error) as error:
                    raise _fail(path, str(error)) from None
        else:
            if not isinstance(value, Mapping):
                raise _fail(path, f"expected a table, not {type(value).__name__}")
            out[prop.name] = _table_to_json(value, path, ctx, 0)
    return out


def message_to_record(
    properties: spec.Basic.Properties,
    body: bytes,
    *,
    delivery_info: Mapping[str, Any],
    strict: bool = True,
) -> dict[str, Any]:
    """One message as an export record (a JSON-serialisable dict).

    ``properties`` should be ``TypedProperties`` (a delivery on a connection opened in
    ``typed_decoding()``). Plain pamqp properties raise DataError where a type was lost, unless
    ``strict=False``: then the record holds what pamqp would publish and says
    ``"types": "inferred"``. ``delivery_info`` is copied into the record as ``delivery`` (see
    ``delivery_info()``); import ignores it.
    """
    ctx = _Export(strict)
    record: dict[str, Any] = {
        "rmqkit_export": FORMAT_VERSION,
        "delivery": dict(delivery_info),
        "properties": _properties_to_json(properties, ctx),
    }
    raw = bytes(body)
    with contextlib.suppress(UnicodeDecodeError):
        record["body_text"] = raw.decode("utf-8")
    record["body"] = _b64(raw)
    if ctx.inferred:
        record["types"] = "inferred"
    return record


def _properties_from_json(obj: object) -> TypedProperties:
    if not isinstance(obj, dict):
        raise _fail("properties", "expected an object")
    unknown = set(obj) - set(PROPERTY_NAMES)
    if unknown:
        raise _fail(
            "properties", f"unknown propert(ies) {sorted(unknown)}; known: {list(PROPERTY_NAMES)}"
        )
    values: dict[str, Any] = {}
    for prop in PROPERTIES:
        if prop.name not in obj or obj[prop.name] is None:
            continue
        value = obj[prop.name]
        path = f"properties.{prop.name}"
        if prop.kind == _SHORTSTR:
            if not isinstance(value, str):
                raise _fail(path, f"expected a string, not {value!r}")
            try:
                size = len(value.encode("utf-8", "surrogateescape"))
            except UnicodeEncodeError:
                raise _fail(path, "string is not valid Unicode (lone surrogate)") from None
            if size > 255:
                raise _fail(path, f"{size} bytes; a short string holds at most 255")
            values[prop.attr] = value
        elif prop.kind == _OCTET:
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255:
                raise _fail(path, f"expected an integer 0..255, not {value!r}")
            values[prop.attr] = value
        elif prop.kind == _TIMESTAMP:
            if isinstance(value, bool) or not isinstance(value, int):
                raise _fail(path, f"expected integer seconds, not {value!r}")
            try:
                values[prop.attr] = Timestamp(value)
            except ValueError as error:
                raise _fail(path, str(error)) from None
        else:
            if not isinstance(value, dict):
                raise _fail(path, "expected an object of tagged values")
            values[prop.attr] = _table_from_json(value, path, 0)
    return TypedProperties(**values)


def record_to_message(record: Mapping[str, Any]) -> tuple[TypedProperties, bytes]:
    """An export record back to what ``basic_publish`` needs: ``(properties, body)``.

    Raises DataError naming the field and the problem. Fields other than ``rmqkit_export``,
    ``properties``, ``body`` and ``body_text`` (``delivery``, ``types``, anything a newer
    writer adds) are not used.
    """
    if not isinstance(record, Mapping):
        raise DataError("a record must be a JSON object")
    version = record.get("rmqkit_export")
    if version is None:
        raise DataError('not an rmqkit export record (no "rmqkit_export" field)')
    if isinstance(version, bool) or version != FORMAT_VERSION:
        raise DataError(
            f"export format version {version!r} is not supported (this rmqkit reads "
            f"{FORMAT_VERSION})"
        )
    if "properties" not in record:
        raise DataError('"properties" is missing (use {} for a message without any)')
    properties = _properties_from_json(record["properties"])
    text = record.get("body_text")
    if text is not None and not isinstance(text, str):
        raise _fail("body_text", "expected a string")
    if record.get("body") is not None:
        body = _from_b64(record["body"], "body")
        if text is not None and text.encode("utf-8", "surrogatepass") != body:
            raise _fail(
                "body_text",
                "does not match body; edit body (base64) or remove it and keep body_text",
            )
    elif text is not None:
        try:
            body = text.encode("utf-8")
        except UnicodeEncodeError:
            raise _fail("body_text", "string is not valid Unicode (lone surrogate)") from None
    else:
        raise DataError('the record has neither "body" (base64) nor "body_text"')
    return properties, body


def dumps_record(record: Mapping[str, Any]) -> str:
    """One NDJSON line for ``record``, without the trailing newline.

    UTF-8 text stays readable; if a string holds surrogate escapes (a key or short string that
    was not UTF-8) the whole line is written with ``\\uXXXX`` escapes instead, so it is always
    valid UTF-8.
    """
    try:
        line = json.dumps(record, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as error:
        raise DataError(f"record is not JSON-serialisable: {error}") from None
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        line = json.dumps(record, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    return line


def _no_constants(name: str) -> Any:
    raise ValueError(f'{name} is not JSON; write floats like "NaN" as strings in tagged values')


def loads_record(line: str, line_number: int, *, source: str | None = None) -> dict[str, Any]:
    """Parse and fully check one NDJSON line; DataError says ``[source:]line N: problem``."""
    where = f"{source}:{line_number}" if source else f"line {line_number}"
    if not line.strip():
        raise DataError(f"{where}: empty line (an export has one JSON object per line)")
    try:
        record = json.loads(line, parse_constant=_no_constants)
    except ValueError as error:
        raise DataError(f"{where}: not valid JSON ({error})") from None
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object, found {type(record).__name__}")
    try:
        record_to_message(record)
    except DataError as error:
        raise DataError(f"{where}: {error}") from None
    return record


__all__ = [
    "FORMAT_VERSION",
    "PROPERTIES",
    "PROPERTY_NAMES",
    "AmqpDecimal",
    "AmqpInt",
    "FieldTable",
    "FieldValue",
    "Float32",
    "Float64",
    "Int8",
    "Int16",
    "Int32",
    "Int64",
    "Int64L",
    "Timestamp",
    "TypedProperties",
    "UInt8",
    "UInt16",
    "UInt32",
    "connect_typed",
    "decode_field_table",
    "decode_field_value",
    "decode_properties",
    "delivery_info",
    "dumps_record",
    "encode_field_table",
    "encode_field_value",
    "headers_from_json",
    "headers_to_json",
    "install",
    "is_installed",
    "loads_record",
    "message_to_record",
    "pamqp_problems",
    "record_to_message",
    "typed_decoding",
    "uninstall",
    "value_from_json",
    "value_to_json",
]

"""Typed AMQP field values: scalars that remember their field type, and the value model.

pamqp, the codec under aiormq and aio-pika (4.0.1 checked), loses field types:

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

rmqkit therefore keeps the type of every value, across these modules:

* here, the **typed scalars** ``Int8`` ``UInt8`` ``Int16`` ``UInt16`` ``Int32`` ``UInt32``
  ``Int64`` ``Int64L`` ``Timestamp`` ``Float32`` ``Float64`` ``AmqpDecimal``. Each is a subclass of
  ``int``/``float``/``Decimal`` with a ``tag`` (the AMQP type letter), so code that reads headers as
  plain numbers keeps working. Types that are unambiguous stay plain Python: ``bool`` (``t``),
  ``str`` (``S``), ``bytes`` (``S`` that is not UTF-8), ``bytearray`` (``x``), ``None`` (``V``),
  ``list`` (``A``), ``dict`` (``F``);
* ``rmqkit.broker.codec.wire``: the field-table wire codec;
* ``rmqkit.broker.codec.properties``: ``TypedProperties``, Basic properties on that codec;
* ``rmqkit.broker.codec.hook``: the one hook into pamqp, for reading typed deliveries;
* ``rmqkit.parking.records``: the NDJSON export records (docs/export-format.md).
"""

from __future__ import annotations

import operator
import struct
import time
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import ClassVar, Final, Self, SupportsFloat, SupportsIndex, TypeAlias

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


INT_TYPES: Final[tuple[type[AmqpInt], ...]] = (
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


__all__ = [
    "INT_TYPES",
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
    "UInt8",
    "UInt16",
    "UInt32",
]

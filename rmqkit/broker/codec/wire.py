"""Exact AMQP field-table wire codec: bytes ⇄ the typed values of ``codec.fieldtypes``.

Decoding yields the typed scalars, never plain int/float/Decimal; a long string that is not UTF-8
stays ``bytes``, a table key that is not UTF-8 is held with surrogate escapes. Encoding writes each
typed scalar with its own tag, plain values as pamqp would, and table keys in the table's own
order (pamqp sorts them and cuts them to 128 bytes).

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

import struct
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any, Final, TypeAlias

import pamqp.encode

from rmqkit.broker.codec.fieldtypes import (
    INT_TYPES,
    AmqpDecimal,
    AmqpInt,
    FieldTable,
    FieldValue,
    Float32,
    Float64,
    _decimal_parts,
    _make_decimal,
)

MAX_DEPTH: Final = 100
"""Deepest nesting of tables/arrays the codec accepts (a guard against stack exhaustion)."""


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
    **{ord(cls.tag): _fixed_decoder(cls) for cls in (*INT_TYPES, Float32, Float64)},
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


def check_table_key(key: object) -> None:
    """Raise TypeError/ValueError unless ``key`` can be a field-table key (a string of at most
    255 UTF-8 bytes, surrogate escapes counted as the bytes they stand for)."""
    _encode_key(key)


def plain_field_value(value: object) -> FieldValue:
    """The typed value a plain int/float/Decimal/datetime becomes on the wire, as pamqp would
    send it (the smallest integer width, a 32-bit float, ...); TypeError/ValueError if none."""
    return decode_field_value(pamqp.encode.encode_table_value(_any(value)))


def plain_timestamp(value: object) -> int:
    """The 64-bit seconds pamqp would send for a plain ``timestamp`` property value
    (TypeError/ValueError if it cannot send it)."""
    try:
        return int(_U64.unpack(pamqp.encode.timestamp(_any(value)))[0])
    except struct.error as error:
        raise ValueError(str(error)) from None


def encode_field_value(value: FieldValue) -> bytes:
    """Type byte + payload for ``value``: typed scalars keep their tag, plain values get pamqp's."""
    out: list[bytes] = []
    _encode_value(value, out, 0)
    return b"".join(out)


def encode_field_table(table: Mapping[str, FieldValue]) -> bytes:
    """A field table (4-byte length + entries), keys in the mapping's order."""
    return _encode_table(table, 0)


__all__ = [
    "MAX_DEPTH",
    "check_table_key",
    "decode_field_table",
    "decode_field_value",
    "encode_field_table",
    "encode_field_value",
    "plain_field_value",
    "plain_timestamp",
]

"""Tagged JSON for AMQP field values: how an export record holds a header value, type and all.

``Int16(5)`` is ``{"t": "s", "v": 5}``, a table ``{"t": "F", "v": {...}}``, bytes that are not
UTF-8 ``{"t": "S", "base64": "..."}`` (docs/export-format.md lists every tag). ``value_to_json``
/ ``value_from_json`` convert one value, ``headers_to_json`` / ``headers_from_json`` a header
table; ``rmqkit.parking.records`` builds whole records from them. The typed values themselves
come from ``rmqkit.broker.codec``.
"""

from __future__ import annotations

import base64
import binascii
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, Final

from rmqkit.broker.codec import (
    INT_TYPES,
    MAX_DEPTH,
    AmqpDecimal,
    AmqpInt,
    FieldTable,
    FieldValue,
    Float32,
    Float64,
    check_table_key,
    plain_field_value,
)
from rmqkit.errors import DataError

_SPECIAL_FLOATS: Final = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_TAG_TYPES: Final[dict[str, type[AmqpInt]]] = {cls.tag: cls for cls in INT_TYPES}
_AMBIGUOUS = (int, float, Decimal, datetime, time.struct_time)


@dataclass
class ExportContext:
    """How one record is being written: ``strict`` refuses values whose type was lost;
    ``inferred`` is set when a non-strict export recorded one as pamqp would send it."""

    strict: bool
    inferred: bool = False


def _float_json(value: float) -> float | str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return float(value)


def b64(raw: bytes | bytearray) -> str:
    """``raw`` as base64 text."""
    return base64.b64encode(raw).decode("ascii")


def value_to_json(value: object, *, strict: bool = True, path: str = "value") -> dict[str, Any]:
    """A header value as tagged JSON, e.g. ``Int16(5)`` → ``{"t": "s", "v": 5}``.

    ``strict`` refuses plain int/float/Decimal/datetime (their AMQP type is unknown: pamqp threw
    it away); without it they are recorded as the type pamqp would send them with.
    """
    return _to_json(value, path, ExportContext(strict), 0)


def _to_json(value: object, path: str, ctx: ExportContext, depth: int) -> dict[str, Any]:
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
            return {"t": "S", "base64": b64(value)}
    if isinstance(value, bytearray):
        return {"t": "x", "base64": b64(value)}
    if isinstance(value, list):
        return {
            "t": "A",
            "v": [_to_json(item, f"{path}[{i}]", ctx, depth + 1) for i, item in enumerate(value)],
        }
    if isinstance(value, Mapping):
        return {"t": "F", "v": table_to_json(value, path, ctx, depth + 1)}
    if isinstance(value, _AMBIGUOUS):
        if ctx.strict:
            raise DataError(
                f"{path}: plain {type(value).__name__} {value!r} has lost its AMQP type "
                "(pamqp decoded it); read messages through "
                "a typed session (rmqkit.broker.session) to export them exactly"
            )
        ctx.inferred = True
        try:
            typed = plain_field_value(value)
        except (TypeError, ValueError) as error:
            raise DataError(f"{path}: {error}") from None
        return _to_json(typed, path, ctx, depth)
    raise DataError(f"{path}: no AMQP field type for {type(value).__name__} ({value!r})")


def table_to_json(
    table: Mapping[Any, object], path: str, ctx: ExportContext, depth: int
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, item in table.items():
        if not isinstance(key, str):
            raise DataError(f"{path}: table key {key!r} is not a string")
        out[key] = _to_json(item, f"{path}.{key}", ctx, depth)
    return out


def field_error(path: str, problem: str) -> DataError:
    """The DataError for a bad field at ``path`` (a record's dotted path)."""
    return DataError(f"{path}: {problem}")


def _keys(obj: Mapping[str, Any], allowed: set[str], path: str) -> None:
    extra = set(obj) - allowed
    if extra:
        raise field_error(path, f"unexpected field(s) {sorted(extra)} for type {obj.get('t')!r}")


def from_b64(text: object, path: str) -> bytes:
    """Base64 text back to bytes (DataError naming ``path`` if it is not valid base64)."""
    if not isinstance(text, str):
        raise field_error(path, "base64 must be a string")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as error:
        raise field_error(path, f"not valid base64 ({error})") from None


def _json_float(raw: object, path: str, tag: str) -> float:
    if isinstance(raw, str) and raw in _SPECIAL_FLOATS:
        return _SPECIAL_FLOATS[raw]
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise field_error(path, f"'{tag}' needs a number or one of {sorted(_SPECIAL_FLOATS)}")
    number = float(raw)
    if isinstance(raw, int) and number != raw:
        raise field_error(path, f"{raw} is not exactly a 64-bit float")
    return number


def value_from_json(obj: object, *, path: str = "value") -> FieldValue:
    """Tagged JSON back to a typed value; raises DataError naming ``path`` and the problem."""
    return _from_json(obj, path, 0)


def _from_json(obj: object, path: str, depth: int) -> FieldValue:
    if depth > MAX_DEPTH:
        raise field_error(path, f"tables and arrays nested deeper than {MAX_DEPTH} levels")
    if not isinstance(obj, dict) or not isinstance(obj.get("t"), str):
        raise field_error(path, 'expected a tagged value such as {"t": "s", "v": 5}')
    tag: str = obj["t"]
    if tag == "V":
        _keys(obj, {"t"}, path)
        return None
    if tag == "x" or (tag == "S" and "base64" in obj):
        _keys(obj, {"t", "base64"}, path)
        raw = from_b64(obj["base64"], path)
        if tag == "x":
            return bytearray(raw)
        try:
            return raw.decode("utf-8")  # the form the decoder produces
        except UnicodeDecodeError:
            return raw
    _keys(obj, {"t", "v"}, path)
    if "v" not in obj:
        raise field_error(path, f'type {tag!r} needs a "v"')
    raw_value = obj["v"]
    if tag in _TAG_TYPES:
        if isinstance(raw_value, bool) or not isinstance(raw_value, int):
            raise field_error(path, f"'{tag}' needs an integer, not {raw_value!r}")
        try:
            return _TAG_TYPES[tag](raw_value)
        except ValueError as error:
            raise field_error(path, str(error)) from None
    if tag == "t":
        if not isinstance(raw_value, bool):
            raise field_error(path, f"'t' needs true or false, not {raw_value!r}")
        return raw_value
    if tag == "f":
        number = _json_float(raw_value, path, tag)
        try:
            single = Float32(number)
        except ValueError as error:
            raise field_error(path, str(error)) from None
        if single != number and not math.isnan(number):
            raise field_error(
                path, f"{number!r} is not exactly a 32-bit float (nearest: {single!r})"
            )
        return single
    if tag == "d":
        return Float64(_json_float(raw_value, path, tag))
    if tag == "D":
        if not isinstance(raw_value, str):
            raise field_error(
                path, f"'D' needs a decimal string such as \"1.50\", not {raw_value!r}"
            )
        try:
            return AmqpDecimal(raw_value)
        except ValueError as error:
            raise field_error(path, str(error)) from None
    if tag == "S":
        if not isinstance(raw_value, str):
            raise field_error(path, f"'S' needs a string (or \"base64\"), not {raw_value!r}")
        try:
            raw_value.encode("utf-8")
        except UnicodeEncodeError:
            raise field_error(path, "string is not valid Unicode (lone surrogate)") from None
        return raw_value
    if tag == "A":
        if not isinstance(raw_value, list):
            raise field_error(path, "'A' needs a list of tagged values")
        return [_from_json(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(raw_value)]
    if tag == "F":
        if not isinstance(raw_value, dict):
            raise field_error(path, "'F' needs an object of tagged values")
        return table_from_json(raw_value, path, depth + 1)
    raise field_error(path, f"unknown type tag {tag!r}")


def table_from_json(obj: Mapping[str, Any], path: str, depth: int) -> FieldTable:
    table: FieldTable = {}
    for key, item in obj.items():
        try:
            check_table_key(key)
        except (TypeError, ValueError) as error:
            raise field_error(path, str(error)) from None
        table[key] = _from_json(item, f"{path}.{key}", depth)
    return table


def headers_to_json(headers: Mapping[str, object] | None, *, strict: bool = True) -> dict[str, Any]:
    """A header table as ``{key: tagged value}`` (what a record's ``properties.headers`` holds)."""
    return table_to_json(headers or {}, "headers", ExportContext(strict), 0)


def headers_from_json(obj: Mapping[str, Any]) -> FieldTable:
    """Inverse of ``headers_to_json``."""
    return table_from_json(obj, "headers", 0)


__all__ = [
    "ExportContext",
    "b64",
    "field_error",
    "from_b64",
    "headers_from_json",
    "headers_to_json",
    "table_from_json",
    "table_to_json",
    "value_from_json",
    "value_to_json",
]

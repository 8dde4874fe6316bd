"""The parking export format: one NDJSON record per message, every AMQP field type kept.

``rmqkit parking export`` writes one JSON record per message and ``import`` publishes the records
back; the two must round-trip exactly, header field types included (docs/export-format.md).
Header values are tagged JSON such as ``{"t": "s", "v": 5}`` (``value_to_json`` /
``value_from_json``); a message is ``message_to_record`` / ``record_to_message``, a line
``dumps_record`` / ``loads_record``; format version ``"rmqkit_export": 1``. Exact types need
``TypedProperties`` from a connection opened in ``rmqkit.broker.pamqp_hook.typed_decoding()``.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import math
import re
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, Final

import pamqp.encode
from pamqp import commands as spec

from rmqkit.broker.fieldtypes import (
    _INT_TYPES,
    AmqpDecimal,
    AmqpInt,
    FieldTable,
    FieldValue,
    Float32,
    Float64,
    Timestamp,
)
from rmqkit.broker.typed_properties import (
    _OCTET,
    _SHORTSTR,
    _TIMESTAMP,
    PROPERTIES,
    PROPERTY_NAMES,
    TypedProperties,
)
from rmqkit.broker.wire import _U64, MAX_DEPTH, _any, _encode_key, decode_field_value
from rmqkit.errors import DataError

FORMAT_VERSION: Final = 1
"""Value of ``"rmqkit_export"`` in every record this module writes and the only one it reads."""

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
                "(pamqp decoded it); read messages through "
                "rmqkit.broker.pamqp_hook.typed_decoding() to export them exactly"
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
                    "rmqkit.broker.pamqp_hook.typed_decoding() to export them exactly",
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
            if prop.name == "expiration":
                _check_expiration(value, path)
            values[prop.attr] = value
        elif prop.kind == _OCTET:
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255:
                raise _fail(path, f"expected an integer 0..255, not {value!r}")
            if prop.name == "delivery_mode" and value not in (1, 2):
                # RabbitMQ closes the channel: PRECONDITION_FAILED {delivery_mode_unknown,…}
                raise _fail(path, f"RabbitMQ accepts 1 (transient) or 2 (persistent), not {value}")
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


_EXPIRATION = re.compile(r"[+-]?[0-9]+")
MAX_EXPIRATION_MS: Final = 315_360_000_000  # ten years: RabbitMQ's largest (3.10.8, measured)


def _check_expiration(value: str, path: str) -> None:
    """What RabbitMQ accepts (else PRECONDITION_FAILED "invalid expiration", channel closed)."""
    if not _EXPIRATION.fullmatch(value):
        raise _fail(path, f"RabbitMQ wants milliseconds as a decimal integer, not {value!r}")
    if not 0 <= int(value) <= MAX_EXPIRATION_MS:
        raise _fail(path, f"{value} ms is outside what RabbitMQ accepts (0..{MAX_EXPIRATION_MS})")


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
    "delivery_info",
    "dumps_record",
    "headers_from_json",
    "headers_to_json",
    "loads_record",
    "message_to_record",
    "record_to_message",
    "value_from_json",
    "value_to_json",
]

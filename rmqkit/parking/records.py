"""The parking export format: one NDJSON record per message, every AMQP field type kept.

``rmqkit parking export`` writes one JSON record per message and ``import`` publishes the records
back; the two must round-trip exactly, header field types included (docs/export-format.md).
Header values are tagged JSON such as ``{"t": "s", "v": 5}`` (``value_to_json`` /
``value_from_json``); a message is ``message_to_record`` / ``record_to_message``, a line
``dumps_record`` / ``loads_record``; format version ``"rmqkit_export": 1``. Exact types need
``TypedProperties``, from a typed session (``rmqkit.broker.session.open_session(typed=True)``).
The tagged JSON of one header value is ``rmqkit.parking.values``.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping
from typing import Any, Final, Protocol

from rmqkit.broker.codec import (
    OCTET,
    PROPERTIES,
    PROPERTY_NAMES,
    SHORTSTR,
    TIMESTAMP,
    AmqpInt,
    Properties,
    Timestamp,
    TypedProperties,
    plain_timestamp,
)
from rmqkit.errors import DataError
from rmqkit.parking.values import (
    ExportContext,
    b64,
    field_error,
    from_b64,
    headers_from_json,
    headers_to_json,
    table_from_json,
    table_to_json,
    value_from_json,
    value_to_json,
)

FORMAT_VERSION: Final = 1
"""Value of ``"rmqkit_export"`` in every record this module writes and the only one it reads."""


class Routed(Protocol):
    """What ``delivery_info`` reads from a ``basic.deliver`` or ``basic.get-ok`` method."""

    @property
    def exchange(self) -> str: ...
    @property
    def routing_key(self) -> str | None: ...
    @property
    def redelivered(self) -> bool: ...


def delivery_info(delivery: Routed, *, queue: str | None = None) -> dict[str, Any]:
    """Where a delivered message came from, for a record's ``delivery`` field."""
    info: dict[str, Any] = {
        "exchange": delivery.exchange,
        "routing_key": delivery.routing_key,
        "redelivered": bool(delivery.redelivered),
    }
    if queue is not None:
        info["queue"] = queue
    return info


def _properties_to_json(properties: Properties, ctx: ExportContext) -> dict[str, Any]:
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
        if prop.kind == SHORTSTR:
            if not isinstance(value, str):
                raise field_error(path, f"expected a string, not {type(value).__name__}")
            if len(value.encode("utf-8", "surrogateescape")) > 255:
                raise field_error(path, "longer than 255 bytes")
            out[prop.name] = value
        elif prop.kind == OCTET:
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255:
                raise field_error(path, f"expected an octet (0..255), not {value!r}")
            out[prop.name] = int(value)
        elif prop.kind == TIMESTAMP:
            if isinstance(value, AmqpInt):
                out[prop.name] = int(value)
            elif ctx.strict:
                raise field_error(
                    path,
                    f"plain {type(value).__name__} {value!r}: pamqp guessed seconds vs "
                    "milliseconds when it decoded it; read messages through "
                    "a typed session (rmqkit.broker.session) to export them exactly",
                )
            else:
                ctx.inferred = True
                try:
                    out[prop.name] = plain_timestamp(value)
                except (TypeError, ValueError) as error:
                    raise field_error(path, str(error)) from None
        else:
            if not isinstance(value, Mapping):
                raise field_error(path, f"expected a table, not {type(value).__name__}")
            out[prop.name] = table_to_json(value, path, ctx, 0)
    return out


def message_to_record(
    properties: Properties,
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
    ctx = ExportContext(strict)
    record: dict[str, Any] = {
        "rmqkit_export": FORMAT_VERSION,
        "delivery": dict(delivery_info),
        "properties": _properties_to_json(properties, ctx),
    }
    raw = bytes(body)
    with contextlib.suppress(UnicodeDecodeError):
        record["body_text"] = raw.decode("utf-8")
    record["body"] = b64(raw)
    if ctx.inferred:
        record["types"] = "inferred"
    return record


def _properties_from_json(obj: object) -> TypedProperties:
    if not isinstance(obj, dict):
        raise field_error("properties", "expected an object")
    unknown = set(obj) - set(PROPERTY_NAMES)
    if unknown:
        raise field_error(
            "properties", f"unknown propert(ies) {sorted(unknown)}; known: {list(PROPERTY_NAMES)}"
        )
    values: dict[str, Any] = {}
    for prop in PROPERTIES:
        if prop.name not in obj or obj[prop.name] is None:
            continue
        value = obj[prop.name]
        path = f"properties.{prop.name}"
        if prop.kind == SHORTSTR:
            if not isinstance(value, str):
                raise field_error(path, f"expected a string, not {value!r}")
            try:
                size = len(value.encode("utf-8", "surrogateescape"))
            except UnicodeEncodeError:
                raise field_error(path, "string is not valid Unicode (lone surrogate)") from None
            if size > 255:
                raise field_error(path, f"{size} bytes; a short string holds at most 255")
            if prop.name == "expiration":
                _check_expiration(value, path)
            values[prop.attr] = value
        elif prop.kind == OCTET:
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255:
                raise field_error(path, f"expected an integer 0..255, not {value!r}")
            if prop.name == "delivery_mode" and value not in (1, 2):
                # RabbitMQ closes the channel: PRECONDITION_FAILED {delivery_mode_unknown,…}
                raise field_error(
                    path, f"RabbitMQ accepts 1 (transient) or 2 (persistent), not {value}"
                )
            values[prop.attr] = value
        elif prop.kind == TIMESTAMP:
            if isinstance(value, bool) or not isinstance(value, int):
                raise field_error(path, f"expected integer seconds, not {value!r}")
            try:
                values[prop.attr] = Timestamp(value)
            except ValueError as error:
                raise field_error(path, str(error)) from None
        else:
            if not isinstance(value, dict):
                raise field_error(path, "expected an object of tagged values")
            values[prop.attr] = table_from_json(value, path, 0)
    return TypedProperties(**values)


_EXPIRATION = re.compile(r"[+-]?[0-9]+")
MAX_EXPIRATION_MS: Final = 315_360_000_000  # ten years: RabbitMQ's largest (3.10.8, measured)


def _check_expiration(value: str, path: str) -> None:
    """What RabbitMQ accepts (else PRECONDITION_FAILED "invalid expiration", channel closed)."""
    if not _EXPIRATION.fullmatch(value):
        raise field_error(path, f"RabbitMQ wants milliseconds as a decimal integer, not {value!r}")
    if not 0 <= int(value) <= MAX_EXPIRATION_MS:
        raise field_error(
            path, f"{value} ms is outside what RabbitMQ accepts (0..{MAX_EXPIRATION_MS})"
        )


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
        raise field_error("body_text", "expected a string")
    if record.get("body") is not None:
        body = from_b64(record["body"], "body")
        if text is not None and text.encode("utf-8", "surrogatepass") != body:
            raise field_error(
                "body_text",
                "does not match body; edit body (base64) or remove it and keep body_text",
            )
    elif text is not None:
        try:
            body = text.encode("utf-8")
        except UnicodeEncodeError:
            raise field_error("body_text", "string is not valid Unicode (lone surrogate)") from None
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
    "Routed",
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

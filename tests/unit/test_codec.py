"""The export codec keeps every AMQP field type: JSON records, our wire codec, and the pamqp hook.

Identity is checked on the *tagged* form (``canon``): two values are the same when their tagged
JSON text is the same, so an ``Int16(5)`` never equals an ``Int32(5)``, ``-0.0`` never equals
``0.0`` and NaN equals NaN.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import math
import struct
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pamqp.decode
import pamqp.encode
import pamqp.frame
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands as spec
from pamqp.exceptions import UnmarshalingException
from pamqp.header import ContentHeader

from rmqkit.broker import codec
from rmqkit.broker.codec import (
    MAX_DEPTH,
    AmqpDecimal,
    AmqpInt,
    Float32,
    Float64,
    Int8,
    Int16,
    Int32,
    Int64,
    Int64L,
    Timestamp,
    TypedProperties,
    UInt8,
    UInt16,
    UInt32,
    decode_field_table,
    decode_field_value,
    decode_properties,
    encode_field_table,
    encode_field_value,
)
from rmqkit.errors import DataError, RmqkitError
from rmqkit.parking import records

INT_TYPES = (Int8, UInt8, Int16, UInt16, Int32, UInt32, Int64, Int64L, Timestamp)


# ------------------------------------------------------------------------------------------------
# Strategies: every AMQP field type, nested
# ------------------------------------------------------------------------------------------------


def _not_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def decimals() -> st.SearchStrategy[AmqpDecimal]:
    def build(scale: int, unscaled: int) -> AmqpDecimal:
        digits = tuple(int(c) for c in str(abs(unscaled)))
        return AmqpDecimal(Decimal((1 if unscaled < 0 else 0, digits, -scale)))

    return st.builds(build, st.integers(0, 255), st.integers(-(2**31), 2**31 - 1))


def scalars(*, finite_floats: bool = False, max_text: int = 40) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.booleans(),
        *[st.integers(cls.minimum, cls.maximum).map(cls) for cls in INT_TYPES],
        st.floats(width=32, allow_nan=not finite_floats, allow_infinity=not finite_floats).map(
            Float32
        ),
        st.floats(allow_nan=not finite_floats, allow_infinity=not finite_floats).map(Float64),
        decimals(),
        st.text(max_size=max_text),  # long string S, UTF-8
        st.binary(min_size=1, max_size=max_text).filter(_not_utf8),  # long string S, not UTF-8
        st.binary(max_size=max_text).map(bytearray),  # byte array x
        st.none(),  # void V
    )


def keys() -> st.SearchStrategy[str]:
    text = st.text(max_size=20).filter(lambda k: k not in ("CC", "BCC"))
    # RabbitMQ accepts keys that are not UTF-8; they travel as surrogate escapes.
    raw = st.binary(min_size=1, max_size=8).map(lambda b: b.decode("utf-8", "surrogateescape"))
    return st.one_of(text, raw)


def values(*, finite_floats: bool = False, max_leaves: int = 25) -> st.SearchStrategy[Any]:
    return st.recursive(
        scalars(finite_floats=finite_floats),
        lambda children: st.one_of(
            st.lists(children, max_size=4),  # array A
            st.dictionaries(keys(), children, max_size=4),  # table F
        ),
        max_leaves=max_leaves,
    )


def tables(**kwargs: Any) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(keys(), values(**kwargs), max_size=6)


def shortstr() -> st.SearchStrategy[str]:
    text = st.text(max_size=30)
    raw = st.binary(max_size=30).map(lambda b: b.decode("utf-8", "surrogateescape"))
    return st.one_of(text, raw)


@st.composite
def typed_properties(draw: st.DrawFn, /, **kwargs: Any) -> TypedProperties:
    def maybe(strategy: st.SearchStrategy[Any]) -> Any:
        return draw(st.one_of(st.none(), strategy))

    return TypedProperties(
        content_type=maybe(shortstr()),
        content_encoding=maybe(shortstr()),
        headers=maybe(tables(**kwargs)),
        delivery_mode=maybe(st.sampled_from([1, 2])),
        priority=maybe(st.integers(0, 255)),
        correlation_id=maybe(shortstr()),
        reply_to=maybe(shortstr()),
        expiration=maybe(st.integers(0, 10**9).map(str)),
        message_id=maybe(shortstr()),
        timestamp=maybe(st.integers(0, 2**64 - 1).map(Timestamp)),
        message_type=maybe(shortstr()),
        user_id=maybe(shortstr()),
        app_id=maybe(shortstr()),
        cluster_id=maybe(shortstr()),
    )


def canon(value: Any) -> str:
    """The tagged JSON text of a value: equal text ⇔ same types and same values."""
    return json.dumps(records.value_to_json(value), ensure_ascii=True)


def record_of(properties: spec.Basic.Properties, body: bytes = b"") -> dict[str, Any]:
    return records.message_to_record(properties, body, delivery_info={})


def has_nan(value: Any) -> bool:
    if isinstance(value, float):
        return math.isnan(value)
    if isinstance(value, list):
        return any(has_nan(v) for v in value)
    if isinstance(value, dict):
        return any(has_nan(v) for v in value.values())
    return False


def content_header_frame(properties: spec.Basic.Properties, body_size: int = 0) -> bytes:
    """What aiormq's basic_publish writes for the properties: pamqp's frame marshal."""
    return pamqp.frame.marshal(ContentHeader(properties=properties, body_size=body_size), 1)


def typed_unmarshal(frame: bytes) -> ContentHeader:
    with codec.typed_decoding():
        _, _, header = pamqp.frame.unmarshal(frame)
    assert isinstance(header, ContentHeader)
    return header


# ------------------------------------------------------------------------------------------------
# Why the module exists: pamqp alone loses types
# ------------------------------------------------------------------------------------------------


def test_pamqp_alone_does_not_round_trip_field_types() -> None:
    # A 16-bit 's' header holding 5, as a Java client would send it.
    wire = b"\x00\x00\x00\x05" + b"\x01k" + b"s\x00\x05"
    _, decoded = pamqp.decode.field_table(wire)
    assert decoded == {"k": 5} and type(decoded["k"]) is int
    assert pamqp.encode.field_table(decoded)[6:7] == b"b"  # ...goes back as 8-bit 'b'
    assert pamqp.encode.encode_table_value(0.1)[:1] == b"f"  # every float goes out 32-bit
    ms = pamqp.encode.encode_table_value(datetime.fromtimestamp(1_700_000_000.123, tz=UTC))
    _, back = pamqp.decode.timestamp(ms[1:])
    assert back.timestamp() == 1_700_000_000  # sub-second part gone
    _, guessed = pamqp.decode.timestamp(struct.pack(">Q", 1_700_000_000_123))
    assert int(guessed.timestamp()) == 1_700_000_000  # ms value divided by 1000 on decode
    with pytest.raises(TypeError):
        pamqp.encode.encode_table_value(b"\xff")  # what its decoder returns for non-UTF-8 'S'


def test_our_decoder_keeps_what_pamqp_loses() -> None:
    wire = b"\x00\x00\x00\x05" + b"\x01k" + b"s\x00\x05"
    decoded = decode_field_table(wire)
    assert type(decoded["k"]) is Int16 and decoded["k"] == 5
    assert encode_field_table(decoded) == wire


# ------------------------------------------------------------------------------------------------
# Properties of the value model (hypothesis)
# ------------------------------------------------------------------------------------------------


@given(values())
def test_value_survives_tagged_json(value: Any) -> None:
    text = json.dumps(records.value_to_json(value))
    back = records.value_from_json(json.loads(text))
    assert canon(back) == canon(value)


@given(values())
def test_value_survives_our_wire_codec_byte_for_byte(value: Any) -> None:
    wire = encode_field_value(value)
    back = decode_field_value(wire)
    assert canon(back) == canon(value)
    if not has_nan(value):  # NaN payload bits are not kept (and RabbitMQ refuses NaN anyway)
        assert encode_field_value(back) == wire


@given(tables(finite_floats=True))
def test_pamqp_decoder_reads_our_encoding_as_the_same_values(table: dict[str, Any]) -> None:
    """An independent oracle: our bytes are standard AMQP that pamqp's decoder understands."""

    def pamqp_view(value: Any) -> Any:
        if isinstance(value, Timestamp):
            return pamqp.decode.timestamp(struct.pack(">Q", value))[1]
        if isinstance(value, Float32 | Float64 | AmqpDecimal):
            return value  # compared by value below (floats exactly, decimals numerically)
        if isinstance(value, list):
            return [pamqp_view(v) for v in value]
        if isinstance(value, dict):
            return {k: pamqp_view(v) for k, v in value.items()}
        return value

    def safe(value: Any) -> bool:  # what pamqp's decoder can read at all
        if isinstance(value, Timestamp):
            return value < 253402300799000  # beyond: pamqp raises (year > 9999)
        if isinstance(value, list):
            return all(safe(v) for v in value)
        if isinstance(value, dict):
            return all(safe(v) and _is_utf8_key(k) for k, v in value.items())
        return True

    if not safe(table):
        return
    _, decoded = pamqp.decode.field_table(encode_field_table(table))
    assert decoded == pamqp_view(table)


def _is_utf8_key(key: str) -> bool:
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


plain_values = st.recursive(
    st.one_of(
        st.booleans(),
        st.integers(-(2**63), 2**63 - 1),
        st.text(max_size=20),
        st.binary(max_size=20).map(bytearray),
        st.none(),
        st.decimals(allow_nan=False, allow_infinity=False, places=3, min_value=-(10**6)).filter(
            lambda d: abs(d) < 10**6 and not (d.is_zero() and d.is_signed())
        ),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)


@given(st.dictionaries(st.text(max_size=10), plain_values, max_size=6))
def test_our_decoder_reads_pamqp_encoding_with_pamqps_type_choices(table: dict[str, Any]) -> None:
    """What other rmqkit code publishes through pamqp decodes to the same values and tags."""
    wire = pamqp.encode.field_table(table)
    decoded = decode_field_table(wire)
    assert decoded == table

    def tags_agree(plain: Any, typed: Any) -> None:
        if isinstance(plain, int) and not isinstance(plain, bool):
            assert typed.tag == pamqp.encode.table_integer(plain)[:1].decode()
        elif isinstance(plain, list):
            for a, b in zip(plain, typed, strict=True):
                tags_agree(a, b)
        elif isinstance(plain, dict):
            for k in plain:
                tags_agree(plain[k], typed[k])

    tags_agree(table, decoded)
    # The non-strict export of plain values records exactly those tags.
    assert records.headers_to_json(table, strict=False) == records.headers_to_json(decoded)
    # ...and our encoder re-creates pamqp's bytes from the typed values.
    assert encode_field_table(decoded) == wire


# ------------------------------------------------------------------------------------------------
# Records: message → record → NDJSON → record → publish frame → typed decode → same record
# ------------------------------------------------------------------------------------------------


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=150)
@given(typed_properties(), st.binary(max_size=64))
def test_record_round_trip_through_ndjson_and_pamqp_frames(
    properties: TypedProperties, body: bytes
) -> None:
    record = record_of(properties, body)
    line = records.dumps_record(record)
    assert "\n" not in line
    line.encode("utf-8")  # always valid UTF-8
    loaded = records.loads_record(line, 7)
    assert json.dumps(loaded) == json.dumps(record)

    published, published_body = records.record_to_message(loaded)
    assert published_body == body
    # The publish side: pamqp's frame marshal (as aiormq calls it) with our properties...
    frame = content_header_frame(published, len(published_body))
    # ...decoded by our typed hook gives the same record, type tags included.
    header = typed_unmarshal(frame)
    assert isinstance(header.properties, TypedProperties)
    assert header.body_size == len(body)
    again = record_of(header.properties, body)
    assert json.dumps(again) == json.dumps(record)
    # And the property bytes are a fixed point: decode then encode gives the same bytes.
    assert header.properties.marshal() == published.marshal()


@given(typed_properties())
def test_decode_properties_matches_the_hook(properties: TypedProperties) -> None:
    wire = properties.marshal()
    decoded = decode_properties(wire)
    assert json.dumps(record_of(decoded)) == json.dumps(record_of(properties))


# ------------------------------------------------------------------------------------------------
# Typed scalars
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", INT_TYPES)
def test_int_types_enforce_their_range(cls: type[AmqpInt]) -> None:
    assert cls(cls.minimum) == cls.minimum and cls(cls.maximum) == cls.maximum
    with pytest.raises(ValueError, match=cls.__name__):
        cls(cls.maximum + 1)
    with pytest.raises(ValueError):
        cls(cls.minimum - 1)
    with pytest.raises(TypeError):
        cls(1.5)  # type: ignore[arg-type]


def test_typed_scalars_read_like_plain_numbers() -> None:
    assert str(Int16(5)) == "5" and f"{UInt32(7)}" == "7" and f"{Int8(-3):03d}" == "-03"
    assert repr(Int16(5)) == "Int16(5)"
    assert str(Float64(0.5)) == "0.5" and str(AmqpDecimal("1.50")) == "1.50"
    assert json.dumps({"a": Int64(1), "b": Float64(0.5)}) == '{"a": 1, "b": 0.5}'
    assert Int16(5) + 1 == 6 and type(Int16(5) + 1) is int
    assert Float32(0.1) == struct.unpack(">f", struct.pack(">f", 0.1))[0]
    with pytest.raises(ValueError):
        Float32(1e300)


def test_timestamp_is_raw_seconds() -> None:
    assert Timestamp(1_700_000_000).to_datetime() == datetime.fromtimestamp(1_700_000_000, UTC)
    assert Timestamp(2**64 - 1).to_datetime() is None
    assert Timestamp.from_datetime(datetime(2024, 1, 1, 0, 0, 1)) == 1704067201


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("1E+2", "positive exponent"),
        ("-0.00", "negative zero"),
        ("1E-256", "at most 255"),
        ("4294967296", "32 bits"),
        ("NaN", "finite"),
        ("abc", "not a decimal"),
    ],
)
def test_decimal_limits(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        AmqpDecimal(text)


def test_decimal_keeps_its_exponent() -> None:
    value = AmqpDecimal("1.50")
    assert (value.scale, value.unscaled) == (2, 150)
    assert encode_field_value(value) == b"D\x02" + struct.pack(">i", 150)
    negative = decode_field_value(b"D\x02" + struct.pack(">i", -150))
    assert str(negative) == "-1.50"


# ------------------------------------------------------------------------------------------------
# TypedProperties: what reaches the wire
# ------------------------------------------------------------------------------------------------


def test_typed_properties_are_a_drop_in_for_plain_values() -> None:
    common: dict[str, Any] = {
        "content_type": "application/json",
        "headers": {"attempt": 3, "ok": True, "origin": "orders.work"},  # sorted, as pamqp writes
        "delivery_mode": 2,
        "message_id": "m-1",
        "timestamp": datetime(2024, 1, 1, tzinfo=UTC),
    }
    assert TypedProperties(**common).marshal() == spec.Basic.Properties(**common).marshal()


def test_empty_strings_and_cluster_id_reach_the_wire() -> None:
    props = TypedProperties(content_type="", message_id="", cluster_id="c")
    decoded = decode_properties(props.marshal())
    assert (decoded.content_type, decoded.message_id, decoded.cluster_id) == ("", "", "c")
    assert spec.Basic.Properties(content_type="").marshal() == b"\x00\x00"  # pamqp drops ""


def test_message_id_written_by_aiormq_after_building_does_not_reach_the_wire() -> None:
    props = TypedProperties(headers={"a": Int16(1)})
    props.message_id = "0123456789abcdef0123456789abcdef"  # what basic_publish does
    assert decode_properties(props.marshal()).message_id is None
    kept = TypedProperties(message_id="mine")
    kept.message_id = "changed"
    assert decode_properties(kept.marshal()).message_id == "changed"


def test_header_order_is_kept_not_sorted() -> None:
    table = {"zz": Int8(1), "aa": Int8(2)}
    assert list(decode_field_table(encode_field_table(table))) == ["zz", "aa"]


def test_long_keys_up_to_255_bytes_and_not_further() -> None:
    key = "k" * 255
    assert list(decode_field_table(encode_field_table({key: None}))) == [key]
    with pytest.raises(ValueError, match="255"):
        encode_field_table({key + "k": None})


@pytest.mark.parametrize(
    ("wire", "problem"),
    [
        (b"\x00\x00\x00\x02\x01k", "missing its type byte"),
        (b"\x00\x00\x00\x03\x01kZ", "unknown field type 'Z'"),
        (b"\x00\x00\x00\x04\x01ks\x00", "runs past"),
        (b"\x00\x00\x00\x09\x01k", "runs past"),
        (b"\x00\x00\x00\x02\x05k", "runs past"),
    ],
)
def test_malformed_tables_raise_value_error(wire: bytes, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        decode_field_table(wire)


def test_nesting_is_bounded() -> None:
    deep: Any = None
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(ValueError, match="nested deeper"):
        encode_field_value(deep)


# ------------------------------------------------------------------------------------------------
# The pamqp hook
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def hook_state() -> Any:
    was = codec.is_installed()
    yield
    if was:
        codec.install()
    else:
        codec.uninstall()


def test_install_is_idempotent_and_uninstall_restores(hook_state: None) -> None:
    codec.uninstall()
    original = pamqp.frame._unmarshal_header_frame
    codec.install()
    hook = pamqp.frame._unmarshal_header_frame
    codec.install()
    assert pamqp.frame._unmarshal_header_frame is hook is not original
    codec.uninstall()
    assert pamqp.frame._unmarshal_header_frame is original


def test_installed_pamqp_passes_the_checks() -> None:
    assert codec.pamqp_problems() == []


def test_install_refuses_an_unknown_pamqp(
    hook_state: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    codec.uninstall()
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "5.0.0")
    with pytest.raises(RmqkitError, match=r"pamqp 5\.0\.0 is not a supported"):
        codec.install()
    assert not codec.is_installed()


def test_install_refuses_a_pamqp_whose_structure_changed(
    hook_state: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    codec.uninstall()
    monkeypatch.setattr(spec.Basic.Properties, "flags", {"content_type": 1})
    with pytest.raises(RmqkitError, match="flag bits changed"):
        codec.install()


def test_hook_is_inert_outside_typed_decoding(hook_state: None) -> None:
    codec.install()
    frame = content_header_frame(TypedProperties(headers={"k": Int16(5)}))
    _, _, header = pamqp.frame.unmarshal(frame)
    assert isinstance(header, ContentHeader)
    assert type(header.properties) is spec.Basic.Properties
    assert header.properties.headers is not None and type(header.properties.headers["k"]) is int
    headers = typed_unmarshal(frame).properties.headers
    assert headers is not None and type(headers["k"]) is Int16


def test_typed_decoding_follows_the_task_that_reads(hook_state: None) -> None:
    """aiormq's reader task is created inside ``aiormq.connect``: it keeps the context it got."""
    frame = content_header_frame(TypedProperties(headers={"k": Int16(5)}))

    async def reader(started: asyncio.Event, go: asyncio.Event) -> type:
        started.set()
        await go.wait()
        _, _, header = pamqp.frame.unmarshal(frame)
        return type(header.properties)  # type: ignore[union-attr]

    async def main() -> tuple[type, type]:
        go = asyncio.Event()
        with codec.typed_decoding():
            typed_task = asyncio.create_task(reader(asyncio.Event(), go))
        plain_task = asyncio.create_task(reader(asyncio.Event(), go))
        await asyncio.sleep(0)
        go.set()  # both decode only now, after the with-block has ended
        return await typed_task, await plain_task

    assert asyncio.run(main()) == (TypedProperties, spec.Basic.Properties)


def test_hook_reports_bad_frames_as_pamqp_does() -> None:
    frame = bytearray(content_header_frame(TypedProperties(headers={"k": Int16(5)})))
    frame[7 + 12 + 2 + 4 + 2] = ord("Z")  # the type byte of "k"
    with pytest.raises(UnmarshalingException, match="unknown field type"):
        typed_unmarshal(bytes(frame))


def test_typed_decoding_reads_what_pamqp_cannot() -> None:
    table = {"\udcff": Timestamp(2**64 - 1)}
    frame = content_header_frame(TypedProperties(headers=table, message_id="\udcfe"))
    with pytest.raises(UnmarshalingException):
        pamqp.frame.unmarshal(frame)
    header = typed_unmarshal(frame)
    assert header.properties.headers == table
    assert header.properties.message_id == "\udcfe"


# ------------------------------------------------------------------------------------------------
# Records: strictness, errors, NDJSON
# ------------------------------------------------------------------------------------------------


def test_record_layout() -> None:
    props = TypedProperties(headers={"n": Int16(5)}, message_id="m", timestamp=Timestamp(7))
    record = records.message_to_record(props, b"hi", delivery_info={"exchange": "", "queue": "q"})
    assert record == {
        "rmqkit_export": 1,
        "delivery": {"exchange": "", "queue": "q"},
        "properties": {"headers": {"n": {"t": "s", "v": 5}}, "message_id": "m", "timestamp": 7},
        "body_text": "hi",
        "body": "aGk=",
    }
    binary = records.message_to_record(props, b"\xff", delivery_info={})
    assert "body_text" not in binary and binary["body"] == "/w=="


def test_strict_export_refuses_types_pamqp_lost() -> None:
    plain = spec.Basic.Properties(headers={"n": 5}, message_id="m")
    with pytest.raises(DataError, match=r"properties\.headers\.n: plain int 5 has lost its AMQP"):
        records.message_to_record(plain, b"", delivery_info={})
    stamped = spec.Basic.Properties(timestamp=datetime(2024, 1, 1, tzinfo=UTC))
    with pytest.raises(DataError, match=r"properties\.timestamp"):
        records.message_to_record(stamped, b"", delivery_info={})


def test_lenient_export_records_pamqps_choice_and_says_so() -> None:
    plain = spec.Basic.Properties(
        headers={"n": 5, "big": 70000, "f": 0.5}, timestamp=datetime(2024, 1, 1, tzinfo=UTC)
    )
    record = records.message_to_record(plain, b"", delivery_info={}, strict=False)
    assert record["types"] == "inferred"
    assert record["properties"]["headers"] == {
        "n": {"t": "b", "v": 5},
        "big": {"t": "I", "v": 70000},
        "f": {"t": "f", "v": 0.5},
    }
    assert record["properties"]["timestamp"] == 1704067200
    assert "cluster_id" not in record["properties"]  # pamqp's "" default is not sent


def test_body_text_alone_is_enough_and_must_agree_with_body() -> None:
    _, body = records.record_to_message({"rmqkit_export": 1, "properties": {}, "body_text": "é"})
    assert body == "é".encode()
    with pytest.raises(DataError, match="body_text: does not match body"):
        records.record_to_message(
            {"rmqkit_export": 1, "properties": {}, "body": "YQ==", "body_text": "b"}
        )


def line_of(**changes: Any) -> str:
    record: dict[str, Any] = {
        "rmqkit_export": 1,
        "properties": {"headers": {"n": {"t": "s", "v": 5}}},
        "body": "",
    }
    record.update(changes)
    return json.dumps(record)


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("{", "not valid JSON"),
        ("", "empty line"),
        ("[1]", "expected a JSON object"),
        ('{"properties": {}, "body": ""}', 'no "rmqkit_export"'),
        (line_of(rmqkit_export=2), "format version 2 is not supported"),
        (line_of(rmqkit_export=True), "format version True"),
        (line_of(properties=None), "properties: expected an object"),
        (line_of(body="***"), "body: not valid base64"),
        (line_of(properties={"colour": "red"}), r"unknown propert\(ies\) \['colour'\]"),
        (line_of(properties={"priority": 256}), "properties.priority: expected an integer 0..255"),
        (line_of(properties={"timestamp": -1}), "properties.timestamp: Timestamp"),
        (line_of(properties={"message_id": "x" * 256}), "at most 255"),
        (
            line_of(properties={"headers": {"n": {"t": "s", "v": 70000}}}),
            r"properties\.headers\.n: Int16 \(AMQP 's'\) holds -32768..32767, not 70000",
        ),
        (
            line_of(properties={"headers": {"a": {"t": "A", "v": [{"t": "b", "v": 1.0}]}}}),
            r"properties\.headers\.a\[0\]: 'b' needs an integer",
        ),
        (
            line_of(properties={"headers": {"f": {"t": "f", "v": 0.1}}}),
            "not exactly a 32-bit float",
        ),
        (line_of(properties={"headers": {"q": {"t": "Q", "v": 1}}}), "unknown type tag 'Q'"),
        (line_of(properties={"headers": {"q": 5}}), "expected a tagged value"),
        (line_of(properties={"headers": {"q": {"t": "s", "v": 1, "w": 2}}}), "unexpected field"),
        (line_of(properties={"headers": {"d": {"t": "D", "v": "1E+3"}}}), "positive exponent"),
        (line_of(properties={"headers": {"x": {"t": "x", "base64": "%"}}}), "not valid base64"),
        ('{"rmqkit_export": 1, "properties": {}, "body": "", "n": NaN}', "NaN is not JSON"),
    ],
)
def test_loads_record_names_the_line_and_the_problem(line: str, problem: str) -> None:
    with pytest.raises(DataError, match=problem) as caught:
        records.loads_record(line, 12, source="parked.ndjson")
    assert str(caught.value).startswith("parked.ndjson:12: ")
    assert caught.value.exit_code == 65


def test_loads_record_without_source_says_line() -> None:
    with pytest.raises(DataError, match=r"^line 3: not valid JSON"):
        records.loads_record("nope", 3)


def test_dumps_record_escapes_only_when_it_must() -> None:
    readable = records.dumps_record(record_of(TypedProperties(message_id="é")))
    assert '"message_id":"é"' in readable
    escaped = records.dumps_record(record_of(TypedProperties(message_id="é\udcff")))
    assert '"message_id":"\\u00e9\\udcff"' in escaped
    assert records.loads_record(escaped, 1)["properties"]["message_id"] == "é\udcff"
    with pytest.raises(DataError, match="not JSON-serialisable"):
        records.dumps_record({"x": object()})


def test_special_floats_are_strings_in_json() -> None:
    for value, text in [(math.inf, "Infinity"), (-math.inf, "-Infinity"), (math.nan, "NaN")]:
        tagged = records.value_to_json(Float64(value))
        assert tagged == {"t": "d", "v": text}
        assert canon(records.value_from_json(tagged)) == canon(Float64(value))
    assert json.dumps(records.value_to_json(Float64(-0.0))) == '{"t": "d", "v": -0.0}'

"""The exact AMQP codec: header values and Basic properties with their wire types kept.

pamqp (the codec under aiormq and aio-pika) narrows integers, writes every float as 32-bit,
misreads timestamps past 2**32 and fails the whole connection on some values RabbitMQ accepts
(``fieldtypes`` lists it all). rmqkit needs the exact types to export, import, replay and copy
messages without changing them, so it has its own codec, in five modules:

* ``fieldtypes``: the typed scalars (``Int8`` … ``Timestamp``, ``Float32``, ``Float64``,
  ``AmqpDecimal``) and the value model (``FieldValue``, ``FieldTable``);
* ``wire``: the field-table wire format (encode / decode, table keys in their own order);
* ``properties``: ``TypedProperties`` (Basic properties on that codec), the property table
  ``PROPERTIES`` and ``copy_properties`` for retry, park and replay copies;
* ``hook``: the one hook into pamqp's content-header decoder, active for connections opened in
  ``typed_decoding()`` (``rmqkit.broker.session.open_session(typed=True)`` does that);
* ``limits``: what the wire can carry (``wire_problem``, ``headers_problem``), checked before a
  message is written or sent.

Code outside this package imports only the names below; the pamqp internals the hook touches
are in ``rmqkit.broker.internals``.
"""

from __future__ import annotations

from rmqkit.broker.codec.fieldtypes import (
    INT_TYPES,
    AmqpDecimal,
    AmqpInt,
    FieldTable,
    FieldValue,
    Float32,
    Float64,
    Int8,
    Int16,
    Int32,
    Int64,
    Int64L,
    Timestamp,
    UInt8,
    UInt16,
    UInt32,
)
from rmqkit.broker.codec.hook import (
    SUPPORTED_PAMQP_MAJORS,
    connect_typed,
    install,
    is_installed,
    pamqp_problems,
    typed_decoding,
    uninstall,
)
from rmqkit.broker.codec.limits import (
    FIELD_NAME_MAX,
    SHORTSTR_MAX,
    headers_problem,
    wire_problem,
)
from rmqkit.broker.codec.properties import (
    OCTET,
    PROPERTIES,
    PROPERTY_NAMES,
    SHORTSTR,
    TABLE,
    TIMESTAMP,
    Properties,
    Property,
    TypedProperties,
    copy_properties,
    decode_properties,
)
from rmqkit.broker.codec.wire import (
    MAX_DEPTH,
    check_table_key,
    decode_field_table,
    decode_field_value,
    encode_field_table,
    encode_field_value,
    plain_field_value,
    plain_timestamp,
)

__all__ = [
    "FIELD_NAME_MAX",
    "INT_TYPES",
    "MAX_DEPTH",
    "OCTET",
    "PROPERTIES",
    "PROPERTY_NAMES",
    "SHORTSTR",
    "SHORTSTR_MAX",
    "SUPPORTED_PAMQP_MAJORS",
    "TABLE",
    "TIMESTAMP",
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
    "Properties",
    "Property",
    "Timestamp",
    "TypedProperties",
    "UInt8",
    "UInt16",
    "UInt32",
    "check_table_key",
    "connect_typed",
    "copy_properties",
    "decode_field_table",
    "decode_field_value",
    "decode_properties",
    "encode_field_table",
    "encode_field_value",
    "headers_problem",
    "install",
    "is_installed",
    "pamqp_problems",
    "plain_field_value",
    "plain_timestamp",
    "typed_decoding",
    "uninstall",
    "wire_problem",
]

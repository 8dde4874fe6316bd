"""Old home of ``rmqkit.broker.codec.fieldtypes``: import from ``rmqkit.broker.codec`` instead.

Kept only while tests and modules owned by other changes still import this path (issue 11);
it re-exports public names only. Delete it once nothing imports ``rmqkit.broker.fieldtypes``.
"""

from __future__ import annotations

from rmqkit.broker.codec import (
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

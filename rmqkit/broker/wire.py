"""Old home of ``rmqkit.broker.codec.wire``: import from ``rmqkit.broker.codec`` instead.

Kept only while tests and modules owned by other changes still import this path (issue 11);
it re-exports public names only. Delete it once nothing imports ``rmqkit.broker.wire``.
"""

from __future__ import annotations

from rmqkit.broker.codec import (
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
    "MAX_DEPTH",
    "check_table_key",
    "decode_field_table",
    "decode_field_value",
    "encode_field_table",
    "encode_field_value",
    "plain_field_value",
    "plain_timestamp",
]

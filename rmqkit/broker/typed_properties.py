"""Old home of ``rmqkit.broker.codec.properties``: import from ``rmqkit.broker.codec`` instead.

Kept only while tests and modules owned by other changes still import this path (issue 11);
it re-exports public names only. Delete it once nothing imports ``rmqkit.broker.typed_properties``.
"""

from __future__ import annotations

from rmqkit.broker.codec import (
    PROPERTIES,
    PROPERTY_NAMES,
    TypedProperties,
    copy_properties,
    decode_properties,
)

__all__ = [
    "PROPERTIES",
    "PROPERTY_NAMES",
    "TypedProperties",
    "copy_properties",
    "decode_properties",
]

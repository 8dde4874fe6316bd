"""Derived message_ids of `rmqkit publish`: the same input gives the same ids, anything else not."""

from __future__ import annotations

import pytest

from rmqkit.errors import DataError
from rmqkit.publish import IdSource, derived_message_id, messages_from_lines, messages_from_ndjson


def test_derived_ids_are_stable_and_depend_on_every_part() -> None:
    base = derived_message_id("orders", "created", 3, b"{}")
    assert base == derived_message_id("orders", "created", 3, b"{}")
    assert len(base) == 32 and int(base, 16) >= 0
    assert base[12] == "5"  # a version-5 (name-based, SHA-1) UUID
    others = {
        derived_message_id("orders2", "created", 3, b"{}"),
        derived_message_id("orders", "created2", 3, b"{}"),
        derived_message_id("orders", "created", 4, b"{}"),
        derived_message_id("orders", "created", 3, b"{ }"),
        # the parts are length-prefixed: moving text between them changes the id
        derived_message_id("orderscreated", "", 3, b"{}"),
    }
    assert base not in others and len(others) == 5


def test_positions_are_line_numbers_and_ndjson_keys_count() -> None:
    ids = IdSource("ex", "key")
    lines = [b"a\n", b"\n", b"a\n"]
    got = list(messages_from_lines(lines, ids=ids))
    assert [m.message_id for m in got] == [
        derived_message_id("ex", "key", 1, b"a"),
        derived_message_id("ex", "key", 3, b"a"),
    ]
    records = [b'{"body": "a", "routing_key": "other"}\n']
    (message,) = messages_from_ndjson(records, ids=ids)
    assert message.message_id == derived_message_id("ex", "other", 1, b"a")


def test_id_from_field_errors_name_the_line() -> None:
    ids = IdSource(field="order.id")
    (message,) = messages_from_lines([b'{"order": {"id": 7}}'], ids=ids)
    assert message.message_id == "7"
    for bad in (b'{"order": {}}', b"[1]", b"nope", b'{"order": {"id": true}}'):
        with pytest.raises(DataError, match=r"<stdin>:1: --id-from order\.id"):
            list(messages_from_lines([bad], ids=ids))

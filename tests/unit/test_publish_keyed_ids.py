"""`rmqkit publish` ids of bodies with sensitive fields: keyed (HMAC under the index key),
stable for the same input, not the unkeyed id, different under another ring."""

from __future__ import annotations

from rmqkit.crypto import generate_keyring
from rmqkit.publish import derived_message_id


def test_a_keyed_id_is_stable_and_not_the_unkeyed_one() -> None:
    ring = generate_keyring()
    body = b'{"tax_id": "123456"}'
    keyed = derived_message_id("ex", "rk", 1, body, keyed=ring.index_digest)
    assert keyed == derived_message_id("ex", "rk", 1, body, keyed=ring.index_digest)
    assert keyed != derived_message_id("ex", "rk", 1, body)
    assert keyed != derived_message_id("ex", "rk", 2, body, keyed=ring.index_digest)
    assert keyed != derived_message_id("ex", "rk", 1, body, keyed=generate_keyring().index_digest)
    assert len(keyed) == 32 and keyed[12] == "8" and keyed[16] in "89ab"  # UUID v8, RFC variant
    plain = derived_message_id("ex", "rk", 1, body)
    assert plain[12] == "5"  # unkeyed ids are unchanged (version 5)

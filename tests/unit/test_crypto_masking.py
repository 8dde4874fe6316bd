"""Decrypted values are masked in error text (rmqkit.crypto.masking, issue 16)."""

from __future__ import annotations

import json

from rmqkit.crypto import decrypt_fields, encrypt_fields, generate_keyring
from rmqkit.crypto.masking import MASK, mask_values, opened_values

RING = generate_keyring()


def test_every_decrypted_value_is_found_and_masked_but_nothing_else() -> None:
    body = {
        "order": 7,
        "customer": {"name": "Ada Lovelace", "tags": ["vip", "early"]},
        "tax_id": 123456789,
        "note": "public",
    }
    raw = json.dumps(body).encode()
    sealed = encrypt_fields(raw, ["customer", "tax_id"], ["tax_id"], RING)
    opened = decrypt_fields(sealed, None, RING)
    values = opened_values(sealed, opened)
    assert {"Ada Lovelace", "123456789", "vip", "early"} <= set(values)
    assert "public" not in values and "7" not in values
    text = "bad customer 'Ada Lovelace' with tax id 123456789 (tags ['vip', 'early']) public"
    masked = mask_values(text, values)
    for secret in ("Ada", "123456789", "vip", "early"):
        assert secret not in masked
    assert masked.count(MASK) >= 3 and masked.endswith("public")


def test_nothing_decrypted_nothing_masked() -> None:
    raw = b'{"a": "Ada Lovelace"}'
    assert opened_values(raw, decrypt_fields(raw, None, RING)) == ()
    assert mask_values("Ada Lovelace", ()) == "Ada Lovelace"


def test_what_orjson_refuses_still_round_trips_through_the_json_module() -> None:
    """The fast JSON path (orjson) falls back to the json module for NaN, Infinity and integers
    beyond 64 bits, so such bodies read and write as they did before."""
    raw = b'{"big": 123456789012345678901234567890, "nan": NaN, "tax_id": 1e400, "x": "y"}'
    sealed = encrypt_fields(raw, ["tax_id", "big"], [], RING)
    opened = json.loads(decrypt_fields(sealed, None, RING))
    assert opened["big"] == 123456789012345678901234567890 and opened["tax_id"] == float("inf")
    assert opened["nan"] != opened["nan"] and opened["x"] == "y"
    value = {"inf": float("-inf"), "n": 2**70}
    sealed2 = encrypt_fields(json.dumps({"v": value}).encode(), ["v"], [], RING)
    assert json.loads(decrypt_fields(sealed2, None, RING))["v"] == value


def test_the_expected_fields_fast_path_still_opens_every_envelope() -> None:
    """``first`` (the queue's encrypted fields) is a fast path, never a filter: an envelope
    elsewhere in the body, or the marker's text in a plain value, sends it through the walk."""
    body = {"customer": {"name": "Ada"}, "tax_id": 7, "extra": {"secret": "s3"}, "n": 1}
    sealed = encrypt_fields(json.dumps(body).encode(), ["customer.name", "tax_id"], [], RING)
    first = ["customer.name", "tax_id"]
    assert json.loads(decrypt_fields(sealed, None, RING, first=first)) == body
    more = encrypt_fields(sealed, ["extra.secret"], [], RING)  # an envelope not in `first`
    assert json.loads(decrypt_fields(more, None, RING, first=first)) == body
    marked = json.loads(sealed)
    marked["note"] = "mentions $rmqkit_enc in passing"
    opened = json.loads(decrypt_fields(json.dumps(marked).encode(), None, RING, first=first))
    assert opened == {**body, "note": "mentions $rmqkit_enc in passing"}
    plain = json.dumps(body).encode()
    assert decrypt_fields(plain, None, RING, first=first) is plain


def test_the_fast_path_with_odd_shapes_opens_each_envelope_once() -> None:
    """Expected paths under a list, a string or nothing; listed twice; a decrypted value that is
    itself an object with the marker key (user data): each envelope is opened exactly once."""
    first = ["customer.name", "tax_id", "tax_id", "missing.deep"]
    odd = {"$rmqkit_enc": "user data, not an envelope"}
    body = {"customer": {"name": odd}, "tax_id": "12345", "missing": "text"}
    sealed = encrypt_fields(json.dumps(body).encode(), ["customer.name", "tax_id"], [], RING)
    assert json.loads(decrypt_fields(sealed, None, RING, first=first)) == body
    listed = {"customer": [{"name": "x"}], "tax_id": {"deep": "y"}, "extra": {"v": 1}}
    sealed2 = encrypt_fields(json.dumps(listed).encode(), ["extra.v", "tax_id.deep"], [], RING)
    assert json.loads(decrypt_fields(sealed2, None, RING, first=first)) == listed


def _raise_chained(value: str) -> None:
    try:
        raise KeyError(value)
    except KeyError as exc:
        error = ValueError(f"bad {value!r}")
        error.add_note(f"note {value}")
        raise error from exc


def test_a_withheld_error_keeps_type_digest_and_frames_only() -> None:
    from rmqkit.crypto.masking import withhold_error

    ring = generate_keyring()
    value = 'Ünï "q\\u" ' + "x" * 50
    try:
        _raise_chained(value)
    except ValueError as exc:
        message, trace = withhold_error(ring, "ValueError", str(exc), "", exc)
    assert message.startswith("[withheld: ValueError on a message with decrypted fields; digest ")
    assert "_raise_chained" in trace and "raise KeyError(value)" in trace
    assert "KeyError: [withheld]" in trace and "direct cause" in trace
    for part in ("Ünï", "xxxxxxxx", "note", "q\\\\u"):
        assert part not in message + trace.replace("raise KeyError(value)", "")
    again, _ = withhold_error(ring, "ValueError", f"bad {value!r}", "")
    other, _ = withhold_error(ring, "ValueError", "bad 'other'", "")
    assert again == message and other != message  # equal texts group; others differ
    assert withhold_error(generate_keyring(), "ValueError", f"bad {value!r}", "")[0] != message
    # only a text traceback (no exception object): its File lines alone
    text = 'Traceback (most recent call last):\n  File "/app/h.py", line 3, in f\n    x()\nE: v\n'
    _, kept = withhold_error(ring, "E", "v", text)
    assert '  File "/app/h.py", line 3, in f' in kept and "x()" not in kept and "E: v" not in kept

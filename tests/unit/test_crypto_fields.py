"""Field-level encryption of JSON bodies (issue 16): round trips of every JSON type, nested
and missing fields, tampering and moved envelopes, rotation, redaction, blind-index matching.

On the code before rmqkit/crypto existed this module fails at import (no rmqkit.crypto).
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmqkit.crypto import (
    MARKER,
    KeyRingError,
    Matcher,
    Undecryptable,
    blind_index,
    decrypt_fields,
    encrypt_fields,
    find_field,
    generate_keyring,
    is_envelope,
    redact_fields,
)
from rmqkit.errors import ConfigError, DataError, ExitCode

VALUES: list[Any] = [
    "Ada Lovelace",
    "",
    'şğüİ ユニコード \u0000 "quoted"',
    0,
    -17,
    2**70,
    3.25,
    -0.0,
    1e300,
    True,
    False,
    None,
    [],
    [1, "two", None, {"three": 3}],
    {},
    {"b": 1, "a": [True, 2.5], "nested": {"x": None}},
]


@pytest.fixture(scope="module")
def ring():
    return generate_keyring()


@pytest.mark.parametrize("value", VALUES, ids=[repr(v)[:30] for v in VALUES])
def test_every_json_value_round_trips_as_bytes_and_parsed(ring, value) -> None:
    body = {"id": 7, "customer": {"name": value, "city": "Izmir"}, "tax_id": value}
    paths = ["customer.name", "tax_id"]
    raw = json.dumps(body).encode()
    sealed = encrypt_fields(raw, paths, ["tax_id"], ring)
    assert isinstance(sealed, bytes)
    parsed = json.loads(sealed)
    assert parsed["id"] == 7 and parsed["customer"]["city"] == "Izmir"  # the rest stays readable
    assert parsed["customer"]["name"][MARKER] == 1 and parsed["tax_id"][MARKER] == 1
    assert json.loads(decrypt_fields(sealed, paths, ring)) == body
    assert json.loads(decrypt_fields(sealed, None, ring)) == body  # every envelope found
    # parsed in, parsed out; the input object is not modified
    sealed_obj = encrypt_fields(body, paths, [], ring)
    assert body["tax_id"] is value
    assert decrypt_fields(sealed_obj, paths, ring) == body
    # the result keeps the body's key order
    assert list(json.loads(decrypt_fields(sealed, None, ring))) == ["id", "customer", "tax_id"]


def test_types_are_kept_exactly(ring) -> None:
    body = {"a": 1, "b": 1.0, "c": "1", "d": True, "e": None}
    back = decrypt_fields(encrypt_fields(body, list(body), [], ring), None, ring)
    assert [type(back[k]) for k in body] == [int, float, str, bool, type(None)]


def test_the_envelope_is_the_documented_one(ring) -> None:
    sealed = encrypt_fields({"tax_id": "123"}, ["tax_id"], ["tax_id"], ring)
    envelope = sealed["tax_id"]
    assert set(envelope) == {MARKER, "kid", "n", "ct", "bi"}
    assert envelope["kid"] == ring.current_id
    assert len(base64.b64decode(envelope["n"])) == 12
    # ciphertext = JSON text of the value ('"123"', 5 bytes) + the 16-byte GCM tag
    assert len(base64.b64decode(envelope["ct"])) == 5 + 16
    assert envelope["bi"] == blind_index(ring, "tax_id", "123")
    assert "123" not in json.dumps(sealed)
    # a field that is not blind-indexed carries no "bi"
    assert "bi" not in encrypt_fields({"x": "123"}, ["x"], [], ring)["x"]


def test_nonces_are_fresh_so_equal_values_do_not_look_equal(ring) -> None:
    a = encrypt_fields({"t": "same"}, ["t"], ["t"], ring)["t"]
    b = encrypt_fields({"t": "same"}, ["t"], ["t"], ring)["t"]
    assert a["n"] != b["n"] and a["ct"] != b["ct"]
    assert a["bi"] == b["bi"]  # the blind index is what is meant to be equal


def test_nested_paths_and_missing_fields_are_not_errors(ring) -> None:
    body = {"order": {"customer": {"name": "Ada", "tax": {"id": "9"}}}, "list": [{"name": "x"}]}
    paths = ["order.customer.name", "order.customer.tax.id", "order.absent", "absent.deeper"]
    sealed = encrypt_fields(body, paths, [], ring)
    assert sealed["order"]["customer"]["name"][MARKER] == 1
    assert sealed["order"]["customer"]["tax"]["id"][MARKER] == 1
    assert sealed["list"] == [{"name": "x"}]  # no path names it
    assert decrypt_fields(sealed, paths, ring) == body
    # a body where no path exists comes back as the very same object
    other = {"unrelated": 1, "absent": None, "order": {}}
    assert encrypt_fields(other, paths, [], ring) is other
    raw = b'{"unrelated": 1}'
    assert encrypt_fields(raw, paths, [], ring) is raw


@pytest.mark.parametrize(
    ("body", "path", "said"),
    [
        ({"list": [{"name": "x"}]}, "list.name", "list is a list"),
        ([{"customer": {"name": "Ada"}}], "customer.name", "the body is a list"),
        ({"customer.name": "Ada"}, "customer.name", "'customer.name'"),
        ({"customer": "Ada Lovelace"}, "customer.name", "customer is a string"),
        ({"items": {"card": "4242"}}, "items[].card", "items is an object"),
        ({"items": [{"card": "1"}, 7]}, "items[].card", "items[1] is a number"),
        ({"items[0].card": "4242"}, "items[].card", "'items[0].card'"),
        ({"order": {"customer": [{"name": "x"}]}}, "order.customer.name", "order.customer"),
    ],
)
def test_a_shape_that_could_hold_the_field_elsewhere_is_refused(ring, body, path, said) -> None:
    with pytest.raises(DataError) as caught:
        encrypt_fields(body, [path], [], ring)
    text = str(caught.value)
    assert path in text and said in text
    for value in ("Ada", "4242", "Lovelace"):
        assert value not in text.replace("'customer.name'", "")  # names paths, never values
    with pytest.raises(DataError):
        encrypt_fields(json.dumps(body).encode(), [path], [], ring)


def test_array_paths_encrypt_every_item_and_decrypt_back(ring) -> None:
    body = {
        "items": [{"card": "4242", "qty": 1}, {"qty": 2}, {"card": {"holder": "Ada"}}],
        "orders": [{"lines": [{"sku": "a"}, {"sku": "b"}]}, {"lines": []}],
        "tags": ["x", "y"],
    }
    paths = ["items[].card", "orders[].lines[].sku", "tags[]"]
    sealed = encrypt_fields(json.dumps(body).encode(), paths, ["items[].card"], ring)
    data = json.loads(sealed)
    assert is_envelope(data["items"][0]["card"]) and "card" not in data["items"][1]
    assert is_envelope(data["items"][2]["card"]) and "bi" in data["items"][2]["card"]
    assert all(is_envelope(line["sku"]) for line in data["orders"][0]["lines"])
    assert all(is_envelope(tag) for tag in data["tags"])
    assert json.loads(decrypt_fields(sealed, None, ring)) == body  # the consumer's walk
    assert json.loads(decrypt_fields(sealed, paths, ring)) == body
    top = encrypt_fields([{"tax": "1"}, {"tax": "2"}], ["[].tax"], [], ring)
    assert all(is_envelope(item["tax"]) for item in top)
    assert decrypt_fields(top, None, ring) == [{"tax": "1"}, {"tax": "2"}]
    assert Matcher("items[].card", "4242", ring).matches(sealed)
    assert not Matcher("items[].card", "4243", ring).matches(sealed)


def test_only_the_objects_on_the_way_are_copied(ring) -> None:
    side = {"big": list(range(10))}
    body = {"side": side, "customer": {"name": "Ada"}}
    sealed = encrypt_fields(body, ["customer.name"], [], ring)
    assert sealed["side"] is side and body["customer"] == {"name": "Ada"}


def test_encrypting_twice_leaves_an_envelope_alone(ring) -> None:
    once = encrypt_fields(b'{"t": "x"}', ["t"], [], ring)
    assert encrypt_fields(once, ["t"], [], ring) == once  # replay / relay: not double-wrapped


def test_no_key_ring_refuses_to_encrypt_and_fails_to_decrypt(ring) -> None:
    with pytest.raises(KeyRingError) as caught:
        encrypt_fields(b'{"t": "x"}', ["t"], [], None)
    assert caught.value.exit_code == ExitCode.CONFIG and "RMQKIT_KEYRING_FILE" in str(caught.value)
    sealed = encrypt_fields(b'{"t": "x"}', ["t"], [], ring)
    with pytest.raises(Undecryptable) as failed:
        decrypt_fields(sealed, ["t"], None)
    assert failed.value.reason == "no-keyring" and failed.value.path == "t"
    assert "field t" in str(failed.value) and ring.current_id in str(failed.value)
    # no paths configured: nothing to do, no key ring needed
    assert encrypt_fields(b'{"t": "x"}', [], [], None) == b'{"t": "x"}'


def test_a_body_that_is_not_json(ring) -> None:
    with pytest.raises(DataError, match="not JSON"):
        encrypt_fields(b"not json", ["t"], [], ring)
    assert decrypt_fields(b"not json $rmqkit_enc", None, ring) == b"not json $rmqkit_enc"
    assert redact_fields(b"\xff\xfe") == b"\xff\xfe"


def test_bad_paths_are_configuration_errors(ring) -> None:
    for paths, indexed in ((["a..b"], []), ([""], []), (["a"], ["b"])):
        with pytest.raises(ConfigError):
            encrypt_fields({"a": 1}, paths, indexed, ring)


# --- tampering ----------------------------------------------------------------------------------
def _sealed(ring) -> dict[str, Any]:
    return encrypt_fields(
        {"customer": {"name": "Ada"}, "tax_id": "123"},
        ["customer.name", "tax_id"],
        ["tax_id"],
        ring,
    )


def _flip(text: str, at: int) -> str:
    data = bytearray(base64.b64decode(text))
    data[at] ^= 0x01
    return base64.b64encode(bytes(data)).decode()


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda e: e.update(ct=_flip(e["ct"], 0)), "tampered"),
        (lambda e: e.update(ct=_flip(e["ct"], -1)), "tampered"),  # the tag
        (lambda e: e.update(n=_flip(e["n"], 5)), "tampered"),
        (lambda e: e.update(ct=e["ct"][:-8] + "AAAAAAA="), "tampered"),
        (lambda e: e.update(ct=""), "tampered"),
        (lambda e: e.update(kid="k00000000"), "unknown-key"),
        (lambda e: e.update(kid="bad id\nline"), "malformed"),
        (lambda e: e.pop("n"), "malformed"),
        (lambda e: e.update(ct="%%%"), "malformed"),
        (lambda e: e.update(n=base64.b64encode(b"short").decode()), "malformed"),
        (lambda e: e.update({MARKER: 2}), "malformed"),
    ],
    ids=[
        "ct",
        "tag",
        "nonce",
        "truncated",
        "empty-ct",
        "unknown-kid",
        "bad-kid",
        "no-nonce",
        "not-base64",
        "short-nonce",
        "version",
    ],
)
def test_a_changed_envelope_is_undecryptable_with_the_reason(ring, change, reason) -> None:
    body = _sealed(ring)
    change(body["tax_id"])
    with pytest.raises(Undecryptable) as caught:
        decrypt_fields(json.dumps(body).encode(), None, ring)
    error = caught.value
    assert error.reason == reason and error.path == "tax_id"
    assert str(error).startswith(f"field tax_id: cannot decrypt ({reason}): ")
    assert "\n" not in str(error) and "123" not in str(error)
    assert isinstance(error, DataError) and error.exit_code == ExitCode.DATA


def test_another_key_ids_key_does_not_open_it(ring) -> None:
    other, new_key = ring.rotated()
    body = _sealed(ring)
    body["tax_id"]["kid"] = new_key.id  # relabelled: the key id is in the associated data
    with pytest.raises(Undecryptable) as caught:
        decrypt_fields(body, ["tax_id"], other)
    assert caught.value.reason == "tampered"


def test_an_unknown_key_id_names_the_ids_the_ring_has(ring) -> None:
    foreign = generate_keyring()
    body = _sealed(foreign)
    with pytest.raises(Undecryptable) as caught:
        decrypt_fields(body, None, ring)
    assert caught.value.reason == "unknown-key" and caught.value.kid == foreign.current_id
    assert ring.current_id in str(caught.value)


@pytest.mark.parametrize("target", ["customer.name", "other", "items[]"])
def test_an_envelope_moved_to_another_field_fails(ring, target) -> None:
    body = _sealed(ring)
    envelope = body.pop("tax_id")
    if target == "customer.name":
        body["customer"]["name"] = envelope
    elif target == "other":
        body["other"] = envelope
    else:
        body["items"] = [envelope]
    with pytest.raises(Undecryptable) as caught:
        decrypt_fields(body, None, ring)
    assert caught.value.reason == "tampered" and caught.value.path == target


def test_an_odd_field_name_stays_on_one_line(ring) -> None:
    body = _sealed(ring)
    body["a\nb" + "x" * 300] = body.pop("tax_id")
    with pytest.raises(Undecryptable) as caught:
        decrypt_fields(body, None, ring)
    text = str(caught.value)
    assert "\n" not in text and text.startswith("field 'a\\nbxxx") and len(text) < 400


def test_not_strict_marks_the_bad_field_and_decrypts_the_rest(ring) -> None:
    body = _sealed(ring)
    body["tax_id"]["ct"] = _flip(body["tax_id"]["ct"], 0)
    shown = decrypt_fields(body, None, ring, strict=False)
    assert shown["customer"]["name"] == "Ada"
    assert shown["tax_id"] == f"[undecryptable kid={ring.current_id}: tampered]"


# --- rotation -----------------------------------------------------------------------------------
def test_rotation_keeps_old_values_readable_and_the_blind_index_stable(ring) -> None:
    old_body = _sealed(ring)
    rotated, key = ring.rotated()
    assert rotated.current_id == key.id != ring.current_id
    new_body = _sealed(rotated)
    assert new_body["tax_id"]["kid"] == key.id and old_body["tax_id"]["kid"] == ring.current_id
    for body in (old_body, new_body):
        assert decrypt_fields(body, None, rotated)["tax_id"] == "123"
    assert old_body["tax_id"]["bi"] == new_body["tax_id"]["bi"]
    assert rotated.index_key.id == ring.index_key.id
    matcher = Matcher.parse("tax_id=123", rotated)
    assert matcher.matches(old_body) and matcher.matches(new_body)
    # the ring before the rotation cannot read what the new key wrote: unknown key id
    with pytest.raises(Undecryptable, match="unknown-key"):
        decrypt_fields(new_body, None, ring)


def test_a_staged_key_decrypts_but_does_not_encrypt(ring) -> None:
    staged, key = ring.rotated(activate=False)
    assert staged.current_id == ring.current_id and staged.has(key.id)
    assert _sealed(staged)["tax_id"]["kid"] == ring.current_id
    assert staged.activated(key.id).current_id == key.id
    with pytest.raises(KeyRingError):
        staged.activated("k-nope")


# --- redaction and matching ---------------------------------------------------------------------
def test_redaction_replaces_every_envelope_with_a_marker(ring) -> None:
    raw = encrypt_fields(
        b'{"a": {"b": "secret-b"}, "c": "secret-c", "d": 4}', ["a.b", "c"], ["c"], ring
    )
    shown = redact_fields(raw)
    marker = f"[encrypted kid={ring.current_id}]"
    assert json.loads(shown) == {"a": {"b": marker}, "c": marker, "d": 4}
    assert json.loads(redact_fields(raw, ["c"]))["a"]["b"][MARKER] == 1  # only the paths given
    plain = b'{"plain": 1, "n": [1.50, "x"]}'
    assert redact_fields(plain) is plain and decrypt_fields(plain, None, ring) is plain
    assert redact_fields({"x": {MARKER: 1, "kid": 5}}) == {"x": "[encrypted kid=?]"}


def test_matcher_compares_blind_indexes_without_the_encryption_keys(ring) -> None:
    bodies = [
        encrypt_fields({"tax_id": v, "n": i}, ["tax_id"], ["tax_id"], ring)
        for i, v in enumerate(["123", 123, "124", None])
    ]
    bodies.append({"tax_id": "123", "n": 4})  # plaintext (published before encryption)
    bodies.append({"n": 5})
    bodies.append(encrypt_fields({"tax_id": "123", "n": 6}, ["tax_id"], [], ring))  # no index
    found = [b["n"] for b in bodies if Matcher.parse("tax_id=123", ring).matches(b)]
    assert found == [0, 1, 4]  # the string and the number, encrypted or not
    assert [b["n"] for b in bodies if Matcher.parse('tax_id="123"', ring).matches(b)] == [0, 4]
    assert [b["n"] for b in bodies if Matcher.parse("tax_id=null", ring).matches(b)] == [3]
    raw = json.dumps(bodies[0]).encode()
    assert Matcher.parse("tax_id=123", ring).matches(raw)
    assert not Matcher.parse("tax_id=123", ring).matches(b"not json")
    with pytest.raises(KeyRingError):
        Matcher.parse("tax_id=123", None).matches(bodies[0])
    with pytest.raises(ConfigError):
        Matcher.parse("no-equals-sign", ring)


def test_the_blind_index_is_bound_to_the_field_and_the_index_key(ring) -> None:
    assert blind_index(ring, "tax_id", "1") != blind_index(ring, "vat_id", "1")
    assert blind_index(ring, "tax_id", "1") != blind_index(generate_keyring(), "tax_id", "1")
    # canonical JSON: object key order does not matter, types do
    assert blind_index(ring, "p", {"a": 1, "b": 2}) == blind_index(ring, "p", {"b": 2, "a": 1})
    assert blind_index(ring, "p", 1) != blind_index(ring, "p", 1.0)


def test_find_field() -> None:
    body = {"a": {"b": None}}
    assert find_field(body, "a.b") == (True, None)
    assert find_field(body, "a.c") == (False, None)
    assert find_field(body, "a.b.c") == (False, None)


def test_user_data_that_looks_like_an_envelope_is_still_encrypted(ring) -> None:
    fake = {MARKER: 1, "note": "SENTINEL-fake"}
    sealed = encrypt_fields({"t": fake}, ["t"], [], ring)
    assert "SENTINEL" not in json.dumps(sealed)
    assert decrypt_fields(sealed, None, ring) == {"t": fake}


# --- properties ---------------------------------------------------------------------------------
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=12,
)
names = st.text(alphabet="abcxyz_", min_size=1, max_size=4)


@settings(max_examples=150, deadline=None)
@given(value=json_values, path=st.lists(names, min_size=1, max_size=3), indexed=st.booleans())
def test_any_value_at_any_path_round_trips_and_never_shows(value, path, indexed) -> None:
    ring = _RING
    body: Any = {"SENTINEL": value}
    for name in reversed(path):
        body = {name: body}
    dotted = ".".join([*path, "SENTINEL"])
    raw = json.dumps(body).encode()
    sealed = encrypt_fields(raw, [dotted], [dotted] if indexed else [], ring)
    assert json.loads(decrypt_fields(sealed, None, ring)) == json.loads(raw)
    assert json.loads(decrypt_fields(sealed, [dotted], ring)) == json.loads(raw)
    plain = json.dumps(value)
    # A short text could appear in base64 by chance; a value spelled like one of the path's
    # own keys ('"___x"') is in the body as that key, not as the value.
    if len(plain) >= 6 and all(json.dumps(name) not in plain for name in path):
        assert plain.encode() not in sealed and plain.encode() not in redact_fields(sealed)
    assert find_field(json.loads(redact_fields(sealed)), dotted)[1].startswith("[encrypted kid=")


_RING = generate_keyring()


def test_lone_surrogates_refused_in_fields_carried_elsewhere_undecryptable_sealed(ring) -> None:
    with pytest.raises(DataError, match=r"field tax_id .*lone surrogate"):
        encrypt_fields(b'{"tax_id": "\\ud83d"}', ["tax_id"], [], ring)
    with pytest.raises(DataError, match="field customer"):
        encrypt_fields(b'{"customer": {"x": ["\\udc00"]}}', ["customer"], [], ring)
    sealed = encrypt_fields(b'{"tax_id": "1", "note": "\\ud83d"}', ["tax_id"], [], ring)
    assert b'"note":"\\ud83d"' in sealed  # elsewhere: carried, escaped as it came
    opened = decrypt_fields(sealed, None, ring, first=["tax_id"])
    assert json.loads(opened) == {"tax_id": "1", "note": "\ud83d"}
    # an authentic envelope whose plaintext is a lone surrogate: Undecryptable, not a crash
    import os

    from rmqkit.crypto.envelope import _aad

    nonce = os.urandom(12)
    ct = ring.cipher(ring.current_id).encrypt(nonce, b'"\\ud83d"', _aad("tax_id", ring.current_id))
    envelope = {
        MARKER: 1,
        "kid": ring.current_id,
        "n": base64.b64encode(nonce).decode(),
        "ct": base64.b64encode(ct).decode(),
    }
    body = json.dumps({"tax_id": envelope}).encode()
    for first in (["tax_id"], []):
        with pytest.raises(Undecryptable) as caught:
            decrypt_fields(body, None, ring, first=first)
        assert caught.value.reason == "malformed" and "surrogate" in str(caught.value)

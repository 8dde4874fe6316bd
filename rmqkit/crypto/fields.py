"""Field-level encryption of a JSON body: encrypt, decrypt, redact, match by blind index.

A field is a dotted path into nested objects (``customer.name``), ``[]`` stepping into every
item of a list (``items[].card``, ``[].tax_id`` for a body that is a list: rmqkit.crypto.paths).
A field missing from a body is not an error: there is nothing to protect. A body shaped so that
it could hold the field where the path does not reach (a list where an object was expected, a
scalar, a flattened ``"customer.name"`` key) is refused by ``encrypt_fields`` (DataError).

Every function takes the body as ``bytes`` (returns compact JSON ``bytes``, or the very same
object when nothing changed) or as an already parsed value (returns a new value; the input is
never modified, only the objects on the way to a changed field are copied).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from typing import Any, TypeVar

from rmqkit.crypto.envelope import (
    MARKER,
    NotUnicode,
    blind_index,
    compact_json,
    is_envelope,
    is_sealed,
    loads_json,
    open_envelope,
    redaction_marker,
    seal,
)
from rmqkit.crypto.errors import KeyRingError, Undecryptable
from rmqkit.crypto.keyring import ENV_FILE, ENV_INLINE, KeyRing
from rmqkit.crypto.paths import ITEMS, has_items, join, leaves, parse_path, shape_problem
from rmqkit.errors import ConfigError, DataError

B = TypeVar("B")
_Fn = Callable[[str, Any], Any]  # (dotted path, value) -> new value, or the same object
# Cheap test before parsing: a body without this text holds no envelope. (A JSON writer that
# escaped letters of the key, "\u0024rmqkit_enc", would slip past it; none does.)
_MARKER_BYTES = MARKER[1:].encode()


def check_paths(paths: Iterable[str], blind_index_paths: Iterable[str] = ()) -> None:
    """ValueError unless every path is well-formed and every blind-indexed path is also
    encrypted (for the topology file's ``sensitive_fields`` / ``blind_index`` validation)."""
    sensitive = list(paths)
    for path in sensitive:
        parse_path(path)
    extra = [p for p in blind_index_paths if p not in sensitive]
    if extra:
        raise ValueError(f"blind_index fields must also be sensitive fields: {', '.join(extra)}")


def _checked(paths: Iterable[str], blind_index_paths: Iterable[str] = ()) -> None:
    try:
        check_paths(paths, blind_index_paths)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


# --- walking a parsed body (copy-on-write) ------------------------------------------------------
def _at_path(root: Any, parts: Sequence[str], path: str, fn: _Fn) -> Any:
    """``root`` with ``fn`` applied to the value(s) at ``parts`` (absent: ``root`` unchanged;
    a ``[]`` step applies it to every item of a list)."""
    if parts[0] == ITEMS:
        if not isinstance(root, list):
            return root
        items: list[Any] | None = None
        for i, child in enumerate(root):
            new = fn(path, child) if len(parts) == 1 else _at_path(child, parts[1:], path, fn)
            if new is not child:
                items = list(root) if items is None else items
                items[i] = new
        return root if items is None else items
    if not isinstance(root, dict) or parts[0] not in root:
        return root
    child = root[parts[0]]
    new = fn(path, child) if len(parts) == 1 else _at_path(child, parts[1:], path, fn)
    if new is child:
        return root
    copy = dict(root)  # keeps key order: the body reads as it did
    copy[parts[0]] = new
    return copy


def _envelopes(value: Any, parts: list[str], fn: _Fn) -> Any:
    """``value`` with ``fn`` applied to every envelope anywhere in it. A list's items are
    named with ``[]`` (``items[].card``), as the field paths name them, so an envelope sealed
    for another field fails to open. ``parts`` is the path so far, joined only when an
    envelope is found (most of a body is not one)."""
    if isinstance(value, dict):
        if MARKER in value:
            return fn(join(parts), value)
        changed: dict[str, Any] | None = None
        for key, child in value.items():
            if not isinstance(child, dict | list):
                continue
            parts.append(key)
            new = _envelopes(child, parts, fn)
            parts.pop()
            if new is not child:
                changed = dict(value) if changed is None else changed
                changed[key] = new
        return value if changed is None else changed
    if isinstance(value, list):
        items: list[Any] | None = None
        for i, child in enumerate(value):
            if not isinstance(child, dict | list):
                continue
            parts.append(ITEMS)
            new = _envelopes(child, parts, fn)
            parts.pop()
            if new is not child:
                items = list(value) if items is None else items
                items[i] = new
        return value if items is None else items
    return value


def _apply(body: Any, paths: Sequence[str] | None, fn: _Fn) -> Any:
    if paths is None:
        return _envelopes(body, [], fn)
    for path in paths:
        body = _at_path(body, parse_path(path), path, fn)
    return body


def _on_body(body: B, paths: Sequence[str] | None, fn: _Fn, *, need_json: bool) -> B:
    """Run ``_apply`` on a bytes or parsed body; bytes come back re-serialized only if changed."""
    if not isinstance(body, bytes | bytearray | memoryview):
        return _apply(body, paths, fn)  # type: ignore[no-any-return]
    data = bytes(body)
    if not need_json and _MARKER_BYTES not in data:
        return body  # no envelope in it: no parse, no copy
    try:
        parsed = loads_json(data)
    except ValueError:
        if need_json:
            raise DataError(
                "the body is not JSON: its sensitive fields cannot be encrypted"
            ) from None
        return body  # not JSON: nothing of ours in it (the consumer parks it as not JSON)
    new = _apply(parsed, paths, fn)
    if new is parsed:
        return body
    return compact_json(new)  # type: ignore[return-value]


# --- the four operations ------------------------------------------------------------------------
def _require(keyring: KeyRing | None) -> KeyRing:
    if keyring is None:
        raise KeyRingError(
            f"sensitive fields are configured but no key ring is loaded: set {ENV_FILE} "
            f"or {ENV_INLINE} (nothing is ever sent in plaintext instead)"
        )
    return keyring


def encrypt_fields(
    body: B, paths: Sequence[str], blind_index_paths: Sequence[str], keyring: KeyRing | None
) -> B:
    """``body`` with the value of each field in ``paths`` replaced by its envelope under the
    ring's current key, with a blind index for the fields in ``blind_index_paths``.

    A missing field is skipped; a field that already holds an envelope that opens under the
    ring is left as it is (a replayed or relayed message is not encrypted twice). Never sent in
    plaintext instead: no key ring is a KeyRingError (exit 78); a DataError (exit 65, naming
    the field) for a bytes body that is not JSON, a body shaped so it could hold a field where
    the path does not reach (``rmqkit.crypto.paths.shape_problem``), a value with a lone
    surrogate, or an envelope-shaped value that does not open under the ring.
    """
    if not paths:
        return body
    _checked(paths, blind_index_paths)
    ring = _require(keyring)
    indexed = frozenset(blind_index_paths)

    def encrypt(path: str, value: Any) -> Any:
        if is_sealed(value):
            try:
                open_envelope(ring, path, value)
            except Undecryptable as exc:
                raise DataError(
                    f"field {path} holds an envelope that does not open under the key ring "
                    f"({exc.reason}): refused rather than published as if encrypted"
                ) from None
            return value
        try:
            return seal(ring, path, value, index=path in indexed)
        except NotUnicode as exc:
            raise DataError(f"field {path} {exc}: it cannot be encrypted") from None

    parsed: Any = body
    if isinstance(body, bytes | bytearray | memoryview):
        try:
            parsed = loads_json(bytes(body))
        except ValueError:
            raise DataError(
                "the body is not JSON: its sensitive fields cannot be encrypted"
            ) from None
    for path in paths:
        problem = shape_problem(parsed, path)
        if problem is not None:
            raise DataError(problem)
    new = _apply(parsed, paths, encrypt)
    if parsed is body:
        return new  # type: ignore[no-any-return]
    return body if new is parsed else compact_json(new)  # type: ignore[return-value]


def decrypt_fields(
    body: B,
    paths: Sequence[str] | None,
    keyring: KeyRing | None,
    *,
    strict: bool = True,
    first: Sequence[str] = (),
) -> B:
    """``body`` with the envelopes at ``paths`` (None: every envelope anywhere in the body)
    replaced by their values.

    ``strict`` (the consumer): the first field that cannot be opened raises Undecryptable
    naming its path and reason — nothing is handed over half-decrypted. Not strict (showing a
    parked message): such a field becomes ``[undecryptable kid=…: reason]`` and the rest is
    decrypted. A plaintext value at a listed path is returned as it is.

    ``first`` (with ``paths`` None, on a bytes body): where envelopes are expected (the
    queue's encrypted fields). They are opened first; when the body holds no other envelope
    (its count of markers says so) the walk over the whole body is skipped.
    """
    if paths is not None:
        _checked(paths)

    def decrypt(path: str, value: Any) -> Any:
        if not is_envelope(value):
            return value
        try:
            return open_envelope(keyring, path, value)
        except Undecryptable as exc:
            if strict:
                raise
            return f"[undecryptable kid={exc.kid or '?'}: {exc.reason}]"

    if paths is None and first and isinstance(body, bytes):
        # The consumer's per-message path: envelopes where the queue expects them.
        opener = _open_strict(keyring) if strict else decrypt
        return _decrypt_expected(body, first, opener, decrypt)  # type: ignore[no-any-return]
    return _on_body(body, paths, decrypt, need_json=False)


def _open_strict(keyring: KeyRing | None) -> _Fn:
    return lambda path, envelope: open_envelope(keyring, path, envelope)


def _decrypt_expected(data: bytes, first: Sequence[str], opener: _Fn, fn: _Fn) -> Any:
    """``opener`` opens an envelope found at an expected path; ``fn`` is the walk's (it also
    sees values that are not envelopes)."""
    markers = data.count(_MARKER_BYTES)
    if not markers:
        return data
    try:
        parsed = loads_json(data)
    except ValueError:
        return data  # not JSON: nothing of ours in it (the consumer parks it as not JSON)
    # The parse is ours alone (no caller holds it), so the expected fields are replaced in
    # place: no copy-on-write of the objects on their way (this is the consumer's per-message
    # path; bench/consumer_encrypted.py measures it).
    opened = 0
    for path, parents, leaf in _split(tuple(first)):
        node = parsed
        for part in parents:
            if type(node) is not dict:
                break
            node = node.get(part)
        else:
            if type(node) is dict:
                value = node.get(leaf)
                if type(value) is dict and MARKER in value:
                    node[leaf] = opener(path, value)
                    opened += 1
    # Each envelope holds the marker once (base64 and key ids cannot spell it): fewer opened
    # than markers means an envelope elsewhere, or the text in some value — walk it all, from a
    # fresh parse (the walk must not open again what a decrypted value holds: user data may
    # have a "$rmqkit_enc" key). Rare, so the second parse costs nothing that matters.
    if opened != markers:
        return _whole(data, parsed if not opened else loads_json(data), fn)
    return compact_json(parsed)


@lru_cache(maxsize=256)
def _split(first: tuple[str, ...]) -> tuple[tuple[str, tuple[str, ...], str], ...]:
    """Each expected path once, split into its parents and leaf (per queue, not per message)."""
    return tuple(
        (path, parse_path(path)[:-1], parse_path(path)[-1])
        for path in dict.fromkeys(first)
        if not has_items(path)  # envelopes in lists: found by the walk
    )


def _whole(body: Any, parsed: Any, fn: _Fn) -> Any:
    new = _envelopes(parsed, [], fn)
    return body if new is parsed else compact_json(new)


def redact_fields(body: B, paths: Sequence[str] | None = None) -> B:
    """``body`` with envelopes replaced by ``[encrypted kid=…]`` (at ``paths``, or by default
    everywhere): what parking list/show print without ``--decrypt``. Never raises on a
    malformed envelope; plaintext values are left alone."""
    if paths is not None:
        _checked(paths)

    def redact(path: str, value: Any) -> Any:
        return redaction_marker(value) if is_envelope(value) else value

    return _on_body(body, paths, redact, need_json=False)


def find_field(body: Any, path: str) -> tuple[bool, Any]:
    """``(True, value)`` for the value at dotted ``path`` in a parsed body, else ``(False,
    None)``; for a path with ``[]`` steps ``(True, [values…])`` when any item has it."""
    if has_items(path):
        found = list(leaves(body, path))
        return (True, found) if found else (False, None)
    value = body
    for part in parse_path(path):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value


class Matcher:
    """``parking list --match FIELD=VALUE``: finds bodies whose field equals VALUE, comparing
    blind indexes of envelopes (nothing is decrypted) and plaintext values as they are.

    VALUE is text from a command line: it matches the string and, if it reads as JSON (``42``,
    ``true``, ``{"a":1}``), that value too, so ``tax_id=12345`` finds the string and the number.
    """

    def __init__(self, path: str, text: str, keyring: KeyRing | None) -> None:
        _checked([path])
        self.path = path
        self.values: list[Any] = [text]
        try:
            parsed = json.loads(text)
        except ValueError:
            pass
        else:
            if parsed != text:
                self.values.append(parsed)
        self._keyring = keyring
        self._indexes = (
            {blind_index(keyring, path, v) for v in self.values} if keyring is not None else set()
        )

    @classmethod
    def parse(cls, spec: str, keyring: KeyRing | None) -> Matcher:
        """From ``FIELD=VALUE`` (the first ``=`` splits); ConfigError for a bad spec."""
        path, sep, text = spec.partition("=")
        if not sep or not path:
            raise ConfigError(f"--match {spec!r}: give FIELD=VALUE, e.g. tax_id=12345678901")
        return cls(path, text, keyring)

    def matches(self, body: Any) -> bool:
        """Whether ``body`` (bytes or parsed) has the field equal to the value. An envelope
        without a blind index (a field not indexed) never matches; with no key ring loaded an
        envelope raises KeyRingError: the comparison needs the ring's index key."""
        if isinstance(body, bytes | bytearray | memoryview):
            try:
                body = json.loads(bytes(body))
            except ValueError:
                return False
        return any(self._equal(value) for value in leaves(body, self.path))

    def _equal(self, value: Any) -> bool:
        if is_envelope(value):
            if self._keyring is None:
                _require(None)
            return value.get("bi") in self._indexes
        return any(value == v and type(value) is type(v) for v in self.values)


__all__ = [
    "Matcher",
    "check_paths",
    "decrypt_fields",
    "encrypt_fields",
    "find_field",
    "leaves",
    "parse_path",
    "redact_fields",
    "shape_problem",
]

"""One field value sealed into an envelope, and opened again; the blind index of a value.

The envelope (docs/encryption.md) replaces the value in the JSON body::

    {"$rmqkit_enc": 1, "kid": "k5c1e0a7b", "n": "<base64 12-byte nonce>",
     "ct": "<base64 ciphertext + 16-byte GCM tag>", "bi": "<base64 HMAC-SHA256>"}

- plaintext: the value as JSON text (UTF-8), so every JSON type comes back as it went in;
- AES-256-GCM under key ``kid`` with a random 96-bit nonce;
- associated data: ``rmqkit-enc/1``, the key id and the dotted field path, NUL-separated, so
  an envelope copied to another field, or relabelled with another key id, fails to open;
- ``bi`` (only for blind-indexed fields): HMAC-SHA256 under the ring's index key of
  ``rmqkit-bi/1``, the path and the value's canonical JSON (sorted keys, compact), so equal
  values in the same field have equal ``bi`` whatever key encrypted them.
"""

from __future__ import annotations

import binascii
import json
import math
import os
from functools import lru_cache
from typing import Any

import orjson
from cryptography.exceptions import InvalidTag

from rmqkit.crypto.errors import Undecryptable
from rmqkit.crypto.keyring import KeyRing, valid_key_id

MARKER = "$rmqkit_enc"
VERSION = 1
NONCE_BYTES = 12
_AAD_PREFIX = b"rmqkit-enc/1\x00"
_BI_PREFIX = b"rmqkit-bi/1\x00"


def is_envelope(value: Any) -> bool:
    """Whether ``value`` is an rmqkit envelope (an object with the ``$rmqkit_enc`` key)."""
    return isinstance(value, dict) and MARKER in value


_FIELDS = frozenset((MARKER, "kid", "n", "ct", "bi"))
_TAG_BYTES = 16
_INDEX_BYTES = 32


def is_sealed(value: Any) -> bool:
    """Whether ``value`` has exactly the shape of an envelope rmqkit writes: version 1, a valid
    key id, a 12-byte nonce, a ciphertext at least as long as the GCM tag, a 32-byte blind index
    if any, and no other key. Only such a value counts as encrypted (``encrypt_fields`` leaves
    it as it is once it opens; the outbox relay's check lets it pass): user data that merely
    has a ``$rmqkit_enc`` key is not "already encrypted"."""
    if not isinstance(value, dict) or not value.keys() <= _FIELDS:
        return False
    version = value.get(MARKER)
    if type(version) is not int or version != VERSION or not valid_key_id(value.get("kid")):
        return False
    nonce = _strict_b64(value.get("n"))
    ciphertext = _strict_b64(value.get("ct"))
    if nonce is None or len(nonce) != NONCE_BYTES:
        return False
    if ciphertext is None or len(ciphertext) < _TAG_BYTES:
        return False
    if "bi" in value:
        index = _strict_b64(value["bi"])
        return index is not None and len(index) == _INDEX_BYTES
    return True


def _strict_b64(text: Any) -> bytes | None:
    if not isinstance(text, str):
        return None
    try:
        return binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError):
        return None


class NotUnicode(ValueError):
    """A value holds a string with a lone surrogate (``"\\ud83d"`` in JSON): not Unicode text,
    so it has no UTF-8 form to encrypt."""


def _b64(data: bytes) -> str:
    return binascii.b2a_base64(data, newline=False).decode("ascii")


# Encoders built once: json.dumps with options builds a new JSONEncoder on every call.
_compact = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_canonical = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, sort_keys=True).encode


def compact_json(value: Any) -> bytes:
    """``value`` as compact JSON (UTF-8, no spaces, key order kept): an envelope's plaintext,
    and a body re-serialized after a change.

    orjson first: parsing and re-serializing the whole body was half of what decryption cost
    the consumer (bench/consumer_encrypted.py), and orjson does both several times faster. It
    refuses what it cannot write exactly (an integer beyond 64 bits; a dict with non-string
    keys) and writes NaN/Infinity as null: those go through the json module, as before."""
    try:
        out = orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):
        return _json_module(value)
    # orjson writes NaN/Infinity as null: only an output with a null can hide one.
    if b"null" in out and _has_non_finite(value):
        return _json_module(value)
    return out


_ascii = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True).encode


def _json_module(value: Any) -> bytes:
    try:
        return _compact(value).encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate (read from a "\\ud83d" escape) has no UTF-8 form; the escaped
        # spelling keeps the body as it came (only sealing a value refuses it: seal).
        return _ascii(value).encode("ascii")


def _has_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(_has_surrogate(k) or _has_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_surrogate(v) for v in value)
    return False


def _has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_non_finite(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_non_finite(v) for v in value)
    return False


# 19 digits in a row: a number that may not fit 64 bits, which orjson would read as a float
# (losing digits) where the json module keeps the exact integer. Found by mapping every digit
# to "0" and anything else to " " (bytes.translate, C speed) and looking for 19 zeros: a
# regex scan for it cost more than orjson's whole parse.
_DIGITS = bytes(48 if 48 <= c <= 57 else 32 for c in range(256))
_LONG_RUN = b"0" * 19


def loads_json(data: bytes | str) -> Any:
    """Parse JSON: orjson, or the json module for what orjson refuses or reads differently
    (NaN, Infinity, integers beyond 64 bits), so every body reads as it did with json."""
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    if _LONG_RUN not in raw.translate(_DIGITS):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return json.loads(raw)


@lru_cache(maxsize=4096)  # a queue has a few fields and keys: built once, not per message
def _aad(path: str, kid: str) -> bytes:
    return _AAD_PREFIX + kid.encode("utf-8") + b"\x00" + path.encode("utf-8")


def canonical_json(value: Any) -> bytes:
    """The value's canonical JSON (sorted keys, no spaces, UTF-8): what the blind index hashes.
    Note 1 and 1.0 differ, as do "1" and 1; strings are compared exactly (no case folding)."""
    return _canonical(value).encode("utf-8")


def blind_index(keyring: KeyRing, path: str, value: Any) -> str:
    """The blind index of ``value`` in field ``path``: what ``parking list --match`` compares
    with an envelope's ``bi`` without decrypting anything."""
    digest = keyring.index_digest(
        _BI_PREFIX + path.encode("utf-8") + b"\x00" + canonical_json(value)
    )
    return _b64(digest)


def seal(keyring: KeyRing, path: str, value: Any, *, index: bool = False) -> dict[str, Any]:
    """The envelope of ``value`` for field ``path`` under the ring's current key (with a
    blind index if ``index``)."""
    kid = keyring.current_id
    nonce = os.urandom(NONCE_BYTES)
    plaintext = compact_json(value)
    if plaintext.isascii() and b"\\u" in plaintext and _has_surrogate(value):
        raise NotUnicode("holds a string with a lone surrogate (e.g. \\ud83d): not Unicode text")
    ciphertext = keyring.cipher(kid).encrypt(nonce, plaintext, _aad(path, kid))
    envelope: dict[str, Any] = {
        MARKER: VERSION,
        "kid": kid,
        "n": _b64(nonce),
        "ct": _b64(ciphertext),
    }
    if index:
        envelope["bi"] = blind_index(keyring, path, value)
    return envelope


def _bytes(envelope: dict[str, Any], name: str, path: str, kid: str) -> bytes:
    text = envelope.get(name)
    if not isinstance(text, str):
        raise Undecryptable(path, Undecryptable.MALFORMED, f"envelope has no {name!r}", kid=kid)
    try:
        return binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError):
        raise Undecryptable(
            path, Undecryptable.MALFORMED, f"envelope {name!r} is not base64", kid=kid
        ) from None


def open_envelope(keyring: KeyRing | None, path: str, envelope: dict[str, Any]) -> Any:
    """The value sealed in ``envelope`` at field ``path``; Undecryptable names the path and
    the cause (no key ring, unknown key id, tampered or moved, malformed)."""
    kid = envelope.get("kid")
    version = envelope.get(MARKER)
    # the common case first: a key the ring has (its ids are valid ids) and this version
    if version == VERSION and keyring is not None and isinstance(kid, str) and keyring.has(kid):
        return _open(keyring, path, envelope, kid)
    if version != VERSION:
        raise Undecryptable(
            path,
            Undecryptable.MALFORMED,
            f"envelope version {version!r} (this rmqkit reads {VERSION})",
            kid=kid if valid_key_id(kid) else None,
        )
    if not isinstance(kid, str) or not valid_key_id(kid):  # it is quoted in messages below
        raise Undecryptable(path, Undecryptable.MALFORMED, "envelope has no valid key id")
    if keyring is None:
        raise Undecryptable(
            path,
            Undecryptable.NO_KEYRING,
            f"no key ring loaded (key {kid} needed; set RMQKIT_KEYRING_FILE or RMQKIT_KEYRING)",
            kid=kid,
        )
    if not keyring.has(kid):
        raise Undecryptable(
            path,
            Undecryptable.UNKNOWN_KEY,
            f"unknown key id {kid!r} (the key ring {keyring.source} has "
            f"{', '.join(keyring.key_ids)})",
            kid=kid,
        )
    return _open(keyring, path, envelope, kid)


def _open(keyring: KeyRing, path: str, envelope: dict[str, Any], kid: str) -> Any:
    n, ct = envelope.get("n"), envelope.get("ct")
    try:  # the common case in one step; _bytes names what is wrong otherwise
        if type(n) is not str or type(ct) is not str:
            raise ValueError
        nonce = binascii.a2b_base64(n, strict_mode=True)
        ciphertext = binascii.a2b_base64(ct, strict_mode=True)
    except (binascii.Error, ValueError):
        nonce = _bytes(envelope, "n", path, kid)
        ciphertext = _bytes(envelope, "ct", path, kid)
    if len(nonce) != NONCE_BYTES:
        raise Undecryptable(
            path, Undecryptable.MALFORMED, f"nonce is {len(nonce)} bytes, not 12", kid=kid
        )
    try:
        plaintext = keyring.cipher(kid).decrypt(nonce, ciphertext, _aad(path, kid))
    except InvalidTag:
        raise Undecryptable(
            path,
            Undecryptable.TAMPERED,
            f"authentication failed under key {kid}: the ciphertext, nonce or key id was "
            "changed, or the envelope was moved from another field",
            kid=kid,
        ) from None
    if plaintext[:1] == b'"':  # a string (most personal data): orjson reads it exactly
        try:
            return orjson.loads(plaintext)
        except orjson.JSONDecodeError:
            pass  # e.g. a lone surrogate escape, which the json module reads
    try:
        value = loads_json(plaintext)
    except ValueError:  # authentic yet not JSON (or UTF-8): not written by rmqkit
        raise Undecryptable(
            path, Undecryptable.MALFORMED, "decrypted value is not JSON", kid=kid
        ) from None
    # Only an escape can spell a lone surrogate in valid UTF-8 JSON; rmqkit never seals one.
    if b"\\u" in plaintext and _has_surrogate(value):
        raise Undecryptable(
            path,
            Undecryptable.MALFORMED,
            "decrypted value holds a lone surrogate (not Unicode text; rmqkit never encrypts one)",
            kid=kid,
        )
    return value


def redaction_marker(envelope: dict[str, Any]) -> str:
    """What ``redact_fields`` puts in place of an envelope: ``[encrypted kid=…]``."""
    kid = envelope.get("kid")
    return f"[encrypted kid={kid if valid_key_id(kid) else '?'}]"


__all__ = [
    "MARKER",
    "NONCE_BYTES",
    "VERSION",
    "NotUnicode",
    "blind_index",
    "canonical_json",
    "compact_json",
    "is_envelope",
    "is_sealed",
    "loads_json",
    "open_envelope",
    "redaction_marker",
    "seal",
]

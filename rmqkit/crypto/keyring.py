"""The key ring: AES-256 encryption keys by id, which one encrypts, and the blind-index key.

File format (docs/encryption.md), JSON::

    {
      "format": "rmqkit-keyring/1",
      "current": "k5c1e0a7b",
      "keys": [
        {"id": "k0d93a2f4", "created": "2026-11-01T09:00:00Z", "key": "<base64, 32 bytes>"},
        {"id": "k5c1e0a7b", "created": "2026-12-01T20:00:00Z", "key": "<base64, 32 bytes>"}
      ],
      "index_key": {"id": "i7e21b9c0", "created": "2026-11-01T09:00:00Z", "key": "<base64>"}
    }

``current`` encrypts; every key in ``keys`` decrypts what it once encrypted (rotation never
re-encrypts). ``index_key`` makes the blind indexes and is never rotated: equality search must
give the same token before and after a rotation.

Key material stays inside ``Key`` and ``KeyRing``: their ``repr``/``str`` show ids and dates
only, errors name the source and the JSON key, never a value, and nothing here logs material.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import logging
import os
import secrets
import stat
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from hashlib import sha256
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from rmqkit.crypto.errors import KeyRingError

FORMAT = "rmqkit-keyring/1"
KEY_BYTES = 32  # AES-256, and the HMAC-SHA256 key of the blind index
ENV_FILE = "RMQKIT_KEYRING_FILE"
ENV_INLINE = "RMQKIT_KEYRING"
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")

log = logging.getLogger(__name__)


def valid_key_id(kid: object) -> bool:
    """Whether ``kid`` is a well-formed key id: 1-64 letters, digits, ``_`` or ``-`` (so an id
    read from a message can be quoted in a one-line error or log line as it is)."""
    return isinstance(kid, str) and 0 < len(kid) <= 64 and set(kid) <= _ID_CHARS


def now_text() -> str:
    """The current UTC time as the key ring writes it (``2026-12-01T20:00:00Z``)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_key_id(prefix: str) -> str:
    """A fresh random key id (``k`` + 8 hex digits for encryption keys, ``i`` for the index
    key): random, so two separately generated rings never share an id and a value encrypted
    under another ring fails as "unknown key id", not as "tampered"."""
    return prefix + secrets.token_hex(4)


class Key:
    """One 32-byte key with its id and creation time. Its material never shows in repr/str."""

    __slots__ = ("_material", "created", "id")

    def __init__(self, id: str, created: str, material: bytes) -> None:
        if len(material) != KEY_BYTES:
            raise ValueError(f"key {id}: {len(material)} bytes, need {KEY_BYTES}")
        self.id = id
        self.created = created
        self._material = material

    @classmethod
    def generate(cls, prefix: str) -> Key:
        """A new random key (``os.urandom`` through ``secrets``)."""
        return cls(new_key_id(prefix), now_text(), secrets.token_bytes(KEY_BYTES))

    def __repr__(self) -> str:
        return f"Key(id={self.id!r}, created={self.created!r})"

    __str__ = __repr__

    def _as_json(self) -> dict[str, str]:
        return {
            "id": self.id,
            "created": self.created,
            "key": base64.b64encode(self._material).decode("ascii"),
        }


class KeyRing:
    """Encryption keys by id, the current one, and the separate blind-index key.

    Immutable: ``rotated``/``activated`` return a new ring. ``cipher(kid)`` and
    ``index_digest`` are the only ways material is used; ``summary()`` is what may be shown.
    """

    def __init__(
        self, keys: Sequence[Key], current: str, index_key: Key, *, source: str = "key ring"
    ) -> None:
        by_id: dict[str, Key] = {}
        for key in keys:
            if key.id in by_id or key.id == index_key.id:
                raise KeyRingError(f"{source}: key id {key.id!r} appears twice")
            by_id[key.id] = key
        if current not in by_id:
            shown = repr(current) if valid_key_id(current) else "(not a key id)"
            raise KeyRingError(f"{source}: current key {shown} is not among the keys")
        self._keys = by_id
        self.current_id = current
        self.index_key = index_key
        self.source = source
        self._ciphers: dict[str, AESGCM] = {}  # built once per key: AESGCM() costs ~1 µs

    # --- what may be shown --------------------------------------------------------------
    @property
    def key_ids(self) -> list[str]:
        """The encryption key ids, in file order (oldest first as rmqkit writes them)."""
        return list(self._keys)

    @property
    def keys(self) -> list[Key]:
        """The encryption keys (their repr shows no material)."""
        return list(self._keys.values())

    @property
    def current(self) -> Key:
        """The key new values are encrypted with."""
        return self._keys[self.current_id]

    def summary(self) -> dict[str, Any]:
        """Ids, dates and roles only: for `rmqkit keys show` and `rmqkit config`."""
        return {
            "source": self.source,
            "current": self.current_id,
            "keys": [
                {"id": k.id, "created": k.created, "current": k.id == self.current_id}
                for k in self._keys.values()
            ],
            "index_key": {"id": self.index_key.id, "created": self.index_key.created},
        }

    def __repr__(self) -> str:
        return (
            f"KeyRing(current={self.current_id!r}, keys={self.key_ids!r}, "
            f"index_key={self.index_key.id!r}, source={self.source!r})"
        )

    __str__ = __repr__

    # --- using the material -------------------------------------------------------------
    def has(self, kid: str) -> bool:
        """Whether ``kid`` is one of the encryption keys."""
        return kid in self._keys

    def cipher(self, kid: str) -> AESGCM:
        """The AES-256-GCM cipher of key ``kid`` (KeyError if unknown)."""
        cipher = self._ciphers.get(kid)
        if cipher is None:
            cipher = self._ciphers[kid] = AESGCM(self._keys[kid]._material)
        return cipher

    def index_digest(self, message: bytes) -> bytes:
        """HMAC-SHA256 of ``message`` under the blind-index key."""
        return hmac.new(self.index_key._material, message, sha256).digest()

    # --- new rings ----------------------------------------------------------------------
    def rotated(self, *, activate: bool = True) -> tuple[KeyRing, Key]:
        """A ring with one more encryption key (current if ``activate``); the index key and
        every old key stay, so old values still decrypt and blind indexes do not change."""
        key = Key.generate("k")
        while self.has(key.id) or key.id == self.index_key.id:  # 2**-32 per existing key
            key = Key.generate("k")
        ring = KeyRing(
            [*self._keys.values(), key],
            key.id if activate else self.current_id,
            self.index_key,
            source=self.source,
        )
        return ring, key

    def activated(self, kid: str) -> KeyRing:
        """The same keys with ``kid`` current."""
        if kid not in self._keys:
            shown = repr(kid) if valid_key_id(kid) else "(not a key id)"
            raise KeyRingError(
                f"{self.source}: no encryption key {shown} (the ring has {', '.join(self._keys)})"
            )
        return KeyRing(list(self._keys.values()), kid, self.index_key, source=self.source)

    def to_json(self) -> str:
        """The key-ring file's text, WITH key material: only for writing the file."""
        data = {
            "format": FORMAT,
            "current": self.current_id,
            "keys": [k._as_json() for k in self._keys.values()],
            "index_key": self.index_key._as_json(),
        }
        return json.dumps(data, indent=2) + "\n"


def generate_keyring(*, source: str = "key ring") -> KeyRing:
    """A new ring: one encryption key (current) and a blind-index key."""
    key = Key.generate("k")
    return KeyRing([key], key.id, Key.generate("i"), source=source)


# --- parsing ------------------------------------------------------------------------------------
def _key(value: Any, where: str, source: str) -> Key:
    if not isinstance(value, dict):
        raise KeyRingError(f"{source}: {where} must be an object with id, created and key")
    kid, created, text = value.get("id"), value.get("created", ""), value.get("key")
    if not valid_key_id(kid):
        raise KeyRingError(f"{source}: {where}.id must be 1-64 letters, digits, '_' or '-'")
    if not isinstance(created, str):
        raise KeyRingError(f"{source}: {where}.created must be a string")
    if not isinstance(text, str):
        raise KeyRingError(f"{source}: {where}.key (of {kid}) must be a base64 string")
    try:
        material = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise KeyRingError(f"{source}: {where}.key (of {kid}) is not valid base64") from None
    if len(material) != KEY_BYTES:
        raise KeyRingError(
            f"{source}: {where}.key (of {kid}) is {len(material)} bytes, need {KEY_BYTES}"
        )
    return Key(str(kid), created, material)


def parse_keyring(text: str | bytes, *, source: str) -> KeyRing:
    """A ring from its JSON text; ``source`` (a file name or ``RMQKIT_KEYRING``) names it in
    errors. Error messages never quote the text: it holds the keys."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:  # its message quotes no text, only the position
        hint = f" — {ENV_INLINE} takes the ring's JSON; a file path goes in {ENV_FILE}"
        raise KeyRingError(
            f"{source}: not a JSON key ring (line {exc.lineno} column {exc.colno})"
            + (hint if source == ENV_INLINE else "")
        ) from None
    except UnicodeDecodeError:
        raise KeyRingError(f"{source}: not a JSON key ring (not UTF-8)") from None
    if not isinstance(data, dict):
        raise KeyRingError(f"{source}: a key ring is a JSON object")
    if data.get("format") != FORMAT:
        raise KeyRingError(f"{source}: format must be {FORMAT!r}")
    raw_keys = data.get("keys")
    if not isinstance(raw_keys, list) or not raw_keys:
        raise KeyRingError(f"{source}: keys must be a non-empty list")
    keys = [_key(k, f"keys[{i}]", source) for i, k in enumerate(raw_keys)]
    current = data.get("current")
    if not isinstance(current, str):
        raise KeyRingError(f"{source}: current must name one of the keys")
    index_key = _key(data.get("index_key"), "index_key", source)
    return KeyRing(keys, current, index_key, source=source)


# --- loading ------------------------------------------------------------------------------------
_B64_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=_-")
_HOLDS = (
    f"{ENV_FILE} takes the path of a key-ring file (`rmqkit keys generate --out FILE`); "
    f"the ring's JSON itself goes in {ENV_INLINE}"
)


def _looks_like_material(text: str) -> bool:
    """Whether ``text`` (given as a file name) could be key material rather than a path: JSON,
    several lines, or a long base64-like run (a key is 44 base64 characters). Such a text is
    never quoted in a message."""
    if not text.isprintable() or any(c in text for c in "{}[]\"'"):
        return True
    # A whole key: base64's own "/" splits it into runs too short to tell (a random key held
    # two, one 16 long without a digit), so the text is also looked at as one run.
    whole = text.strip()
    if len(whole) >= 40 and set(whole) <= _B64_CHARS and not Path(whole).exists():
        cases = any(c.isupper() for c in whole) and any(c.islower() for c in whole)
        # digits, or base64's padding: a 32-byte key is 43 characters and "="
        if cases and (any(c.isdigit() for c in whole) or whole.endswith("=")):
            return True
    for part in text.replace("\\", "/").split("/"):
        run = part.rsplit(".", 1)[0] if "." in part[1:] else part
        if len(run) >= 16 and set(run) <= _B64_CHARS and _mixed(run):
            return True
    return len(text) > 1024


def _mixed(run: str) -> bool:
    """Upper and lower case letters and digits all in ``run``: random base64, not a name."""
    return (
        any(c.isupper() for c in run)
        and any(c.islower() for c in run)
        and any(c.isdigit() for c in run)
    )


def _file_source(path: Path | str, what: str | None) -> str:
    """How the file ``path`` is named in messages: the path, or ``what`` (the setting's name)
    when the text looks like key material (a ring's JSON or a key pasted in by mistake)."""
    text = str(path)
    if not _looks_like_material(text):
        return text
    return what or "the key-ring file name"


def load_keyring_file(path: Path | str, *, what: str | None = None) -> KeyRing:
    """Read the key ring at ``path``. A file others may read is loaded with a warning (secret
    mounts are often 0644) — `rmqkit keys generate/rotate` write 0600.

    ``what``: the setting the path came from (``RMQKIT_KEYRING_FILE``), named in messages
    instead of a path that looks like key material (a ring's JSON, a base64 key): no message
    ever quotes such a text."""
    source = _file_source(path, what)
    text = str(path)
    if source != text:
        shape = "JSON (a key ring itself?)" if text.lstrip()[:1] in "{[" else "key material"
        raise KeyRingError(
            f"{source} holds what looks like {shape}, not a file path (not shown) — {_HOLDS}"
        )
    path = Path(path)
    try:
        data = path.read_bytes()
        mode = path.stat().st_mode
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "bad file name"
        hint = f" — {_HOLDS}" if what else ""
        raise KeyRingError(f"key ring {source}: cannot read ({reason}){hint}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning(
            "key ring %s is readable by others (mode %o): chmod 600 it", source, mode & 0o777
        )
    return parse_keyring(data, source=source)


def load_keyring(file: Path | str | None = None, inline: str | None = None) -> KeyRing | None:
    """The key ring from a file path (``RMQKIT_KEYRING_FILE``) or inline JSON
    (``RMQKIT_KEYRING``); None if neither is given. Both at once is a configuration error.
    No message quotes either value beyond a path that looks like one."""
    if file and inline:
        raise KeyRingError(f"set {ENV_FILE} or {ENV_INLINE}, not both")
    if file:
        ring = load_keyring_file(file, what=ENV_FILE)
    elif inline:
        ring = parse_keyring(inline, source=ENV_INLINE)
    else:
        return None
    log.debug("key ring loaded: %r", ring)  # ids only (KeyRing.__repr__)
    return ring


def keyring_from_env(environ: Mapping[str, str] | None = None) -> KeyRing | None:
    """``load_keyring`` from ``RMQKIT_KEYRING_FILE`` / ``RMQKIT_KEYRING`` in the environment."""
    env = os.environ if environ is None else environ
    return load_keyring(env.get(ENV_FILE) or None, env.get(ENV_INLINE) or None)


__all__ = [
    "ENV_FILE",
    "ENV_INLINE",
    "FORMAT",
    "KEY_BYTES",
    "Key",
    "KeyRing",
    "generate_keyring",
    "keyring_from_env",
    "load_keyring",
    "load_keyring_file",
    "parse_keyring",
    "valid_key_id",
]

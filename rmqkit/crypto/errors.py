"""The errors of field-level encryption, in rmqkit's one exception tree (rmqkit/errors.py).

``Undecryptable`` is what a consumer parks with reason ``undecryptable``; ``KeyRingError`` is a
key ring that cannot be loaded or written. Neither message ever contains key material or a
plaintext value: they name the field path, the key id and the cause.
"""

from __future__ import annotations

from rmqkit.errors import ConfigError, DataError


class KeyRingError(ConfigError):
    """The key ring is missing, unreadable or invalid (exit 78); names the source, never a key."""


class Undecryptable(DataError):
    """A field's envelope cannot be opened: unknown key id, tampered, no key ring, malformed.

    ``path`` is the dotted field path, ``reason`` one of ``REASONS`` (stable, for metrics and
    parking headers), ``kid`` the envelope's key id when it has one. ``str()`` is one line.
    """

    NO_KEYRING = "no-keyring"
    UNKNOWN_KEY = "unknown-key"
    TAMPERED = "tampered"
    MALFORMED = "malformed"
    REASONS = (NO_KEYRING, UNKNOWN_KEY, TAMPERED, MALFORMED)

    def __init__(self, path: str, reason: str, detail: str, *, kid: str | None = None) -> None:
        self.path = path
        self.reason = reason
        self.detail = detail
        self.kid = kid
        super().__init__(f"field {_shown(path)}: cannot decrypt ({reason}): {detail}")


def _shown(path: str) -> str:
    """A path as it may appear in a one-line message: the keys of a body are anyone's text
    (a newline in one would split a log line), so odd ones are quoted and long ones cut."""
    text = path if path.isprintable() else repr(path)
    return text if len(text) <= 200 else text[:200] + "…"


__all__ = ["KeyRingError", "Undecryptable"]

"""The key ring the settings name (``RMQKIT_KEYRING_FILE`` / ``RMQKIT_KEYRING``, also from
``.env``), for the commands that show or search encrypted fields (docs/encryption.md).

Settings sit below every layer and cannot import ``rmqkit.crypto``; this is where the two meet.
"""

from __future__ import annotations

from rmqkit.crypto import KeyRing, KeyRingError, load_keyring
from rmqkit.settings import Settings


def keyring_of(settings: Settings) -> KeyRing | None:
    """The key ring of ``settings`` (None if neither setting is given); KeyRingError (exit 78)
    for both at once or a ring that cannot be read. Material stays inside the KeyRing."""
    file, inline = settings.keyring_sources()
    return load_keyring(file, inline)


def require_keyring(settings: Settings, why: str) -> KeyRing:
    """The key ring, or KeyRingError (exit 78, one line) saying ``why`` it is needed."""
    ring = keyring_of(settings)
    if ring is None:
        raise KeyRingError(
            f"{why} needs the key ring: set RMQKIT_KEYRING_FILE (a file from `rmqkit keys "
            "generate`) or RMQKIT_KEYRING (its JSON)"
        )
    return ring


__all__ = ["keyring_of", "require_keyring"]

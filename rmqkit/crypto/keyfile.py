"""Key-ring files: generate, rotate, activate — written whole or not at all, mode 0600.

rmqkit/fileout.py's ``SafeOutput`` gives a new file the umask's mode (usually 0644) before
writing to it, which would put key material in a file others can read for a moment; so this
module writes its own temporary file, created 0600 by ``mkstemp``, fsyncs it and moves it into
place (a hard link when nothing may be overwritten, so a file created meanwhile is refused).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from rmqkit.crypto.keyring import Key, KeyRing, generate_keyring, load_keyring_file
from rmqkit.errors import OutputError, UsageError

FILE_MODE = 0o600


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_keyring(path: Path, ring: KeyRing, *, replace: bool) -> None:
    """Write ``ring`` to ``path`` with mode 0600, atomically; without ``replace`` an existing
    file is refused (UsageError, exit 64). Write errors become OutputError (exit 74)."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise UsageError(f"{path} is a directory — give a file name")
    if not replace and (path.exists() or path.is_symlink()):
        raise UsageError(f"{path} exists — pass --force to replace it (nothing was done)")
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            os.fchmod(fd, FILE_MODE)  # mkstemp's 0600 already; said explicitly
            data = ring.to_json().encode("utf-8")
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        if replace:
            os.replace(tmp, path)
        else:
            try:  # a link never replaces: a file created meanwhile is not overwritten
                os.link(tmp, path)
            except FileExistsError:
                raise UsageError(f"{path} was created meanwhile — nothing was written") from None
            os.unlink(tmp)
        tmp = None
        _fsync_dir(parent)
    except OSError as exc:
        raise OutputError(f"cannot write key ring {path}: {exc.strerror or exc}") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def generate(path: Path | str, *, force: bool = False) -> KeyRing:
    """A new key ring (one encryption key, one blind-index key) written to ``path``.

    Refuses an existing file unless ``force``: replacing a key ring makes every value encrypted
    under it unreadable.
    """
    path = Path(path)
    ring = generate_keyring(source=str(path))
    write_keyring(path, ring, replace=force)
    return ring


def rotate(path: Path | str, *, activate: bool = True) -> tuple[KeyRing, Key]:
    """Add a new encryption key to the ring at ``path`` (current unless ``activate`` is False),
    keeping every old key for decryption and the blind-index key as it is. Returns the new
    ring and the new key."""
    path = Path(path)
    ring, key = load_keyring_file(path).rotated(activate=activate)
    write_keyring(path, ring, replace=True)
    return ring, key


def activate(path: Path | str, kid: str) -> KeyRing:
    """Make ``kid`` the current encryption key of the ring at ``path``."""
    path = Path(path)
    ring = load_keyring_file(path).activated(kid)
    write_keyring(path, ring, replace=True)
    return ring


__all__ = ["FILE_MODE", "activate", "generate", "rotate", "write_keyring"]

"""Database DSNs: which backend a DSN names, where it points, and how to show it safely.

Accepted forms::

    sqlite:///relative/path.db       (three slashes: a path relative to the working directory)
    sqlite:////absolute/path.db      (four slashes: an absolute path)
    postgresql://user[:password]@host[:port]/database[?options]   (also postgres://)

Anything else is a ``ConfigError`` (exit 78) whose message shows the DSN masked: a password,
in the user part or in a ``password=`` option, is never printed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal
from urllib.parse import urlsplit

from rmqkit.errors import ConfigError

Backend = Literal["sqlite", "postgresql"]

_PG_SCHEMES: Final = ("postgresql", "postgres")
_PASSWORD_OPTION: Final = re.compile(r"(?i)(password=)[^&]*")
_USERINFO_PASSWORD: Final = re.compile(
    r"^([a-zA-Z][a-zA-Z0-9+.-]*://[^:/@]*):[^/]*@"
)  # to the last @


def mask_dsn(dsn: str) -> str:
    """``dsn`` with every password replaced by ``***`` (works on malformed DSNs too)."""
    masked = _USERINFO_PASSWORD.sub(r"\1:***@", dsn)
    return _PASSWORD_OPTION.sub(r"\1***", masked)


@dataclass(frozen=True)
class Dsn:
    """A parsed DSN. ``target`` is the SQLite file path or the libpq connection string."""

    backend: Backend
    target: str
    raw: str

    @property
    def masked(self) -> str:
        """The DSN as it may be printed or logged."""
        return mask_dsn(self.raw)

    def __repr__(self) -> str:  # never the password, even in a traceback or a log
        return f"Dsn({self.masked!r})"


def parse_dsn(dsn: str) -> Dsn:
    """Parse ``dsn``; raise ``ConfigError`` (exit 78, DSN masked) if it is malformed or unknown."""
    text = dsn.strip()
    scheme, sep, rest = text.partition("://")
    scheme = scheme.lower()
    if not sep:
        raise _bad(text, "not a DSN (expected sqlite:///path.db or postgresql://user@host/db)")
    if scheme == "sqlite":
        # urlsplit would read "sqlite:///a.db" as host "" path "/a.db"; the form is a path
        # after exactly three slashes, so take it literally (four slashes = absolute).
        if not rest.startswith("/") or rest.startswith("///"):
            raise _bad(text, "SQLite DSNs are sqlite:///relative.db or sqlite:////abs/path.db")
        path = rest[1:]
        if not path or path.endswith("/") or "?" in path:
            raise _bad(text, "a SQLite DSN names a database file, without options")
        return Dsn("sqlite", path, text)
    if scheme in _PG_SCHEMES:
        try:
            parts = urlsplit(text)
            port = parts.port  # raises ValueError on a non-numeric or out-of-range port
        except ValueError as exc:
            raise _bad(text, f"malformed PostgreSQL DSN ({exc})") from None
        if not parts.hostname and "host=" not in parts.query:
            raise _bad(text, "a PostgreSQL DSN needs a host: postgresql://user@host:5432/db")
        if port == 0:
            raise _bad(text, "port 0 is not a port")
        return Dsn("postgresql", text, text)
    if scheme.startswith(("postgresql+", "sqlite+")):
        raise _bad(text, "use the plain scheme (postgresql:// or sqlite:///), not a driver suffix")
    raise _bad(text, f"unsupported database {scheme!r}: use sqlite:/// or postgresql://")


def _bad(dsn: str, why: str) -> ConfigError:
    return ConfigError(f"bad database DSN {mask_dsn(dsn)!r}: {why}")

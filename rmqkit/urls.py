"""Finding the URL typed with a password that was not percent-encoded, before it misleads.

``amqp://guest:p@ss/word@host`` parses (RFC 3986) as host ``ss`` and vhost ``word@host``: the
connection then fails on a host nobody named, and the error quotes part of the password as
that host. ``malformed_userinfo`` says why such a URL is ambiguous, naming only the characters
that need encoding, never any part of the user name or password.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

# How each character that ends or splits the authority is written inside a user name or password.
ENCODED = {"@": "%40", "/": "%2F", "?": "%3F", "#": "%23", "%": "%25", ",": "%2C"}
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def malformed_userinfo(url: str) -> str | None:
    """Why the part of ``url`` before its host (user name and password) is ambiguous, or None.

    Ambiguous: more than one ``@`` in the authority; an ``@`` after a ``/``, ``?`` or ``#``
    where the authority already holds an ``@`` or a ``:`` that is not followed by a port (the
    password held that character and the parser cut it there); a ``%`` that starts no
    ``%XX`` escape. A vhost with an ``@`` in a URL without credentials is left alone (valid).
    """
    match = _SCHEME.match(url)
    if match is None:
        return None
    rest = url[match.end() :]
    netloc = urlsplit(url).netloc
    last_at = rest.rfind("@")
    if last_at < 0:
        return None
    found: list[str] = []
    cut = False  # the parser ended the authority inside the password
    if netloc.count("@") > 1:
        found.append("@")
    if last_at >= len(netloc) and ("@" in netloc or _bad_port(netloc)):
        # what the parser took for the end of the authority was inside the password
        cut = True
        found += [c for c in "@/?#" if c in rest[:last_at] and c not in found]
    # the user name and password as the host's '@' delimits them (the URL's last, if ambiguous)
    userinfo = rest[:last_at] if found else netloc.rpartition("@")[0]
    if _BAD_ESCAPE.search(userinfo):
        found.append("%")
    if not found:
        return None
    quoted = [f"'{c}'" for c in found]
    chars = quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]
    codes = ", ".join(f"'{c}' as {ENCODED[c]}" for c in found)
    them = "it" if len(found) == 1 else "them"
    return f"its user name or password holds {chars}: percent-encode {them} there ({codes})" + (
        "; an '@' of the vhost is written %40 too" if cut else ""
    )


def _bad_port(netloc: str) -> bool:
    """Whether ``netloc`` (no ``@``) ends in ``:`` and something that is not a port number:
    ``guest:pa`` of ``amqp://guest:pa/ss@host``."""
    _, sep, port = netloc.rpartition(":")
    return bool(sep) and not netloc.endswith("]") and not port.isdigit()


def split_urls(raw: str) -> tuple[list[str], int | None]:
    """The comma-separated URLs of ``raw``, and the 1-based number of the first entry after the
    first that does not start with a scheme (``ss@host/`` of ``amqp://u:p,ss@host/``: a ``,``
    in the password), or None."""
    urls = [u.strip() for u in raw.split(",") if u.strip()]
    for number, url in enumerate(urls[1:], start=2):
        if _SCHEME.match(url) is None:
            return urls, number
    return urls, None

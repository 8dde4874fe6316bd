"""Failure fingerprints: which parked messages failed the same way (``rmqkit parking groups``).

A fingerprint is the park reason, the error type, the innermost frame of the application's own
code in the traceback (not rmqkit's, the standard library's or an installed package's) and the
error message with what varies between messages normalised away: quoted values, numbers, ids,
e-mail addresses. "charge failed for order 17: amount 12.50" and "charge failed for order 902:
amount 3" are one failure; a KeyError in ``charge()`` and one in ``refund()`` are two.

The frame is its file's name and function, without the line number or the directory, so one
failure stays one group across a deploy that moves lines or the release directory. Pure; the
consumer writes the id in ``rmqkit-fingerprint`` when it parks, and views compute it from the
stored reason, error and traceback for messages parked without one (before the header existed,
or parked by the broker).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

ID_CHARS = 12  # hex characters of the sha-256: one in 2**48 for two failures to share an id
PATTERN_MAX_CHARS = 200

_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line \d+, in (?P<func>\S+)', re.MULTILINE)
# Code that is not the application's: the standard library, installed packages, rmqkit itself,
# frozen modules. Paths are the consumer host's, so they are matched by shape, not by this
# process's sys.path.
_LIBRARY = re.compile(
    r"(/|\\)(site-packages|dist-packages)(/|\\)|(/|\\)lib(/|\\)python3[^/\\]*(/|\\)"
    r"|^<frozen |(/|\\)rmqkit(/|\\)(?!tests?(/|\\))"
)
_NORMALISE = (
    (re.compile(r"'[^']*'|\"[^\"]*\""), "<str>"),
    (re.compile(r"\b[\w.+-]+@[\w-]+(\.[\w-]+)+\b"), "<email>"),
    (re.compile(r"\b[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\b"), "<id>"),
    (re.compile(r"\b(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{8,}\b"), "<id>"),
    (re.compile(r"\d+(\.\d+)?"), "<n>"),
    (re.compile(r"\s+"), " "),
)


@dataclass(frozen=True)
class Fingerprint:
    """One failure: its id and what it was computed from."""

    id: str
    reason: str
    error_type: str
    frame: str  # "payments.py:charge", or "" when no application frame is known
    pattern: str  # the error message, normalised


def application_frame(traceback: str | None) -> str:
    """The innermost frame of the application's code in ``traceback``, as ``file.py:function``
    ("" when there is none: no traceback, or only library frames)."""
    if not traceback:
        return ""
    for match in reversed(list(_FRAME.finditer(traceback))):
        path = match["path"]
        if not _LIBRARY.search(path):
            name = re.split(r"[/\\]", path)[-1]
            return f"{name}:{match['func']}"
    return ""


def normalise_message(message: str | None) -> str:
    """``message`` with quoted values, numbers, ids and e-mail addresses replaced by
    placeholders, whitespace collapsed, at most PATTERN_MAX_CHARS long."""
    text = message or ""
    for pattern, placeholder in _NORMALISE:
        text = pattern.sub(placeholder, text)
    return text.strip()[:PATTERN_MAX_CHARS]


def fingerprint(
    reason: str | None, error_type: str | None, message: str | None, traceback: str | None
) -> Fingerprint:
    """The fingerprint of a failure with these parts (None: unknown, as "")."""
    frame = application_frame(traceback)
    pattern = normalise_message(message)
    parts = (reason or "", error_type or "", frame, pattern)
    digest = hashlib.sha256("\x1f".join(parts).encode("utf-8", "surrogatepass")).hexdigest()
    return Fingerprint(digest[:ID_CHARS], parts[0], parts[1], frame, pattern)

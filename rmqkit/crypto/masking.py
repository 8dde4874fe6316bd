"""Keep decrypted values out of error text: what a failing handler's exception says ends up in
the parked copy (``rmqkit-error-message``, the traceback), the consumer's log and every parking
view, places with wider access than the handler (issue 16).

``withhold_error`` is what the consumer applies to the error of a handler that was given
decrypted values: the message is replaced by the error's type and a keyed digest, and the
traceback keeps its frames (file, line, function, source line) but no exception's message,
note or argument. Masking the values where they occur cannot be made exact — a handler may
quote a value through ``json.dumps``, ``repr``, ``ascii``, pydantic's truncated
``input_value``, URL encoding, split over two lines, or any encoding of its own — so the text
that could hold one is not kept at all. The digest (HMAC-SHA256 under the key ring's index key,
like a blind index) is equal for equal error texts, so failures can still be grouped, and
cannot be reversed by guessing values without that key.

``opened_values`` / ``mask_values`` (exact masking of known spellings) remain for other text.
A handler that writes the value to its own log is beyond reach.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Iterable
from typing import Any

from rmqkit.crypto.envelope import is_envelope
from rmqkit.crypto.keyring import KeyRing

MASK = "[redacted]"
# Shorter values are not masked: "1" or "no" would garble every error text they occur in, and
# a value that short is not a secret a mask could keep anyway.
MIN_LENGTH = 3


def _parsed(body: Any) -> Any:
    if isinstance(body, bytes | bytearray | memoryview):
        return json.loads(bytes(body))
    return body


def _texts(value: Any) -> Iterable[str]:
    """The spellings of a decrypted value an error text could quote."""
    if isinstance(value, str):
        yield value
        return
    yield json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict):
        for inner in value.values():
            yield from _texts(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _texts(inner)
    elif not isinstance(value, bool) and value is not None:
        yield str(value)  # 1e3 as Python prints it, beside its JSON spelling


def _walk(sealed: Any, opened: Any, found: set[str]) -> None:
    if is_envelope(sealed):
        found.update(text for text in _texts(opened) if len(text) >= MIN_LENGTH)
    elif isinstance(sealed, dict) and isinstance(opened, dict):
        for key, value in sealed.items():
            if key in opened:
                _walk(value, opened[key], found)
    elif isinstance(sealed, list) and isinstance(opened, list):
        for value, other in zip(sealed, opened, strict=False):
            _walk(value, other, found)


def opened_values(sealed: Any, opened: Any) -> tuple[str, ...]:
    """The plaintext values ``decrypt_fields`` put where ``sealed`` (bytes or parsed JSON) had
    envelopes, as they could appear in a text; longest first, so a value that contains another
    is masked whole. Empty when nothing was decrypted."""
    if sealed is opened:
        return ()
    found: set[str] = set()
    _walk(_parsed(sealed), _parsed(opened), found)
    return tuple(sorted(found, key=len, reverse=True))


def mask_values(text: str, values: Iterable[str]) -> str:
    """``text`` with every occurrence of each of ``values`` (and its ``repr``, as exception
    messages quote values) replaced by ``[redacted]``."""
    for value in values:
        for spelling in (value, repr(value)):
            if spelling in text:
                text = text.replace(spelling, MASK)
    return text


_DIGEST_PREFIX = b"rmqkit-err/1\x00"
DIGEST_HEX = 16


def error_digest(keyring: KeyRing | None, error_type: str, text: str) -> str:
    """A keyed digest of an error text (16 hex digits): equal texts, equal digests; without
    the ring's index key it cannot be recomputed, so it cannot be used to test guesses."""
    if keyring is None:  # nothing was decrypted without a ring: no secret to key it with
        return "-"
    message = _DIGEST_PREFIX + error_type.encode() + b"\x00" + text.encode("utf-8", "replace")
    return keyring.index_digest(message).hex()[:DIGEST_HEX]


def withheld_message(keyring: KeyRing | None, error_type: str, text: str) -> str:
    """What replaces the message of an error raised on a message with decrypted fields."""
    return (
        f"[withheld: {error_type} on a message with decrypted fields; "
        f"digest {error_digest(keyring, error_type, text)}]"
    )


def withhold_error(
    keyring: KeyRing | None,
    error_type: str,
    message: str,
    traceback_text: str,
    exception: BaseException | None = None,
) -> tuple[str, str]:
    """``(message, traceback)`` of a handler error raised on a message with decrypted fields:
    the message withheld (``withheld_message``), the traceback rebuilt from ``exception``'s
    frames with every exception's message withheld (chained ones too). Without the exception
    object only the traceback's ``File "…", line N, in name`` lines are kept."""
    shown = withheld_message(keyring, error_type, message)
    if exception is not None:
        return shown, _frames_of(exception, shown)
    kept = [
        line
        for line in traceback_text.splitlines()
        if line.startswith('  File "') and line.count('"') == 2 and ", line " in line
    ]
    if not kept:
        return shown, ""
    return shown, "Traceback (most recent call last):\n" + "\n".join(kept) + f"\n{shown}\n"


# What traceback.format_exception puts between chained exceptions.
_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"


def _frames_of(exception: BaseException, shown: str) -> str:
    """The traceback of ``exception`` and its causes, frames only (source lines come from the
    handler's files, not from data), each exception's own text replaced by ``shown``."""
    chain: list[tuple[BaseException, str]] = []
    seen: set[int] = set()
    exc: BaseException | None = exception
    link = ""
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        chain.append((exc, link))
        if exc.__cause__ is not None:
            exc, link = exc.__cause__, _CAUSE
        elif exc.__context__ is not None and not exc.__suppress_context__:
            exc, link = exc.__context__, _CONTEXT
        else:
            exc = None
    out: list[str] = []
    for exc, link in reversed(chain):
        frames = traceback.StackSummary.extract(
            traceback.walk_tb(exc.__traceback__), capture_locals=False
        )
        if frames:
            out.append("Traceback (most recent call last):\n")
            out.extend(frames.format())
        name = type(exc).__qualname__
        out.append(f"{name}: {shown if exc is exception else '[withheld]'}\n")
        if link:
            out.append(link)
    return "".join(out)


__all__ = [
    "MASK",
    "error_digest",
    "mask_values",
    "opened_values",
    "withheld_message",
    "withhold_error",
]

"""Keep decrypted values out of error text: what a failing handler's exception says ends up in
the parked copy (``rmqkit-error-message``, the traceback), the consumer's log and every parking
view, places with wider access than the handler (issue 16).

``opened_values`` lists the plaintext a decryption produced (by comparing the body as received,
with its envelopes, to the body handed to the handler); ``mask_values`` replaces each of them
in a text. A handler that writes the value to its own log is beyond reach; one that quotes it
in an exception (``ValueError(f"bad tax id {tax_id}")``) no longer leaks it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from rmqkit.crypto.envelope import is_envelope

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


__all__ = ["MASK", "mask_values", "opened_values"]

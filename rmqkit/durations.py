"""Durations as topology files and flags spell them (``500ms``, ``5s``, ``2m``, ``1h``), and
ages as rmqkit shows them (``age_text``: ``2.5h``, ``1.0d``).

A duration must be above zero (``parse_duration_ms``), except a delay: there every spelling of
zero (``0s``, ``0m``, ``0.0s``, ``00ms``, ``0``) means "no delay" (``parse_delay_ms``).
"""

from __future__ import annotations

import re

_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*$")
# Zero in any unit (or none): a number of zeros, optionally with a fraction of zeros. No sign
# ("-0s" is refused as any negative duration is) and no exponent (as for every duration).
_ZERO = re.compile(r"^\s*0+(?:\.0+)?\s*(?:ms|s|m|h)?\s*$")
_NEGATIVE = re.compile(r"^\s*-\s*\d")


def parse_duration_ms(text: str) -> int:
    """Parse ``text`` into whole milliseconds; raises ValueError with a hint otherwise."""
    match = _DURATION.match(text) if isinstance(text, str) else None
    if match is None and isinstance(text, str) and _NEGATIVE.match(text):
        raise ValueError(f"bad duration {text!r}: must not be negative")
    if match is None:
        raise ValueError(
            f"bad duration {text!r}: use a number with ms, s, m or h (e.g. 500ms, 5s, 2m, 1h)"
        )
    value = float(match.group(1)) * _UNITS_MS[match.group(2)]
    if value != int(value):
        raise ValueError(f"bad duration {text!r}: below one millisecond")
    if value <= 0:
        raise ValueError(f"bad duration {text!r}: must be greater than zero")
    return int(value)


def is_zero_duration(text: str) -> bool:
    """Whether ``text`` spells zero (``0s``, ``0m``, ``0.0s``, ``00ms``, ``0``, spaces around)."""
    return isinstance(text, str) and _ZERO.match(text) is not None


def parse_delay_ms(text: str) -> int:
    """A delay in whole milliseconds: 0 for any spelling of zero (no delay), else as
    ``parse_duration_ms`` (negative, garbage or below one millisecond: ValueError)."""
    return 0 if is_zero_duration(text) else parse_duration_ms(text)


def format_duration_ms(ms: int) -> str:
    """The shortest exact spelling of ``ms``: 1000 → ``1s``, 120000 → ``2m``, 1500 → ``1500ms``.

    Queue names are built from it, so it must be stable and round-trip through parsing.
    """
    for unit in ("h", "m", "s"):
        size = _UNITS_MS[unit]
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def age_text(seconds: float | None) -> str:
    """An age as rmqkit shows it: ``2.5h``, ``1.0d``, ``42s``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"

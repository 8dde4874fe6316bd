"""Field paths into a JSON body, and the shapes a body may have around them.

A path is dotted names into nested objects (``customer.name``); ``[]`` after a name steps into
every item of the list it holds (``items[].card``, nested ``orders[].lines[].sku``), and a path
starting with ``[]`` steps into a body that is itself a list (``[].tax_id``). A name cannot
contain ``.``, ``[`` or ``]``.

``shape_problem`` is what keeps a sensitive value from leaving in plaintext because the body is
not shaped as the path says: a list where an object was expected (or the reverse), a scalar
where an object or list was expected, a flattened ``"customer.name"`` key. Missing fields,
``null`` and empty objects or lists hold nothing and are fine; any other shape that could hold
the field and is not understood is refused by the caller (a DataError, exit 65), never skipped.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import lru_cache
from typing import Any

ITEMS = "[]"  # a path step: every item of a list
_BRACKETS = frozenset("[]")


@lru_cache(maxsize=4096)
def parse_path(path: str) -> tuple[str, ...]:
    """``"customer.name"`` → ``("customer", "name")``; ``"items[].card"`` → ``("items", "[]",
    "card")``; ``"[].id"`` → ``("[]", "id")``. ValueError for an empty name, a misplaced
    bracket or a bare ``[]`` after the first step."""
    if not path:
        raise ValueError("bad field path '': dotted names like customer.name or items[].card")
    parts: list[str] = []
    for segment in path.split("."):
        name, lists = segment, 0
        while name.endswith(ITEMS):
            name, lists = name[:-2], lists + 1
        if _BRACKETS & set(name):
            raise ValueError(f"bad field path {path!r}: [] goes right after a name (items[].card)")
        if name:
            parts.append(name)
        elif not lists or parts:  # only a path's first step may be a bare [] (a list body)
            raise ValueError(
                f"bad field path {path!r}: dotted names like customer.name or items[].card"
            )
        parts.extend([ITEMS] * lists)
    return tuple(parts)


def has_items(path: str) -> bool:
    """Whether ``path`` steps into list items."""
    return ITEMS in parse_path(path)


def join(parts: Sequence[str]) -> str:
    """The inverse of ``parse_path``: ``("items", "[]", "card")`` → ``"items[].card"``."""
    text = ""
    for part in parts:
        text += part if part == ITEMS or not text else "." + part
    return text


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "true/false"
    return "a number"


def _where(trail: str) -> str:
    return trail or "the body"


def _empty(value: Any) -> bool:
    return value is None or value == {} or value == []


def _shown(key: str) -> str:
    """A body's key as it may appear in a one-line message (keys are anyone's text)."""
    text = key if key.isprintable() else repr(key)
    return text if len(text) <= 80 else text[:80] + "…"


def shape_problem(body: Any, path: str) -> str | None:
    """Why ``body`` (parsed JSON) could hold the field ``path`` somewhere the path does not
    reach, or None. Names the path and where, never a value."""
    return _shape(body, parse_path(path), path, "")


def _shape(node: Any, parts: tuple[str, ...], path: str, trail: str) -> str | None:
    if not parts or _empty(node):
        return None
    step, rest = parts[0], parts[1:]
    if step == ITEMS:
        if not isinstance(node, list):
            return (
                f"field {path}: {_where(trail)} is {_kind(node)} where the path expects a "
                "list — refused, it could hold the field in plaintext"
            )
        for i, item in enumerate(node):
            problem = _shape(item, rest, path, f"{trail}[{i}]")
            if problem is not None:
                return problem
        return None
    if not isinstance(node, dict):
        hint = f" (for a list of objects name the field {join((*_pattern(trail), ITEMS, *parts))})"
        return (
            f"field {path}: {_where(trail)} is {_kind(node)} where the path expects an object"
            f"{hint if isinstance(node, list) else ''} — refused, it could hold the field in "
            "plaintext"
        )
    for key in node:
        if isinstance(key, str) and key != step and key.startswith((step + ".", step + "[")):
            return (
                f"field {path}: {_where(trail)} has the key {_shown(key)!r}, the field's "
                "path flattened into one key — refused, it would leave in plaintext; nest it "
                "as the path says"
            )
    if step not in node:
        return None
    trail = f"{trail}.{step}" if trail else step
    return _shape(node[step], rest, path, trail)


def _pattern(trail: str) -> tuple[str, ...]:
    """A trail (``items[0].a``) as the parts of its path's pattern (``items[].a``)."""
    out: list[str] = []
    for segment in filter(None, trail.split(".")):
        name = segment.split("[", 1)[0]
        if name:
            out.append(name)
        out.extend([ITEMS] * segment.count("["))
    return tuple(out)


def leaves(body: Any, path: str) -> Iterator[Any]:
    """Every value at ``path`` in a parsed body (each list item's, for ``[]`` steps); nothing
    for a missing field or a body of another shape (``shape_problem`` says which)."""
    yield from _leaves(body, parse_path(path))


def _leaves(node: Any, parts: tuple[str, ...]) -> Iterator[Any]:
    if not parts:
        yield node
        return
    step, rest = parts[0], parts[1:]
    if step == ITEMS:
        if isinstance(node, list):
            for item in node:
                yield from _leaves(item, rest)
    elif isinstance(node, dict) and step in node:
        yield from _leaves(node[step], rest)


__all__ = ["ITEMS", "has_items", "join", "leaves", "parse_path", "shape_problem"]

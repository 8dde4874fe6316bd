"""Block-style YAML for the manifests `rmqkit deploy k8s` prints, with comments.

PyYAML is a development dependency only, and its emitter cannot write comments, which is where
the manifests explain their numbers (the termination grace, the queues KEDA counts). The
subset written here is small: mappings, sequences, strings, integers, booleans and None.
Every string that could read as anything else (``yes``, ``10001``, ``1:20``, ``null``, a
leading ``@``, a ``: `` inside) is double-quoted with every character YAML 1.1 or 1.2 could
take for a line break or control escaped, so the text reads back as exactly the data it was
made from (tests/unit/test_deploy.py checks that with PyYAML on arbitrary strings).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

Scalar: TypeAlias = str | int | bool | None


@dataclass(frozen=True)
class Commented:
    """``value`` with a comment written on the line(s) before its key (or list item)."""

    value: Node
    comment: str


Node: TypeAlias = Scalar | Mapping[str, "Node"] | Sequence["Node"] | Commented

INDENT = "  "

# A plain (unquoted) scalar: starts with a letter or '/', and holds nothing YAML reads as
# syntax. Starting with a letter rules out numbers, timestamps and sexagesimals (YAML 1.1).
_PLAIN = re.compile(r"[A-Za-z/][A-Za-z0-9._/-]*")
# What YAML 1.1 (yes/no/on/off/y/n) or 1.2 reads as a boolean or null when unquoted.
_RESERVED = frozenset({"y", "n", "yes", "no", "on", "off", "true", "false", "null"})
_ESCAPES = {
    "\\": "\\\\",
    '"': '\\"',
    "\0": "\\0",
    "\a": "\\a",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\v": "\\v",
    "\f": "\\f",
    "\r": "\\r",
    "\x1b": "\\e",
    "\x85": "\\N",  # NEL, LS and PS are line breaks in YAML 1.1: never raw
    "\u2028": "\\L",
    "\u2029": "\\P",
}


def _needs_escape(char: str) -> bool:
    code = ord(char)
    return (
        code < 0x20
        or 0x7F <= code <= 0x9F
        or code in (0x2028, 0x2029, 0xFEFF, 0xFFFE, 0xFFFF)
        or 0xD800 <= code <= 0xDFFF
    )


def quoted(text: str) -> str:
    """``text`` as a YAML double-quoted scalar (also valid JSON for ASCII text)."""
    out = []
    for char in text:
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif _needs_escape(char):
            code = ord(char)
            out.append(f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def scalar(value: Scalar) -> str:
    """One scalar on one line: plain when nothing could misread it, else double-quoted."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if _PLAIN.fullmatch(value) and value.lower() not in _RESERVED:
        return value
    return quoted(value)


def _literal(text: str, indent: str) -> list[str] | None:
    """``text`` as a literal block scalar (``|``) at ``indent``: the header and the lines.
    None where a block would not read back exactly (an escape needed, a lone line) and the
    caller quotes it instead."""
    if "\n" not in text.rstrip("\n") or any(_needs_escape(c) and c != "\n" for c in text):
        return None
    body = text.rstrip("\n")
    trailing = len(text) - len(body)
    chomp = "-" if trailing == 0 else ("" if trailing == 1 else "+")
    lines = body.split("\n")
    if not any(line.strip() for line in lines):
        return None
    # The content's indentation is read from its first non-empty line: one that starts with a
    # space would shift it, so the indentation is then given explicitly.
    first = next(line for line in lines if line.strip())
    explicit = str(len(INDENT)) if first[0] == " " or not lines[0].strip() else ""
    out = [f"|{explicit}{chomp}"]
    out += [f"{indent}{line}" if line else "" for line in lines]
    out += [""] * (trailing - 1)
    return out


def _comment(text: str, indent: str) -> list[str]:
    """``text`` as comment lines. A comment may quote a path or a queue name: a character
    that YAML (or a terminal) takes for a line break or control is shown escaped, so nothing
    in it can end the comment and start content."""
    lines = []
    for line in text.split("\n"):
        shown = "".join(quoted(c)[1:-1] if _needs_escape(c) else c for c in line)
        lines.append(f"{indent}# {shown}".rstrip())
    return lines


def _key(key: str) -> str:
    return scalar(key)


def _block(node: Node, indent: str) -> list[str]:
    """The lines of a mapping or sequence ``node`` at ``indent``."""
    lines: list[str] = []
    if isinstance(node, Mapping):
        for key, value in node.items():
            if isinstance(value, Commented):
                lines += _comment(value.comment, indent)
                value = value.value
            lines += _entry(f"{indent}{_key(key)}:", value, indent)
        return lines
    assert isinstance(node, Sequence) and not isinstance(node, str)
    for item in node:
        if isinstance(item, Commented):
            lines += _comment(item.comment, indent)
            item = item.value
        if isinstance(item, Mapping) and item:
            nested = _block(item, indent + INDENT)
            # the first key goes on the dash's line, a comment above it before the dash
            head = 0
            while nested[head].lstrip().startswith("#"):
                lines.append(indent + nested[head].removeprefix(indent + INDENT))
                head += 1
            lines.append(f"{indent}- {nested[head].removeprefix(indent + INDENT)}")
            lines += nested[head + 1 :]
        else:
            lines += _entry(f"{indent}-", item, indent)
    return lines


def _entry(head: str, value: Node, indent: str) -> list[str]:
    """``head`` (``key:`` or ``-``) followed by ``value``: inline, a block below, or a
    literal block scalar."""
    if isinstance(value, Commented):  # a comment on a nested value: on its own lines
        return [*_comment(value.comment, indent + INDENT), *_entry(head, value.value, indent)]
    if isinstance(value, Mapping):
        if not value:
            return [f"{head} {{}}"]
        return [head, *_block(value, indent + INDENT)]
    if isinstance(value, Sequence) and not isinstance(value, str):
        if not value:
            return [f"{head} []"]
        return [head, *_block(value, indent + INDENT)]
    if isinstance(value, str):
        literal = _literal(value, indent + INDENT)
        if literal is not None:
            return [f"{head} {literal[0]}", *literal[1:]]
    return [f"{head} {scalar(value)}"]


def document(node: Mapping[str, Node], comment: str | None = None) -> str:
    """One YAML document (``---`` first), ``comment`` above it."""
    lines = ["---"]
    if comment:
        lines += _comment(comment, "")
    lines += _block(node, "") if node else ["{}"]
    return "\n".join(lines) + "\n"


def documents(docs: Sequence[tuple[Mapping[str, Node], str | None]]) -> str:
    """A multi-document YAML stream: each ``(mapping, comment)`` as ``document`` writes it."""
    return "".join(document(node, comment) for node, comment in docs)


def plain_data(node: Node) -> object:
    """``node`` without its comments: the data the YAML text reads back as."""
    if isinstance(node, Commented):
        return plain_data(node.value)
    if isinstance(node, Mapping):
        return {key: plain_data(value) for key, value in node.items()}
    if isinstance(node, Sequence) and not isinstance(node, str):
        return [plain_data(item) for item in node]
    return node

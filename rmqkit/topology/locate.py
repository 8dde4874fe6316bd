"""Where an error in a topology file is: its TOML key path and line, for messages that name both."""

from __future__ import annotations

import re
from typing import Any


def key_path(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as a TOML key path.

    ``('queues', 'orders.work', 'retry_delays', 1)`` → ``queues."orders.work".retry_delays[1]``.
    """
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            seg = part if re.fullmatch(r"[A-Za-z0-9_-]+", part) else f'"{part}"'
            out += ("." if out else "") + seg
    return out


def find_line(text: str, loc: tuple[int | str, ...]) -> int | None:
    """Best-effort line of the key at ``loc`` (1-based): walk the segments down the file."""
    lines = text.splitlines()
    start, found = 0, None
    for part in loc:
        if isinstance(part, int):
            continue
        pattern = re.compile(
            r"(^|[\[.{,\s])(" + re.escape(part) + r'|"' + re.escape(part) + r'")\s*(=|\]|\.)'
        )
        for index in range(start, len(lines)):
            if pattern.search(lines[index].split("#", 1)[0]):
                start, found = index, index + 1
                break
    return found


def pydantic_message(error: Any) -> str:
    msg = str(error["msg"])
    if error["type"] == "extra_forbidden":
        return "unknown key (check the spelling; see docs/topology.md for the keys)"
    return msg.removeprefix("Value error, ")


__all__ = ["find_line", "key_path", "pydantic_message"]

"""Where things are in topology files: which file declares a queue (``locate_topology``), and
where an error in one is (its TOML key path and line, for messages that name both)."""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rmqkit.errors import ConfigError, TopologyFileError

if TYPE_CHECKING:
    from rmqkit.topology.model import Topology

ENV_TOPOLOGY = "RMQKIT_TOPOLOGY"
PROJECT_FILE = "rmqkit.toml"
TOPOLOGY_DIR = "topologies"


@dataclass(frozen=True)
class Located:
    """The topology file that declares a queue, and how it was found (for the start log)."""

    topology: Topology
    path: Path
    found_via: str  # "RMQKIT_TOPOLOGY", "rmqkit.toml" or "topologies/x.toml"


def locate_topology(
    queue: str, project_dir: Path, environ: Mapping[str, str] | None = None
) -> Located | None:
    """The topology file declaring work queue ``queue``: ``$RMQKIT_TOPOLOGY``, else the files
    ``rmqkit.toml`` (in ``project_dir``) names in ``topologies = [...]``, else the
    ``topologies/*.toml`` of ``project_dir`` that declare it. None: no file declares it.

    ConfigError (78): ``RMQKIT_TOPOLOGY`` names no file, ``rmqkit.toml`` is malformed or names a
    file outside ``project_dir`` or one that does not exist, or several files declare the queue
    (which one is meant is not guessed). TopologyFileError (65): a file searched is malformed
    (file:line) — a broken file could be the one that declares the queue."""
    from rmqkit.topology.model import load_topology

    env = os.environ if environ is None else environ
    named = env.get(ENV_TOPOLOGY, "")
    if named:
        path = Path(named)
        if not path.is_file():
            raise ConfigError(
                f"{ENV_TOPOLOGY}={named} is not a file — point it at the topology file that "
                f"declares {queue!r}, or unset it"
            )
        topology = load_topology(path)
        _require_queue(topology, queue, f"{ENV_TOPOLOGY}={named}")
        return Located(topology, path, ENV_TOPOLOGY)
    project = project_dir / PROJECT_FILE
    if project.is_file():
        found = _declaring(queue, _project_files(project, project_dir), load_topology)
        if found:
            return Located(found[1], found[0], PROJECT_FILE)
    directory = project_dir / TOPOLOGY_DIR
    try:
        candidates = sorted(directory.glob("*.toml")) if directory.is_dir() else []
    except OSError:  # a symlink loop or an unreadable directory: nothing found there
        candidates = []
    found = _declaring(queue, candidates, load_topology)
    if found:
        return Located(found[1], found[0], f"{TOPOLOGY_DIR}/{found[0].name}")
    return None


def _project_files(project: Path, project_dir: Path) -> list[Path]:
    """The topology files ``rmqkit.toml`` names, each inside ``project_dir``."""
    try:
        data = tomllib.loads(project.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{project}: cannot be read: {exc} — fix or remove it") from None
    names = data.get("topologies", [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ConfigError(
            f'{project}: topologies must be a list of file names (topologies = ["topologies/'
            'orders.toml"])'
        )
    root = project_dir.resolve()
    files: list[Path] = []
    for name in names:
        path = project_dir / name
        try:
            real = path.resolve(strict=True)
        except (OSError, RuntimeError):
            raise ConfigError(
                f"{project}: names {name!r}, which does not exist (or is a symlink loop) — "
                "fix the name or remove it from topologies"
            ) from None
        if not real.is_relative_to(root):
            raise ConfigError(
                f"{project}: names {name!r}, which is outside the project directory {root} — "
                "topology files are read only from inside it; copy it in or set "
                f"{ENV_TOPOLOGY}"
            )
        if real not in {p.resolve() for p in files}:
            files.append(path)
    return files


def _declaring(queue: str, paths: list[Path], load: Any) -> tuple[Path, Topology] | None:
    """The one file of ``paths`` declaring ``queue``; ConfigError naming them if several do."""
    hits: list[tuple[Path, Topology]] = []
    seen: set[Path] = set()
    for path in paths:
        try:
            real = path.resolve(strict=True)
        except (OSError, RuntimeError):  # a dangling symlink or a loop
            raise TopologyFileError(
                str(path), "cannot be read (dangling symlink or loop)"
            ) from None
        if real in seen:
            continue
        seen.add(real)
        topology = load(path)
        if _declares(topology, queue):
            hits.append((path, topology))
    if len(hits) > 1:
        names = ", ".join(str(p) for p, _ in hits)
        raise ConfigError(
            f"several topology files declare queue {queue!r}: {names} — pass the one meant "
            f"with --topology (or {ENV_TOPOLOGY}), or declare the queue in one file only"
        )
    return hits[0] if hits else None


def _declares(topology: Topology, queue: str) -> bool:
    try:
        topology.queue_spec(queue)
    except KeyError:
        return False
    return True


def _require_queue(topology: Topology, queue: str, where: str) -> None:
    if not _declares(topology, queue):
        known = ", ".join(topology.work_queue_names()) or "none"
        raise ConfigError(
            f"{where} does not declare queue {queue!r} (work queues in it: {known}) — point "
            "it at the file that does, or unset it"
        )


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


__all__ = ["Located", "find_line", "key_path", "locate_topology", "pydantic_message"]

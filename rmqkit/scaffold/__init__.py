"""`rmqkit init`: a starting point in a directory — a topology, a handler with a model, its
unit test (rmqkit.testing) and a README snippet, from the templates beside this module."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template

from rmqkit.errors import OutputError, UsageError

__all__ = ["ScaffoldFile", "scaffold_files", "write_scaffold"]

_NAME = re.compile(r"[a-z][a-z0-9_]{0,40}")


@dataclass(frozen=True)
class ScaffoldFile:
    """One file ``rmqkit init`` writes: its path relative to the target and its text."""

    path: Path
    text: str


def scaffold_files(name: str) -> list[ScaffoldFile]:
    """The files of a scaffold for topology ``name`` (also the exchange; the work queue is
    ``<name>.work``, the handler module ``<name>_handlers``). UsageError (64) for a name that
    cannot be a Python module name."""
    if not _NAME.fullmatch(name):
        raise UsageError(
            f"--name {name!r}: use lower-case letters, digits and _ (starting with a letter): "
            "it names the exchange, the queue and the handler module"
        )
    module = f"{name}_handlers"
    values = {"name": name, "module": module}
    plan = [
        ("topology.toml.tmpl", Path("topologies") / f"{name}.toml"),
        ("handler.py.tmpl", Path(f"{module}.py")),
        ("test_handler.py.tmpl", Path(f"test_{module}.py")),
        ("README.tmpl", Path(f"README.{name}.md")),
    ]
    templates = resources.files(__package__) / "templates"
    return [
        ScaffoldFile(target, Template((templates / src).read_text("utf-8")).substitute(values))
        for src, target in plan
    ]


def write_scaffold(directory: Path, name: str) -> list[Path]:
    """Write the scaffold into ``directory``; returns the paths written.

    Writes nothing and raises UsageError (64) if any of the files already exists — a dangling
    symlink counts as existing, and is never followed. Each file is created exclusively
    (O_EXCL | O_NOFOLLOW), so a file appearing meanwhile is not overwritten either."""
    files = scaffold_files(name)
    taken = [f.path for f in files if os.path.lexists(directory / f.path)]
    topo_dir = directory / "topologies"
    if os.path.lexists(topo_dir) and not (topo_dir.is_dir() and not topo_dir.is_symlink()):
        taken.insert(0, Path("topologies"))
    if taken:
        raise UsageError(
            f"{', '.join(str(p) for p in taken)} already exist(s) in {directory} — nothing was "
            "written; run rmqkit init in an empty directory, or pick another --name"
        )
    topo_dir.mkdir(exist_ok=True)
    written: list[Path] = []
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    for one in files:
        path = directory / one.path
        try:
            fd = os.open(path, flags, 0o644)
        except FileExistsError:
            raise UsageError(f"{path} appeared while writing — not overwritten") from None
        except OSError as exc:
            raise OutputError(f"{path}: cannot be written: {exc}") from None
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(one.text)
        written.append(path)
    return written

"""CLI start-up time (issue 14): median of N runs of `--help` commands, two trees side by side.

    .venv/bin/python bench/startup.py --old 19871ec        # this tree against a commit
    .venv/bin/python bench/startup.py --old-tree /tmp/old   # ... or an existing checkout

Each tree runs as ``python -m rmqkit`` with its own root first on ``sys.path`` (cwd and
PYTHONPATH), so both use this virtualenv's libraries and only rmqkit's code differs. Runs of the
two trees alternate, so load on the machine affects both alike. With ``--old COMMIT`` a
temporary git worktree is made and removed afterwards.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = (("--help",), ("status", "--help"), ("parking", "list", "--help"))


def one_run(tree: Path, args: tuple[str, ...]) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RMQKIT_")}
    env["PYTHONPATH"] = str(tree)
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "rmqkit", *args],
        cwd=tree,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
    )
    return time.perf_counter() - started


def measure(trees: dict[str, Path], runs: int) -> dict[str, dict[str, float]]:
    """Median seconds per tree and command."""
    samples: dict[str, dict[str, list[float]]] = {
        label: {" ".join(c): [] for c in COMMANDS} for label in trees
    }
    for _ in range(runs):
        for command in COMMANDS:
            for label, tree in trees.items():
                samples[label][" ".join(command)].append(one_run(tree, command))
    return {
        label: {cmd: statistics.median(times) for cmd, times in per.items()}
        for label, per in samples.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", help="a commit to compare with (a temporary worktree)")
    parser.add_argument("--old-tree", type=Path, help="an existing checkout to compare with")
    parser.add_argument("--runs", type=int, default=10)
    options = parser.parse_args()
    trees = {"this tree": ROOT}
    with tempfile.TemporaryDirectory() as scratch:
        worktree = Path(scratch) / "old"
        if options.old:
            subprocess.run(
                [
                    "git",
                    "-C",
                    str(ROOT),
                    "worktree",
                    "add",
                    "-q",
                    "--detach",
                    str(worktree),
                    options.old,
                ],
                check=True,
            )
            trees = {f"old {options.old}": worktree, **trees}
        elif options.old_tree:
            trees = {f"old {options.old_tree}": options.old_tree, **trees}
        try:
            result = measure(trees, options.runs)
        finally:
            if options.old:
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)],
                    check=False,
                )
    print(f"median of {options.runs} runs, seconds (python -m rmqkit ...)")
    print("command".ljust(24) + "".join(label.rjust(22) for label in result))
    for command in COMMANDS:
        key = " ".join(command)
        print(key.ljust(24) + "".join(f"{result[label][key]:22.3f}" for label in result))


if __name__ == "__main__":
    main()

"""`rmqkit --help` imports no command module (issue 14: start-up 0.8-1.1 s, most of it spent
importing every command's libraries to print the command list); the list it prints is the
commands' own help. On 19871ec every command module was imported."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rmqkit.cli.main import Commands

PROBE = """
import json, sys
from rmqkit.cli.main import main
code = main(sys.argv[1:])
print(json.dumps([code, sorted(m for m in sys.modules if m.startswith("rmqkit."))]))
"""


def _imported(*args: str) -> tuple[int, set[str]]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, check=True
    )
    code, modules = json.loads(done.stdout.splitlines()[-1])
    return int(code), set(modules)


def test_help_imports_no_command_module() -> None:
    code, modules = _imported("--help")
    assert code == 0
    heavy = {
        "rmqkit.cli.status",
        "rmqkit.cli.parking_inspect",
        "rmqkit.cli.doctor",
        "rmqkit.cli.topology",
        "rmqkit.health.status",
        "rmqkit.topology.apply",
        "rmqkit.parking.browse",
    }
    assert not modules & heavy, sorted(modules & heavy)


def test_a_command_imports_only_what_it_needs() -> None:
    code, modules = _imported("status", "--help")
    assert code == 0 and "rmqkit.cli.status" in modules
    assert "rmqkit.cli.parking_inspect" not in modules and "rmqkit.cli.doctor" not in modules


@pytest.mark.parametrize("lazy", Commands.LAZY, ids=lambda c: c.name)
def test_the_listed_help_is_the_commands_own(lazy: object) -> None:
    from rmqkit.cli.lazy import LazyCommand, first_paragraph

    assert isinstance(lazy, LazyCommand)
    summary = lazy.summary()
    assert summary, lazy
    assert summary == first_paragraph(lazy.load().help)
    assert "\n" not in summary  # one line in the command list, however the docstring wraps


def test_a_mistyped_command_still_gets_a_suggestion() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rmqkit", "stauts"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 64
    assert "Did you mean 'status'?" in done.stderr

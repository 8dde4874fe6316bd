"""CLI conventions an on-call engineer expects (issue 14), through the real entry point.

Usage errors exit 64 (sysexits' EX_USAGE) with one stderr line: click's own (unknown command or
option, missing argument, bad choice, an option without its value) and rmqkit's ``UsageError``.
Exit 2 stays "changes pending" (`plan`) and "critical" (checks). Before this change they
exited 2 with click's multi-line usage box, and `rmqkit` with no arguments exited 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer

from rmqkit.cli.main import app

USAGE_ERRORS = {
    "no such command": ["stauts"],
    "no such subcommand": ["parking", "lsit"],
    "unknown option": ["plan", "--no-such-flag"],
    "missing argument": ["publish"],
    "missing option": ["dedupe", "status"],
    "bad choice": ["declare", "x.toml", "--via", "nope"],
    "option without its value": ["parking", "list", "--reason"],
    "bad value (rmqkit's UsageError)": ["parking", "list", "q.parking", "--reason", "exhaustd"],
    "bad duration (rmqkit's UsageError)": ["dedupe", "prune", "--dsn", "x", "--older-than", "7x"],
}


def environment(**extra: str) -> dict[str, str]:
    """This process's environment without RMQKIT_* (PYTHONPATH kept: tests of older code)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RMQKIT_")}
    env["RMQKIT_URL"] = "amqp://guest:guest@127.0.0.1:1/"  # nothing listens: never reached
    return {**env, **extra}


def start(
    args: list[str], env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.Popen[str]:
    """`python -m rmqkit ARGS` from a neutral directory (no .env, and the checkout on the path
    only through the installed package or PYTHONPATH), stdin not a terminal (a pipe given
    ``stdin``, else /dev/null)."""
    return subprocess.Popen(
        [sys.executable, "-m", "rmqkit", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
        text=True,
        env=env or environment(),
        cwd="/",
    )


def _run_all(cases: dict[str, list[str]]) -> dict[str, subprocess.CompletedProcess[str]]:
    """Run the cases side by side (each is a fresh interpreter: the real exit code)."""
    started = {name: start(args) for name, args in cases.items()}
    done = {}
    for name, process in started.items():
        out, err = process.communicate(timeout=60)
        done[name] = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    return done


def test_usage_errors_exit_64_with_one_stderr_line() -> None:
    for name, result in _run_all(USAGE_ERRORS).items():
        lines = result.stderr.splitlines()
        assert result.returncode == 64, (name, result.returncode, result.stderr)
        assert len(lines) == 1 and lines[0].startswith("rmqkit: error: "), (name, lines)
        assert result.stdout == "", (name, result.stdout)


def test_click_usage_errors_name_the_help_of_their_command() -> None:
    cases = {k: USAGE_ERRORS[k] for k in ("no such command", "unknown option", "bad choice")}
    cases["option without its value"] = USAGE_ERRORS["option without its value"]
    done = _run_all(cases)
    assert done["no such command"].stderr == (
        "rmqkit: error: No such command 'stauts'. Did you mean 'status'? (see 'rmqkit --help')\n"
    )
    assert done["unknown option"].stderr.rstrip().endswith("(see 'rmqkit plan --help')")
    assert done["bad choice"].stderr == (
        "rmqkit: error: Invalid value for '--via': 'nope' is not one of 'policy', 'arguments'. "
        "(see 'rmqkit declare --help')\n"
    )
    assert (
        done["option without its value"]
        .stderr.rstrip()
        .endswith("(see 'rmqkit parking list --help')")
    )


@pytest.mark.parametrize("args", [[], ["--help"], ["parking"], ["parking", "--help"], ["dedupe"]])
def test_help_exits_0_on_stdout(args: list[str]) -> None:
    result = _run_all({"help": args})["help"]
    assert result.returncode == 0, result.stderr
    assert "Usage" in result.stdout and result.stderr == ""


def every_command() -> list[tuple[str, Any]]:
    """(path, click command) of the root and every command, lazy ones loaded (groups walked)."""
    root = typer.main.get_command(app)
    found: list[tuple[str, Any]] = [("rmqkit", root)]

    def walk(path: str, group: Any, ctx: typer.Context) -> None:
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            if isinstance(getattr(command, "commands", None), dict):
                walk(f"{path} {name}", command, typer.Context(command, ctx, info_name=name))
            else:
                found.append((f"{path} {name}", command))

    walk("rmqkit", root, typer.Context(root, info_name="rmqkit"))
    return found


def test_every_command_takes_vhost() -> None:
    """`--vhost` on every command's own --help, as rabbitmqadmin v2 has it (the global option
    repeated on each command); before, only `export` had one."""
    commands = every_command()
    assert len(commands) > 20, commands
    for path, command in commands:
        flags = {flag for param in command.params for flag in getattr(param, "opts", [])}
        assert "--vhost" in flags, path


# Owned by other helpers at the time of writing (issue 14): reported, not fixed here.
HELP_MISSING_ELSEWHERE: set[tuple[str, str]] = set()


def test_every_option_and_argument_has_help() -> None:
    """Each parameter of each command (lazy ones loaded) says what it does in --help."""
    missing = {
        (path, param.opts[0])
        for path, command in every_command()
        for param in command.params
        if not (getattr(param, "help", None) or "").strip()
    }
    assert missing <= HELP_MISSING_ELSEWHERE, sorted(missing - HELP_MISSING_ELSEWHERE)


RMQKIT_SCRIPT = Path(sys.executable).parent / "rmqkit"  # the console script pip installed


def _complete(words: str, **env: str) -> subprocess.CompletedProcess[str]:
    cword = str(len(words.split()) - 1)
    return subprocess.run(
        [str(RMQKIT_SCRIPT)],
        capture_output=True,
        text=True,
        check=False,
        cwd="/",
        env=environment(COMP_WORDS=words, COMP_CWORD=cword, **env),
    )


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_prints_the_script(shell: str) -> None:
    done = subprocess.run(
        [str(RMQKIT_SCRIPT), "completion", shell], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert f"_RMQKIT_COMPLETE=complete_{shell}" in done.stdout
    if shell == "bash":
        assert "complete -o default -F _rmqkit_completion rmqkit" in done.stdout


def test_completion_answers_from_the_lazy_group() -> None:
    """Click's instruction spelling (bash_complete) and typer's (complete_bash, which the
    scripts send) both work; command names complete, and so do a lazy command's options."""
    for instruction in ("bash_complete", "complete_bash"):
        done = _complete("rmqkit par", _RMQKIT_COMPLETE=instruction)
        assert (done.returncode, done.stdout, done.stderr) == (0, "parking\n", ""), instruction
    assert _complete("rmqkit parking li", _RMQKIT_COMPLETE="bash_complete").stdout == "list\n"
    options = _complete("rmqkit parking list --vh", _RMQKIT_COMPLETE="bash_complete")
    assert options.stdout == "--vhost\n"


def test_completing_a_command_name_imports_no_command_module() -> None:
    probe = (
        "import json, sys\n"
        "from rmqkit.cli.main import main\n"
        "main([])\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('rmqkit.cli.'))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
        env=environment(COMP_WORDS="rmqkit ", COMP_CWORD="1", _RMQKIT_COMPLETE="bash_complete"),
    )
    *names, modules = done.stdout.splitlines()
    assert {"parking", "status", "doctor", "completion"} <= set(names)
    assert set(json.loads(modules)) <= {
        "rmqkit.cli.main",
        "rmqkit.cli.lazy",
        "rmqkit.cli.completion",
        "rmqkit.cli.clickcompat",  # where click lives (typer._click or click): no command
    }

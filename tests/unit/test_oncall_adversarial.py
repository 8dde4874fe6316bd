"""Adversarial on-call checks of the CLI's settings and errors (issue 14), no broker needed.

Found by using rmqkit as a tired on-call engineer would, from README.md, docs/exit-codes.md and
docs/runbooks/ alone: a mistyped URL, an unset shell variable. Each test for a finding
failed on the code before its fix (the H9 report's numbers).
Promised: "Passwords never appear in output or errors" (README, Settings); "Errors print exactly
one line on stderr ... only exit 1 (a bug) prints a traceback" and 78 "RMQKIT_URL is not an AMQP
URL" (docs/exit-codes.md).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SECRET = "s3cr3tPw"


def rmqkit(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The real entry point in a subprocess, with no RMQKIT_* but what ``env`` gives."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("RMQKIT_")}
    return subprocess.run(
        [sys.executable, "-m", "rmqkit", *args],
        capture_output=True,
        text=True,
        env={**base, **env},
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
    )


# A URL with one typo, as typed at 3 a.m.: the password must still be masked in the error.
MISTYPED_URLS = {
    "missing colon after the scheme": f"amqp//ops:{SECRET}@rabbit-1:5672/orders",
    "one slash after the scheme": f"amqp:/ops:{SECRET}@rabbit-1:5672/orders",
    "no scheme": f"ops:{SECRET}@rabbit-1:5672",
}


@pytest.mark.parametrize("url", MISTYPED_URLS.values(), ids=MISTYPED_URLS.keys())
def test_a_mistyped_url_never_prints_its_password(url: str) -> None:
    result = rmqkit("config", RMQKIT_URL=url)
    assert result.returncode == 78, result.stderr
    assert SECRET not in result.stdout + result.stderr


def test_a_mistyped_url_flag_never_prints_its_password() -> None:
    result = rmqkit(
        "--url",
        f"amqp//ops:{SECRET}@rabbit-1:5672/orders",
        "config",
        RMQKIT_URL="amqp://guest:guest@127.0.0.1:1/",
    )
    assert result.returncode == 64, result.stderr  # the command line is wrong: a usage error
    assert SECRET not in result.stdout + result.stderr


def test_a_mistyped_cluster_entry_never_prints_its_password() -> None:
    url = f"amqp://ops:{SECRET}@127.0.0.1:1/orders, amqp//ops:{SECRET}@127.0.0.1:2/orders"
    result = rmqkit("config", RMQKIT_URL=url)
    assert result.returncode == 78, result.stderr
    assert SECRET not in result.stdout + result.stderr


def test_a_bad_url_error_reads_as_rmqkit_not_pydantic() -> None:
    result = rmqkit("config", RMQKIT_URL="http://guest:guest@127.0.0.1:1/")
    assert result.returncode == 78, result.stderr
    assert "Value error" not in result.stderr, result.stderr


def test_a_mistyped_management_url_is_bad_configuration_and_masked() -> None:
    result = rmqkit(
        "status",
        RMQKIT_URL="amqp://guest:guest@127.0.0.1:1/",
        RMQKIT_MANAGEMENT_URL=f"http//admin:{SECRET}@127.0.0.1:1",
    )
    assert SECRET not in result.stdout + result.stderr, result.stderr
    assert result.returncode == 78, result.stderr  # bad configuration, not "unreachable"


BAD_PORTS = {
    "config, RMQKIT_URL port not a number": (
        ("config",),
        {"RMQKIT_URL": f"amqp://guest:{SECRET}@127.0.0.1:5672x/"},
    ),
    "parking list, RMQKIT_URL port out of range": (
        ("parking", "list", "orders.work.parking"),
        {"RMQKIT_URL": f"amqp://guest:{SECRET}@127.0.0.1:99999/"},
    ),
    "status, RMQKIT_MANAGEMENT_URL port not a number": (
        ("status",),
        {
            "RMQKIT_URL": "amqp://guest:guest@127.0.0.1:1/",
            "RMQKIT_MANAGEMENT_URL": f"http://admin:{SECRET}@127.0.0.1:15672x",
        },
    ),
}


@pytest.mark.parametrize("case", BAD_PORTS.values(), ids=BAD_PORTS.keys())
def test_a_bad_port_is_one_line_exit_78(case: tuple[tuple[str, ...], dict[str, str]]) -> None:
    args, env = case
    result = rmqkit(*args, **env)
    assert "Traceback" not in result.stderr, result.stderr[-300:]
    assert result.returncode == 78, result.stderr[-300:]
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr[-300:]
    assert SECRET not in result.stdout + result.stderr


@pytest.mark.parametrize("where", ["before", "after"])
def test_an_empty_vhost_is_a_usage_error_not_the_default_vhost(where: str) -> None:
    """`rmqkit parking purge Q --vhost "$VHOST" --yes` with VHOST unset must not act on '/'."""
    args = ["--vhost", "", "config"] if where == "before" else ["config", "--vhost", ""]
    result = rmqkit(*args, RMQKIT_URL="amqp://guest:guest@127.0.0.1:1/orders")
    assert result.returncode == 64, result.stdout
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_vhost_rewrite_keeps_the_password_masked_and_the_last_vhost_wins() -> None:
    """Held: --vhost rewriting a cluster list (with an '@' encoded in one password) masks every
    password; given twice (before and after the command) the later one wins, consistently for
    config. Left unencoded, that '@' makes the URL malformed: refused, still masked."""
    url = f"amqp://ops:{SECRET}@127.0.0.1:1/a,amqp://ops:p%40{SECRET}@127.0.0.1:2/a"
    result = rmqkit("--vhost", "x", "config", "--json", "--vhost", "y/z", RMQKIT_URL=url)
    assert result.returncode == 0, result.stderr
    unencoded = url.replace("%40", "@")
    refused = rmqkit("--vhost", "x", "config", "--json", RMQKIT_URL=unencoded)
    assert refused.returncode == 78, refused.stderr
    assert SECRET not in refused.stdout + refused.stderr
    assert SECRET not in result.stdout + result.stderr
    assert '"vhost": "y/z"' in result.stdout
    assert "y%2Fz" in result.stdout


def _complete(words: str) -> list[str]:
    """What bash completion offers for the last word of ``words`` (the script `rmqkit
    completion bash` installs calls rmqkit back with these variables)."""
    parts = words.split(" ")
    result = rmqkit(
        _RMQKIT_COMPLETE="complete_bash", COMP_WORDS=words, COMP_CWORD=str(len(parts) - 1)
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_shell_completion_offers_vhost_everywhere_and_refuses_an_unknown_shell() -> None:
    """Held (no other test runs completion): README's `eval "$(rmqkit completion bash)"`
    installs a script that completes commands, subcommands and `--vhost` before the command,
    after it and after a positional argument; zsh and fish print theirs; an unknown shell is
    a one-line usage error (64)."""
    script = rmqkit("completion", "bash")
    assert script.returncode == 0, script.stderr
    assert "complete -o default -F _rmqkit_completion rmqkit" in script.stdout
    for shell in ("zsh", "fish"):
        other = rmqkit("completion", shell)
        assert other.returncode == 0 and "_RMQKIT_COMPLETE" in other.stdout, other.stderr
    assert _complete("rmqkit --vh") == ["--vhost"]
    assert _complete("rmqkit parking list --vh") == ["--vhost"]
    assert _complete("rmqkit parking list orders.work.parking --vh") == ["--vhost"]
    assert _complete("rmqkit plan --to") == ["--topology"]
    assert _complete("rmqkit parking re") == ["replay", "restore"]
    unknown = rmqkit("completion", "tcsh")
    assert unknown.returncode == 64, unknown.stdout
    assert len(unknown.stderr.strip().splitlines()) == 1, unknown.stderr

"""A URL whose password was not percent-encoded: one line saying so, the password never shown.

Before, ``amqp://guest:p@ss/word@host`` parsed as host ``ss`` (part of the password) and vhost
``word@host``, and the command failed on "cannot reach the management API at
http://guest:***@ss:15672 … enable it with rabbitmq-plugins".
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rmqkit.errors import ConfigError, ExitCode, UsageError
from rmqkit.settings import load_settings, mask_url
from rmqkit.urls import malformed_userinfo

ROOT = Path(__file__).resolve().parents[2]

SLASH_AND_AT = (
    "amqp://guest:***@host is malformed: its user name or password holds '@' and '/': "
    "percent-encode them there ('@' as %40, '/' as %2F); an '@' of the vhost is written %40 too"
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("RMQKIT_URL", "RMQKIT_MANAGEMENT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


def _rmqkit(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RMQKIT_")}
    return subprocess.run(
        [sys.executable, "-m", "rmqkit", *args],
        capture_output=True,
        text=True,
        env={**base, "PYTHONPATH": str(ROOT), **(env or {})},
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        (
            "amqp://guest:p@ss@127.0.0.1/",
            "its user name or password holds '@': percent-encode it there ('@' as %40)",
        ),
        (
            "amqp://guest:pa/ss@host/",
            "its user name or password holds '/': percent-encode it there ('/' as %2F); "
            "an '@' of the vhost is written %40 too",
        ),
        (
            "amqp://u:p?ss@h/",
            "its user name or password holds '?': percent-encode it there ('?' as %3F); "
            "an '@' of the vhost is written %40 too",
        ),
        (
            "amqp://u:p#s@s@h/v",
            "its user name or password holds '@' and '#': percent-encode them there "
            "('@' as %40, '#' as %23); an '@' of the vhost is written %40 too",
        ),
        (
            "amqp://u:50%off@h/",
            "its user name or password holds '%': percent-encode it there ('%' as %25)",
        ),
    ],
)
def test_ambiguous_userinfo_is_named(url: str, problem: str) -> None:
    assert malformed_userinfo(url) == problem


@pytest.mark.parametrize(
    "url",
    [
        "amqp://u:p%40ss%2Fword@h:5672/v%2F",  # encoded: fine
        "amqp://host/my@vh",  # no credentials: an '@' in the vhost is valid
        "amqp://host:5672/my@vh",
        "amqp://guest:guest@[::1]/",
        "amqp://[::1]/a@b",
        "amqp://u:p:q@h/",  # ':' in a password is allowed (the first ':' splits)
    ],
)
def test_well_formed_urls_pass(url: str) -> None:
    assert malformed_userinfo(url) is None
    load_settings(url=url)


def test_the_first_hour_url_is_a_usage_error_from_the_flag() -> None:
    with pytest.raises(UsageError) as info:
        load_settings(flags=True, url="amqp://guest:p@ss/word@host")
    assert str(info.value) == "--url: " + SLASH_AND_AT
    assert info.value.exit_code == ExitCode.USAGE == 64


def test_from_the_environment_it_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RMQKIT_URL", "amqp://guest:p@ss/word@host")
    with pytest.raises(ConfigError) as info:
        load_settings(flags=True)
    assert str(info.value) == "RMQKIT_URL: " + SLASH_AND_AT
    assert info.value.exit_code == ExitCode.CONFIG == 78


def test_a_comma_in_the_password_names_the_entry_not_its_text() -> None:
    with pytest.raises(UsageError) as info:
        load_settings(flags=True, url="amqp://u:se,cret@host/")
    assert str(info.value) == (
        "--url: amqp://u:***@host/ is malformed: entry 2 of 2 (split at ',') is not an AMQP "
        "URL — a ',' in a password is percent-encoded as %2C"
    )


def test_management_url_is_checked_too() -> None:
    with pytest.raises(UsageError) as info:
        load_settings(flags=True, management_url="http://admin:se/cr@t@mgmt:15672")
    assert str(info.value) == (
        "--management-url: http://admin:***@mgmt:15672 is malformed: its user name or password "
        "holds '@' and '/': percent-encode them there ('@' as %40, '/' as %2F); an '@' of the "
        "vhost is written %40 too"
    )


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("amqp://guest:p@ss/word@host", "amqp://guest:***@host"),
        ("amqp://guest:pa/ss@host/", "amqp://guest:***@host/"),
        ("amqp://u:p?ss@h/", "amqp://u:***@h/"),
        ("amqp://u:p@ss@h:5672/v", "amqp://u:***@h:5672/v"),
    ],
)
def test_masking_a_malformed_url_hides_every_part_of_the_password(url: str, shown: str) -> None:
    # the parser's host and vhost hold pieces of the password: none of them may show
    assert mask_url(url) == shown


def test_the_command_says_it_in_one_line_and_exits_64() -> None:
    # `status` would go to the management API first: nothing is reached, the URL is refused
    result = _rmqkit("--url", "amqp://guest:p@ss/word@host", "status")
    assert result.returncode == 64
    assert result.stderr == f"rmqkit: error: --url: {SLASH_AND_AT}\n"
    assert "@ss" not in result.stderr and "/word" not in result.stderr
    from_env = _rmqkit("status", env={"RMQKIT_URL": "amqp://guest:p@ss/word@host"})
    assert from_env.returncode == 78
    assert from_env.stderr == f"rmqkit: error: RMQKIT_URL: {SLASH_AND_AT}\n"

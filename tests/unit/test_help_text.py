"""Every command's --help shows its help text as written (rmqkit/cli/lazy.py's ``plain_help``).

typer renders help as rich markup: `parking show --help` printed "Encrypted fields show as
unless --decrypt" (``[encrypted kid=…]`` taken for a markup tag), a docstring's later paragraphs
kept their source line breaks (wrapped mid-sentence), and every flag showed a value type
(``--json <bool>``). These tests render each command's help through the real entry point.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from rmqkit.cli.main import main
from tests.unit.test_cli_conventions import every_command

BRACKETED = re.compile(r"\[[^\[\]]+\]")
BOX = re.compile(r"[│╭╮╰╯─]")


def rendered_help(path: str, capsys: pytest.CaptureFixture[str]) -> str:
    """`PATH --help` as printed, box drawing removed and whitespace collapsed (so text the
    panel wrapped reads on, as the eye reads it)."""
    code = main([*path.split()[1:], "--help"])
    out = capsys.readouterr().out
    assert code == 0, path
    return " ".join(BOX.sub(" ", out).split())


def written_help(command: Any) -> list[str]:
    """The help texts of ``command`` and its parameters, as the source gives them."""
    texts = [command.help or ""]
    texts += [getattr(param, "help", None) or "" for param in command.params]
    return texts


@pytest.fixture
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("TERMINAL_WIDTH", "200")


def test_parking_show_help_names_the_encrypted_placeholder(
    wide: None, capsys: pytest.CaptureFixture[str]
) -> None:
    shown = rendered_help("rmqkit parking show", capsys)
    assert "Encrypted fields show as [encrypted kid=…] unless --decrypt (needs the key ring)" in (
        shown
    )
    assert "RMQKIT_KEYRING); default: [encrypted kid=…]." in shown


def test_no_bracketed_text_is_lost_from_any_help(
    wide: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each ``[...]`` in any command's or option's help (the source's, unescaped) is printed."""
    checked = 0
    for path, command in every_command():
        shown = rendered_help(path, capsys)
        for text in written_help(command):
            unescaped = text.replace("\\[", "[")
            for bracketed in BRACKETED.findall(" ".join(unescaped.split())):
                checked += 1
                assert bracketed in shown, (path, bracketed)
    assert checked >= 2, checked  # at least parking show's two


def test_help_paragraphs_are_not_broken_mid_sentence(
    wide: None, capsys: pytest.CaptureFixture[str]
) -> None:
    for path, command in every_command():
        for text in written_help(command):
            for paragraph in text.split("\n\n"):
                assert "\n" not in paragraph, (path, paragraph)
    out = main(["doctor", "--help"])
    printed = capsys.readouterr().out
    assert out == 0
    assert (
        "Each finding names its check, severity, object, evidence and fix (docs/doctor.md). "
        "Exit codes follow the Nagios plugin convention: 0 ok · 1 warning · 2 critical."
    ) in printed  # one line at 200 columns: the source's line breaks are gone


def test_flags_show_no_value(wide: None, capsys: pytest.CaptureFixture[str]) -> None:
    """A boolean flag (or a count) takes no value, and its help line shows none; an option
    that takes one still shows its type."""
    flags = 0
    for path, command in every_command():
        for param in command.params:
            if getattr(param, "is_flag", False) or getattr(param, "count", False):
                flags += 1
                assert param.metavar == "", (path, param.opts)
        shown = rendered_help(path, capsys)
        assert "<bool>" not in shown, path
        assert re.search(r"--help Show this message and exit", shown), path
    assert flags > 30, flags
    listing = rendered_help("rmqkit parking list", capsys)
    assert "--json NDJSON, one object per message." in listing
    assert "--limit <int range> [x>=1] Stop after N matches." in listing

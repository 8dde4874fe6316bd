"""Every TOML and shell block of the docs (README, CONTRIBUTING, docs/**/*.md) against the tool.

- a ```toml block parses with tomllib and, when it is a topology (top-level ``queues``,
  ``exchanges`` or ``bindings``), is accepted by rmqkit's topology loader; a block the doc marks
  ``<!-- invalid-example -->`` on the line before must fail one of the two instead;
- a ```shell / ```bash / ```console block passes ``bash -n`` (a console block: its ``$ `` lines),
  and every ``rmqkit …`` command in it names a real command and only options that command
  has, resolved against the click command tree of ``rmqkit.cli.main.app`` (nothing is run).

Relative links are checked too: each reaches a page and, with an anchor, one of its headings.
No broker: this is the check that a doc cannot drift from the options the code has.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer

from rmqkit.cli.main import app
from rmqkit.errors import RmqkitError
from rmqkit.topology.model import parse_topology

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELLS = {"shell", "bash", "console", "sh"}
INVALID = "<!-- invalid-example -->"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its text, and whether the doc marks it as a
    deliberately invalid example."""

    path: Path
    line: int
    lang: str
    text: str
    invalid: bool

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of ``path``, in order."""
    source = path.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(source):
        line = source.count("\n", 0, match.start()) + 1
        before = source[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        found.append(Block(path, line, match.group(1), match.group(2), INVALID in before))
    return found


ALL = [block for path in DOCS for block in blocks(path)]
TOML = [b for b in ALL if b.lang == "toml"]
SHELL = [b for b in ALL if b.lang in SHELLS]


def script(block: Block) -> str:
    """The shell text of a block: a console block's ``$ `` lines (and their continuations)."""
    if block.lang != "console":
        return block.text
    lines, continuing = [], False
    for line in block.text.splitlines():
        if line.startswith("$ ") or continuing:
            text = line[2:] if line.startswith("$ ") and not continuing else line
            lines.append(text)
            continuing = text.rstrip().endswith("\\")
    return "\n".join(lines) + "\n"


def test_the_docs_have_blocks_to_check() -> None:
    """The fence pattern finds the blocks (a pattern that found none would pass everything)."""
    assert len(TOML) >= 3, [b.where for b in TOML]
    assert len(SHELL) >= 30, len(SHELL)
    assert (ROOT / "docs" / "tutorial.md") in {b.path for b in SHELL}


@pytest.mark.parametrize("block", TOML, ids=[b.where for b in TOML])
def test_toml_blocks_parse_and_topologies_load(block: Block) -> None:
    try:
        raw = tomllib.loads(block.text)
        if {"queues", "exchanges", "bindings"} & raw.keys():
            parse_topology(block.text, block.where)
    except (tomllib.TOMLDecodeError, RmqkitError) as exc:
        assert block.invalid, f"{block.where}: {exc}"
    else:
        assert not block.invalid, f"{block.where} is marked {INVALID} but is accepted"


@pytest.mark.parametrize("block", SHELL, ids=[b.where for b in SHELL])
def test_shell_blocks_are_valid_bash(block: Block) -> None:
    result = subprocess.run(
        ["bash", "-n"], input=script(block), capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, f"{block.where}: {result.stderr}"


# --- rmqkit command lines against the click tree ------------------------------------------------

# Duck-typed: typer >= 0.20 vendors click and keeps its own Group/Option classes, older typer
# uses the click package (rmqkit/cli/clickcompat.py); both have these attributes.
ROOT_COMMAND: Any = typer.main.get_command(app)
SEPARATORS = {"|", "||", "&", "&&", ";", "(", ")", "|&"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
SUBSTITUTION = re.compile(r"\$\((rmqkit [^()]*)\)")


def _commands_in(text: str) -> list[list[str]]:
    """The words of every ``rmqkit …`` command in shell ``text``: a pipeline's or list's parts
    each, env assignments before it dropped, ``$(rmqkit …)`` substitutions too; heredoc bodies
    and comments skipped."""
    commands: list[list[str]] = []
    logical: list[str] = []
    pending = ""
    heredoc: str | None = None
    for line in text.splitlines():
        if heredoc is not None:
            if line.strip() == heredoc:
                heredoc = None
            continue
        marker = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line)
        if marker:
            heredoc = marker.group(1)
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    for line in logical:
        for inner in SUBSTITUTION.findall(line):
            commands.extend(_commands_in(inner))
        lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;()")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        try:
            words = list(lexer)
        except ValueError:  # an unbalanced quote bash -n reports on its own
            continue
        current: list[str] = []
        for word in [*words, ";"]:
            if word in SEPARATORS or word.startswith(("<<", ">", "<")):
                if current and current[0] == "rmqkit":
                    commands.append(current)
                current = [] if word in SEPARATORS else current
                continue
            if not current and ASSIGNMENT.match(word):
                continue
            current.append(word)
    return [c for c in commands if c[0] == "rmqkit"]


def _is_group(command: Any) -> bool:
    return hasattr(command, "get_command")


def _options(command: Any) -> dict[str, Any]:
    """Each option name of ``command`` (``--help`` too: None, a flag) to its parameter."""
    found: dict[str, Any] = {"--help": None}
    for param in command.params:
        if param.param_type_name == "option":
            for name in (*param.opts, *param.secondary_opts):
                found[name] = param
    return found


def _takes_value(option: Any) -> bool:
    return option is not None and not option.is_flag and not option.count and option.nargs != 0


def check_command(words: list[str]) -> str | None:
    """None if ``words`` (``rmqkit …``) name a command and only its options; else why not."""
    command = ROOT_COMMAND
    path = ["rmqkit"]
    ctx = typer.Context(ROOT_COMMAND, info_name="rmqkit", resilient_parsing=True)
    rest = words[1:]
    index = 0
    while index < len(rest):
        word = rest[index]
        index += 1
        if word == "--":
            break
        if word.startswith("-") and word != "-":
            name, eq, _ = word.partition("=")
            options = _options(command)
            if name not in options:
                short = not name.startswith("--") and len(name) > 2
                if short and name[:2] in options:  # -abc: short flags together, or -oVALUE
                    continue
                return f"{' '.join(path)} has no option {name}"
            if not eq and _takes_value(options[name]):
                index += 1
            continue
        if _is_group(command):
            sub = command.get_command(ctx, word)
            if sub is None:
                return f"{' '.join(path)} has no command {word!r}"
            command = sub
            path.append(word)
            ctx = typer.Context(command, info_name=word, parent=ctx, resilient_parsing=True)
    if _is_group(command) and "--help" not in words and "--version" not in words:
        return f"{' '.join(path)} names a group, not a command"
    return None


COMMANDS = [
    (block, words)
    for block in SHELL
    if "rmqkit" in block.text
    for words in _commands_in(script(block))
]


def test_the_command_scanner_finds_commands() -> None:
    assert len(COMMANDS) >= 60, len(COMMANDS)
    found = _commands_in(
        'X=1 rmqkit plan t.toml --all | head\neval "$(rmqkit completion bash)"\n'
        "rmqkit consume a:b \\\n  --queue q & kill %1\n"
    )
    assert found == [
        ["rmqkit", "plan", "t.toml", "--all"],
        ["rmqkit", "completion", "bash"],
        ["rmqkit", "consume", "a:b", "--queue", "q"],
    ]


def test_the_checker_refuses_what_is_not_there() -> None:
    listing = ["rmqkit", "parking", "list", "q", "--reason", "x", "--vhost", "v"]
    assert check_command(listing) is None
    assert check_command(["rmqkit", "--vhost", "v", "status", "--json"]) is None
    nope = check_command(["rmqkit", "plan", "t.toml", "--nope"])
    assert nope == "rmqkit plan has no option --nope"
    assert check_command(["rmqkit", "parking", "lst"]) == "rmqkit parking has no command 'lst'"
    assert check_command(["rmqkit", "parking"]) == "rmqkit parking names a group, not a command"


@pytest.mark.parametrize(
    ("block", "words"),
    COMMANDS,
    ids=[f"{b.where}:{' '.join(w[:3])}" for b, w in COMMANDS],
)
def test_rmqkit_commands_in_the_docs_exist(block: Block, words: list[str]) -> None:
    problem = check_command(words)
    assert problem is None, f"{block.where}: {shlex.join(words)}: {problem}"


# --- links between the pages ---------------------------------------------------------------------

LINK = re.compile(r"\]\((?!https?://|mailto:)([^)\s]*?)(?:#([^)\s]+))?\)")


def anchors(path: Path) -> set[str]:
    """The heading anchors GitHub renders for ``path`` (lowercased, punctuation dropped, spaces
    to hyphens, a repeated heading numbered)."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


LINKS = [
    (path, target, anchor)
    for path in DOCS
    for target, anchor in LINK.findall(FENCE.sub("", path.read_text(encoding="utf-8")))
]


def test_the_link_scanner_finds_links() -> None:
    assert len(LINKS) >= 50, len(LINKS)


@pytest.mark.parametrize(
    ("path", "target", "anchor"),
    LINKS,
    ids=[f"{p.relative_to(ROOT)}->{t}#{a}" for p, t, a in LINKS],
)
def test_relative_links_reach_a_page_and_its_heading(path: Path, target: str, anchor: str) -> None:
    page = (path.parent / target).resolve() if target else path
    assert page.exists(), f"{path.relative_to(ROOT)}: {target} does not exist"
    if anchor and page.suffix == ".md":
        assert anchor in anchors(page), (
            f"{path.relative_to(ROOT)}: no heading #{anchor} in {target}"
        )


def test_anchors_are_githubs() -> None:
    found = anchors(ROOT / "docs" / "benchmarks.md")
    assert "2026-12-02-outcome-hooks-in-the-consumer-rmqkit-publish-over-the-library" in found
    assert "encrypted-fields-in-the-consumer" in found and "no-such-heading" not in found

"""Commands loaded when they run, so `rmqkit --help` does not import every library.

Each command module imports what it works with (aio-pika, pydantic, the parking and health
packages): importing all of them to print the command list cost most of `rmqkit --help`'s
start-up (issue 14: 0.8-1.1 s). ``LazyGroup`` lists a command from its module's *source*
(the function's docstring, or the group's ``typer.Typer(help=...)``, read with ``ast``, so the
listing cannot drift from the command), and imports the module only to run it or show its own
``--help``. ``tests/unit/test_oncall_startup.py`` checks the listing against the loaded commands.
"""

from __future__ import annotations

import ast
import difflib
import functools
import importlib
import importlib.util
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import typer
from rich.markup import escape
from typer.core import TyperGroup


def plain_help(command: Any) -> Any:
    """Make ``command``'s help (and its subcommands', if a group) render as written.

    typer's rich help parses every help text as rich markup, so ``[encrypted kid=…]`` vanished
    from `parking show --help`; it keeps a docstring's source line breaks after the first
    paragraph (help wrapped mid-sentence); and its option table gives a plain flag a value
    type (``--json <bool>``). Here each help text becomes its paragraphs on one line each, markup
    escaped, and a flag shows no value. Applied once to every command of a ``LazyGroup`` (the
    root included), so a new command cannot miss it (tests/unit/test_help_text.py).
    """
    if getattr(command, "_plain_help", False):  # escaping twice would show the backslashes
        return command
    command._plain_help = True
    for attr in ("help", "short_help", "epilog"):
        text = getattr(command, attr, None)
        if text:
            setattr(command, attr, plain_text(text))
    for param in getattr(command, "params", ()):
        if getattr(param, "help", None):
            param.help = plain_text(param.help)
        if getattr(param, "is_flag", False) or getattr(param, "count", False):
            param.metavar = ""  # rich help shows a metavar as given: none at all
    helper = getattr(command, "get_help_option", None)
    if helper is not None:  # --help itself is a flag click adds when the help is shown
        command.get_help_option = functools.partial(_flag_help_option, helper)
    for sub in (getattr(command, "commands", None) or {}).values():
        plain_help(sub)
    return command


def _flag_help_option(helper: Callable[[Any], Any], ctx: Any) -> Any:
    option = helper(ctx)
    if option is not None:
        option.metavar = ""
    return option


def plain_text(text: str) -> str:
    """``text`` as rich help should render it: paragraphs kept, each on one line (the terminal
    wraps it), rich markup escaped (brackets are text)."""
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return escape("\n\n".join(" ".join(p.split()) for p in paragraphs))


def first_paragraph(text: str) -> str:
    """The first paragraph of a help text, its lines joined."""
    return " ".join(text.strip().split("\n\n", 1)[0].split())


@dataclass(frozen=True)
class LazyCommand:
    """A command (``attr`` a function) or a group (``attr`` a ``typer.Typer``) of ``module``."""

    name: str  # as typed on the command line
    module: str  # imported only to run the command or show its own --help
    attr: str  # the command's function, or the group's typer.Typer
    group: bool = False

    def summary(self) -> str:
        """The help the command list shows: the first paragraph of the command's help, on one
        line (a docstring's line breaks are the source's, not the terminal's), read from the
        module's source without importing it."""
        return first_paragraph(self._help_text())

    def _help_text(self) -> str:
        spec = importlib.util.find_spec(self.module)
        if spec is None or spec.origin is None:
            return ""
        with open(spec.origin, encoding="utf-8") as source:
            tree = ast.parse(source.read())
        for node in tree.body:
            if not self.group and isinstance(node, ast.FunctionDef) and node.name == self.attr:
                return ast.get_docstring(node) or ""
            if (
                self.group
                and isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call)
                and any(isinstance(t, ast.Name) and t.id == self.attr for t in node.targets)
            ):
                for keyword in node.value.keywords:
                    if keyword.arg == "help":
                        return str(ast.literal_eval(keyword.value))
        return ""

    def load(self) -> Any:
        """The click command, importing its module."""
        found = getattr(importlib.import_module(self.module), self.attr)
        command: Any
        if self.group:
            command = typer.main.get_group(found)
        else:  # a one-command app is that command (as `app.command(name)(fn)` made it)
            holder = typer.Typer(
                rich_markup_mode="rich", pretty_exceptions_enable=False, add_completion=False
            )
            holder.command(self.name)(found)
            command = typer.main.get_command(holder)
        command.name = self.name
        return command


class LazyGroup(TyperGroup):
    """A typer group whose ``LAZY`` commands are imported on first use (see the module)."""

    LAZY: tuple[LazyCommand, ...] = ()

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self._listing = False
        self._loaded: dict[str, Any] = {}
        plain_help(self)  # its own help and options; each command's as it is loaded

    def list_commands(self, ctx: Any) -> list[str]:
        return [*super().list_commands(ctx), *(c.name for c in self.LAZY)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        found = super().get_command(ctx, cmd_name)
        if found is not None or cmd_name in self._loaded:
            return found or self._loaded[cmd_name]
        lazy = next((c for c in self.LAZY if c.name == cmd_name), None)
        if lazy is None:
            return None
        if self._listing:  # the command list only needs its name and help
            return plain_help(typer.core.TyperCommand(name=cmd_name, help=lazy.summary()))
        command = lazy.load()
        _share(command, self.shared_params)
        plain_help(command)
        self._loaded[cmd_name] = command
        return command

    def shared_params(self) -> list[Any]:
        """Fresh click parameters every command of this group also takes (a global option
        repeated on each command, as ``rmqkit parking list --vhost V``); none by default."""
        return []

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        try:
            return super().resolve_command(ctx, args)
        except typer.TyperException as exc:  # click's UsageError: "No such command"
            # typer suggests from the commands it holds: the lazy ones are not among them.
            message = getattr(exc, "message", None)
            if self.suggest_commands and args and isinstance(message, str):
                names = [c.name for c in self.LAZY]
                matches = difflib.get_close_matches(args[0], names)
                if matches and "Did you mean" not in message:
                    suggestions = ", ".join(repr(m) for m in matches)
                    exc.message = f"{message.rstrip('.')}. Did you mean {suggestions}?"
            raise

    def shell_complete(self, ctx: Any, incomplete: str) -> list[Any]:
        # Completing a command name needs names and help only: import no command module.
        self._listing = True
        try:
            result: list[Any] = super().shell_complete(ctx, incomplete)
            return result
        finally:
            self._listing = False

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


def _share(command: Any, make: Callable[[], list[Any]]) -> None:
    """Give ``command`` (each command of it, if a group) the parameters ``make`` returns,
    except those whose flags it already has: a command's own option wins (`export --vhost`)."""
    subcommands = getattr(command, "commands", None)
    if isinstance(subcommands, dict):
        for sub in subcommands.values():
            _share(sub, make)
        return
    taken = {flag for param in command.params for flag in param.opts}
    command.params.extend(p for p in make() if not taken & set(p.opts))


__all__ = ["LazyCommand", "LazyGroup", "first_paragraph", "plain_help", "plain_text"]

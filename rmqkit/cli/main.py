"""The `rmqkit` command: global options, command groups, and the one place errors become
exit codes (docs/exit-codes.md)."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sys
import traceback
from typing import Any

import typer
from typer import Abort
from typer.core import TyperGroup

from rmqkit._version import __version__
from rmqkit.cli.clickcompat import ClickException, ClickUsageError, NoArgsIsHelpError
from rmqkit.cli.completion import complete_vhost
from rmqkit.cli.lazy import LazyCommand, LazyGroup
from rmqkit.errors import ExitCode, RmqkitError

COMPLETE_VAR = "_RMQKIT_COMPLETE"  # as click names it: _{PROG}_COMPLETE
VHOST_HELP = (
    "Work in this virtual host instead of the one RMQKIT_URL/--url names (AMQP and the "
    "management API); also accepted after the command."
)


NON_INTERACTIVE_HELP = (
    "Never ask: a command that would ask (`parking purge` without --yes) refuses with exit 64 "
    "instead. Also RMQKIT_NON_INTERACTIVE=1, and implied when stdin is not a terminal."
)


def keep_global(name: str) -> Any:
    """The callback of a global option repeated on a command (``rmqkit parking list --vhost
    V``): the value joins the root's (``rmqkit --vhost V parking list``), where
    ``settings_from`` reads it; absent, it leaves the root's value alone."""

    def keep(ctx: typer.Context, value: Any) -> Any:
        if name == "vhost":
            check_vhost(value)
        if value is not None and value is not False:
            root = ctx.find_root()
            if root.obj is None:
                root.obj = {}
            root.obj[name] = value
        return value

    return keep


def check_vhost(value: str | None) -> None:
    """``--vhost ''`` is what ``--vhost "$VHOST"`` gives with the variable unset: refuse it
    rather than act on the URL's vhost (often ``/``) — a purge there is not what was meant."""
    if value is not None and not value.strip():
        raise typer.BadParameter(
            "empty (an unset shell variable?); name the vhost, e.g. --vhost / for the default one",
            param_hint="'--vhost'",
        )


def _repeated(
    vhost: str | None = typer.Option(
        None,
        "--vhost",
        help=VHOST_HELP,
        callback=keep_global("vhost"),
        expose_value=False,
        show_default=False,
        autocompletion=complete_vhost,
    ),
    non_interactive: bool = typer.Option(
        False,
        "--non-interactive",
        envvar="RMQKIT_NON_INTERACTIVE",
        help=NON_INTERACTIVE_HELP,
        callback=keep_global("non_interactive"),
        expose_value=False,
        show_default=False,
    ),
) -> None:
    """The global options every command repeats (their click parameters are taken from here)."""


class Commands(LazyGroup):
    """rmqkit's commands, in the order --help lists them; each module is imported only when
    its command runs or shows its own help (start-up time: bench/startup.py)."""

    LAZY = (
        LazyCommand("init", "rmqkit.cli.init", "init"),
        LazyCommand("config", "rmqkit.cli.config", "config"),
        LazyCommand("declare", "rmqkit.cli.topology", "declare"),
        LazyCommand("plan", "rmqkit.cli.topology", "plan"),
        LazyCommand("export", "rmqkit.cli.topology", "export"),
        LazyCommand("consume", "rmqkit.cli.consume", "consume"),
        LazyCommand("publish", "rmqkit.cli.publish", "publish"),
        LazyCommand("status", "rmqkit.cli.status", "status"),
        LazyCommand("doctor", "rmqkit.cli.doctor", "doctor"),
        LazyCommand("parking", "rmqkit.cli.parking", "app", group=True),
        LazyCommand("outbox", "rmqkit.cli.outbox", "app", group=True),
        LazyCommand("dedupe", "rmqkit.cli.dedupe", "app", group=True),
        LazyCommand("keys", "rmqkit.cli.keys", "app", group=True),
        LazyCommand("deploy", "rmqkit.cli.deploy", "app", group=True),
        LazyCommand("completion", "rmqkit.cli.completion", "completion"),
    )

    def shared_params(self) -> list[Any]:
        holder = typer.Typer(add_completion=False)
        holder.command()(_repeated)
        return list(typer.main.get_command(holder).params)


app = typer.Typer(
    cls=Commands,
    name="rmqkit",
    help="RabbitMQ reliability toolkit: topology as code, supervised consumers, parking lanes.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _version(value: bool) -> None:
    if value:
        print(f"rmqkit {__version__}")
        raise typer.Exit(0)


@app.callback()
def root(
    ctx: typer.Context,
    url: str | None = typer.Option(
        None,
        "--url",
        help="AMQP URL(s), comma-separated for a cluster; carries the vhost. Overrides RMQKIT_URL.",
        show_default=False,
    ),
    management_url: str | None = typer.Option(
        None, "--management-url", help="Management API URL. Overrides RMQKIT_MANAGEMENT_URL."
    ),
    vhost: str | None = typer.Option(
        None, "--vhost", help=VHOST_HELP, show_default=False, autocompletion=complete_vhost
    ),
    non_interactive: bool = typer.Option(
        False,
        "--non-interactive",
        envvar="RMQKIT_NON_INTERACTIVE",
        help=NON_INTERACTIVE_HELP,
        show_default=False,
    ),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    verbose: bool = typer.Option(
        False, "--verbose", "-v", help="Log client-library detail (aio-pika, httpx) to stderr."
    ),
) -> None:
    """Settings come from flags, then RMQKIT_* environment variables, then .env, then defaults.

    Exit codes: 0 ok · 1 bug · 2 `plan`: changes pending, checks: critical · 3 partial success ·
    64 usage error · 65 bad data or topology · 69 broker unreachable · 74 a file cannot be
    written · 77 access refused · 78 bad configuration · 130 interrupted.
    """
    # Client libraries log connection failures themselves; rmqkit reports them once, as one
    # line with the URL masked, so their own logs only show up when asked for.
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for name in ("aiormq", "aio_pika", "httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.CRITICAL)
    check_vhost(vhost)
    ctx.obj = {
        "url": url,
        "management_url": management_url,
        "vhost": vhost,
        "non_interactive": non_interactive,
    }


def run(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the app and exit with the mapped code."""
    code = main(argv)
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        code = _pipe_closed()
    sys.exit(code)


def _stdout_is_devnull() -> bool:
    try:
        out, null = os.fstat(sys.stdout.fileno()), os.stat(os.devnull)
    except (OSError, ValueError):
        return False
    return (out.st_dev, out.st_ino) == (null.st_dev, null.st_ino)


def _pipe_closed() -> int:
    """The reader of stdout went away (``rmqkit parking list | head``): not an error of
    rmqkit's. Exit quietly as a command killed by SIGPIPE would (141), with stdout pointed at
    /dev/null so the interpreter's own last flush does not fail (and print) again."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return ExitCode.PIPE_CLOSED


def main(argv: list[str] | None = None) -> int:
    """Run the app; every outcome becomes an exit code, every error one stderr line.

    Usage errors, click's (unknown option, missing argument, bad choice, no such command) and
    rmqkit's own, exit 64 (sysexits' EX_USAGE): 2 means "changes pending" (`plan`) and
    "critical" (monitoring checks). Only an unexpected exception prints a traceback (exit 1).
    """
    if os.environ.get(COMPLETE_VAR):  # the shell asking for completions (its script sets it)
        from rmqkit.cli.completion import complete

        return complete(typer.main.get_command(app), os.environ[COMPLETE_VAR])
    try:
        # Not standalone: click would print its multi-line usage box and exit 2 itself.
        result = app(args=argv, prog_name="rmqkit", standalone_mode=False)
    except NoArgsIsHelpError as exc:  # `rmqkit`, `rmqkit parking`: the help, which is no error
        if exc.format_message().strip():  # rich already printed it; plain click has it here
            print(exc.format_message())
        return ExitCode.OK
    except ClickUsageError as exc:
        print(usage_line(exc, sys.argv[1:] if argv is None else argv), file=sys.stderr)
        return ExitCode.USAGE
    except ClickException as exc:
        print(f"rmqkit: error: {_one_line(exc.format_message())}", file=sys.stderr)
        return int(exc.exit_code)
    except Abort:  # Ctrl-C or end of input at a prompt
        print("rmqkit: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except RmqkitError as exc:
        print(f"rmqkit: error: {_one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("rmqkit: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        return _pipe_closed()
    except SystemExit as exc:
        # click answers a closed pipe (EPIPE) with sys.exit(1) even when not standalone, and
        # rich's Console by pointing stdout at /dev/null and exiting 1 (on_broken_pipe): both
        # are the reader going away, not a bug.
        cause = exc.__context__
        if exc.code == 1 and isinstance(cause, OSError) and cause.errno == errno.EPIPE:
            return _pipe_closed()
        if exc.code == 1 and _stdout_is_devnull():
            return ExitCode.PIPE_CLOSED
        raise
    except Exception:
        traceback.print_exc()
        print(
            "rmqkit: internal error (a bug) — please report it with the traceback above",
            file=sys.stderr,
        )
        return ExitCode.BUG
    # Not standalone, typer returns an Exit's code, and a command's return value otherwise.
    return result if type(result) is int else ExitCode.OK


def usage_line(exc: Any, argv: list[str]) -> str:
    """Click's usage error as rmqkit's one line, naming the help of the command it concerns."""
    where = exc.ctx.command_path if exc.ctx is not None else _command_path(argv)
    # typer words a bad choice "Value error, 'x' is not one of …": the prefix says nothing.
    what = _one_line(exc.format_message()).replace(": Value error, ", ": ")
    return f"rmqkit: error: {what} (see '{where} --help')"


def _command_path(argv: list[str]) -> str:
    """The command ``argv`` names (``rmqkit parking list``), for errors click raises without
    a context (an option missing its value): the words that are command names, in order."""
    path = ["rmqkit"]
    command: Any = typer.main.get_command(app)
    context = typer.Context(command, info_name="rmqkit", resilient_parsing=True)
    for word in argv:
        if not isinstance(command, TyperGroup) or word.startswith("-"):
            continue
        if word in command.list_commands(context):
            command = command.get_command(context, word)
            path.append(word)
    return " ".join(path)


def _one_line(text: str) -> str:
    # Click words some messages over several lines (a choice's "Choose from:" list).
    return " ".join(text.split())

"""The `rmqkit` command: global options, command groups, and the one place errors become
exit codes (docs/exit-codes.md)."""

from __future__ import annotations

import logging
import sys
import traceback

import typer

from rmqkit._version import __version__
from rmqkit.cli.lazy import LazyCommand, LazyGroup
from rmqkit.errors import ExitCode, RmqkitError


class Commands(LazyGroup):
    """rmqkit's commands, in the order --help lists them; each module is imported only when
    its command runs or shows its own help (start-up time: bench/startup.py)."""

    LAZY = (
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
    )


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
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    verbose: bool = typer.Option(
        False, "--verbose", "-v", help="Log client-library detail (aio-pika, httpx) to stderr."
    ),
) -> None:
    """Settings come from flags, then RMQKIT_* environment variables, then .env, then defaults.

    Exit codes: 0 ok · 1 bug · 2 usage (and `plan`: changes pending) · 3 partial success ·
    65 bad data or topology · 69 broker unreachable · 77 access refused · 78 bad configuration ·
    130 interrupted.
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
    ctx.obj = {"url": url, "management_url": management_url}


def run(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the app and exit with the mapped code."""
    sys.exit(main(argv))


def main(argv: list[str] | None = None) -> int:
    """Run the app; every outcome becomes an exit code, every rmqkit error one stderr line.

    Usage errors are typer's (exit 2). Only an unexpected exception prints a traceback (exit 1).
    """
    try:
        app(args=argv, prog_name="rmqkit", standalone_mode=True)
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else ExitCode.BUG)
    except RmqkitError as exc:
        print(f"rmqkit: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("rmqkit: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except Exception:
        traceback.print_exc()
        print(
            "rmqkit: internal error (a bug) — please report it with the traceback above",
            file=sys.stderr,
        )
        return ExitCode.BUG
    return ExitCode.OK

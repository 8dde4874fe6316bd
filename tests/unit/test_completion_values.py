"""Completion of option values: the completion functions themselves (no broker), and through
the real entry point the way the shell calls it (``_RMQKIT_COMPLETE``)."""

from __future__ import annotations

import typer

from rmqkit.cli.completion import complete_queue, complete_reason, completion_settings
from rmqkit.cli.main import app
from rmqkit.parking.model import KNOWN_REASONS
from tests.unit.test_cli_conventions import _complete


def test_reasons_complete_from_the_known_ones() -> None:
    assert complete_reason("ex") == ["exhausted", "expired"]
    assert complete_reason("") == sorted(KNOWN_REASONS)
    assert complete_reason("nope") == []
    done = _complete("rmqkit parking list --reason del", _RMQKIT_COMPLETE="bash_complete")
    assert (done.returncode, done.stdout, done.stderr) == (0, "delivery_limit\n", ""), done


def _context(*argv: str) -> typer.Context:
    """The context of the command ``argv`` names, parsed as completion parses it (click's own
    resolver: resilient parsing, no callback of the root run)."""
    try:
        from typer._click.shell_completion import _resolve_context
    except ImportError:  # typer < 0.20: click is a package of its own
        from click.shell_completion import _resolve_context  # type: ignore[import-not-found,no-redef,unused-ignore]
    context: typer.Context = _resolve_context(typer.main.get_command(app), {}, "rmqkit", list(argv))
    return context


def test_settings_come_from_the_command_line_being_completed() -> None:
    ctx = _context("--url", "amqp://u:p@mq.example:5673/a", "parking", "list", "--vhost", "b")
    settings = completion_settings(ctx)
    assert settings.vhost == "b"
    assert settings.resolved_management_url().startswith("http://u:p@mq.example:15672")
    before = completion_settings(_context("--vhost", "c", "--url", "amqp://h/", "status"))
    assert before.vhost == "c"


def test_an_unreachable_broker_completes_nothing_silently() -> None:
    ctx = _context("--url", "amqp://u:p@127.0.0.1:1/", "--management-url", "http://127.0.0.1:1")
    assert complete_queue(ctx, "") == []
    done = _complete(
        "rmqkit --management-url http://127.0.0.1:1 parking list --origin o",
        _RMQKIT_COMPLETE="bash_complete",
    )
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "", ""), done

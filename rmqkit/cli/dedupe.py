"""`rmqkit dedupe`: init, status and prune of the idempotent-consumer store (issue 13)."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="Idempotent-consumer store: create its table, show it, prune old message ids.",
    no_args_is_help=True,
)

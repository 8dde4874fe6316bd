"""`rmqkit outbox`: init, relay and status of the transactional outbox (issue 12)."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="Transactional outbox: create its table, relay pending rows to RabbitMQ, show its state.",
    no_args_is_help=True,
)

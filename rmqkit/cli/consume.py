"""`rmqkit consume module:handler` (or a module of routed handlers): a supervised consumer of one
work queue."""

from __future__ import annotations

import logging
from enum import StrEnum
from pathlib import Path

import typer

from rmqkit.cli.common import run_async, seconds_option, settings_from
from rmqkit.consumer.config import ConsumerConfig, ConsumerFlags, refuse_without_keyring
from rmqkit.consumer.dedupe import dedupe_config
from rmqkit.consumer.handler import load_handler
from rmqkit.consumer.hooks import Hooks, hooks_for
from rmqkit.consumer.logs import JsonFormatter, TextFormatter
from rmqkit.consumer.resolve import resolve_config
from rmqkit.consumer.supervisor import run_supervised
from rmqkit.crypto import load_keyring
from rmqkit.durations import format_duration_ms
from rmqkit.errors import UsageError
from rmqkit.topology import load_topology
from rmqkit.topology.sources import locate_topology


class LogFormat(StrEnum):
    text = "text"
    json = "json"


def consume(
    ctx: typer.Context,
    handler: str = typer.Argument(
        ...,
        help="The handler as module:function (imported from the current directory, like "
        "uvicorn), or a module whose @rmqkit.handler(TYPE) functions each take the messages of "
        "their TYPE (see --route-by).",
    ),
    route_by: str | None = typer.Option(
        None,
        "--route-by",
        help="With a module HANDLER: where a message's type is read, 'header:NAME' or "
        "'routing-key' (default header:type). A message no handler's type matches is parked "
        "as unroutable_type.",
    ),
    queue: str = typer.Option(
        ...,
        "--queue",
        "-q",
        help="The work queue to consume, with its lanes (each its own prefetch and handler "
        "slots) or, if partitioned, all its partitions.",
    ),
    topology: Path | None = typer.Option(
        None,
        "--topology",
        "-t",
        help="Topology file: delays, attempts and parking come from it. Without it: "
        "$RMQKIT_TOPOLOGY, else the files rmqkit.toml names, else the topologies/*.toml "
        "declaring QUEUE (a queue declared by rmqkit with no file found: exit 78).",
    ),
    no_topology: bool = typer.Option(
        False,
        "--no-topology",
        help="Look for no topology file: tiers and parking from the broker's declared "
        "objects, attempts and permanent errors from the flags or the defaults.",
    ),
    prefetch: int | None = typer.Option(
        None,
        "--prefetch",
        min=1,
        max=65535,
        help="Unacked messages each worker holds at most (default 200, or the topology's "
        "prefetch).",
    ),
    concurrency: int | None = typer.Option(
        None,
        "--concurrency",
        min=1,
        help="Handlers in flight per process (default: prefetch). Below --prefetch it caps the "
        "prefetch: a worker holds no message it cannot start.",
    ),
    processes: int = typer.Option(1, "--processes", min=1, max=64, help="Worker processes."),
    handler_timeout: str | None = typer.Option(
        None,
        "--handler-timeout",
        help="e.g. 30s; a handler running longer counts as a "
        "transient failure (default 30s, or the topology's handler_timeout).",
    ),
    max_attempts: int | None = typer.Option(
        None,
        "--max-attempts",
        min=1,
        help="Handler runs before a failing message is parked as exhausted (default 5, or the "
        "topology's max_attempts).",
    ),
    grace: str = typer.Option(
        "30s",
        "--grace",
        help="How long SIGTERM waits for in-flight handlers; a second signal stops at once.",
    ),
    permanent_error: list[str] = typer.Option(
        [], "--permanent-error", help="Exception type parked without retry (repeatable)."
    ),
    metrics_port: int | None = typer.Option(
        None, "--metrics-port", help="Serve /metrics, /healthz, /readyz (worker i on port+i)."
    ),
    log_format: LogFormat = typer.Option(
        LogFormat.text,
        "--log-format",
        help="Log lines on stderr: text, or json (one object a line).",
    ),
    dedupe: str | None = typer.Option(
        None,
        "--dedupe",
        help="Idempotent consumer: record each message_id in this store (sqlite:///app.db, "
        "postgresql://…) in the handler's transaction; duplicates are acked unhandled. "
        "Run `rmqkit dedupe init` first.",
    ),
    dedupe_connections: int | None = typer.Option(
        None,
        "--dedupe-connections",
        min=1,
        max=256,
        help="Store connections per process (default 4 on PostgreSQL, 1 on SQLite).",
    ),
    dedupe_batch: int = typer.Option(
        100, "--dedupe-batch", min=1, max=1000, help="Messages per store transaction at most."
    ),
    dedupe_scope: str | None = typer.Option(
        None,
        "--dedupe-scope",
        help="Whose message ids and versions (default: the vhost and QUEUE). Give consumers of "
        "several queues one scope to apply each message once between them.",
    ),
    order_key_header: str | None = typer.Option(
        None, "--order-key-header", help="Ordering guard: the header holding the entity key."
    ),
    order_version_header: str | None = typer.Option(
        None,
        "--order-version-header",
        help="Ordering guard: the header holding its integer version; not newer → acked stale.",
    ),
    conflate_key_header: str | None = typer.Option(
        None,
        "--conflate-key-header",
        help="Conflation: of the messages a worker holds with the same value of this header, "
        "only the newest is handled; the others are acked as superseded.",
    ),
) -> None:
    """Consume QUEUE with HANDLER under supervision: manual acks, retries through the wait
    queues, poison and exhausted messages to parking. SIGTERM stops gracefully (exit 0).
    Encrypted fields are decrypted for the handler with the key ring (RMQKIT_KEYRING_FILE or
    RMQKIT_KEYRING); a message that cannot be decrypted is parked as undecryptable.

    Refuses to start (exit 78) when the queues' wiring in effect would drop or misroute
    messages (e.g. a wait queue that does not dead-letter back to QUEUE). A served queue deleted
    while it runs stops only that queue's consumer until the queue is declared again (the log
    and /readyz name it). Workers stop (gracefully) when the supervisor dies, however killed."""
    settings = settings_from(ctx)
    # A handler or its module's rmqkit_hooks that cannot load fails here, once, with one line
    # (exit 78), not in every worker.
    loaded = load_handler(handler, route_by=route_by)
    hooks = hooks_for(None, loaded)
    flags = ConsumerFlags(
        prefetch=prefetch,
        concurrency=concurrency,
        handler_timeout_s=seconds_option(handler_timeout, "--handler-timeout"),
        max_attempts=max_attempts,
        grace_s=seconds_option(grace, "--grace"),
        metrics_port=metrics_port,
        log_format="json" if log_format == LogFormat.json else "text",
        permanent_errors=tuple(permanent_error),
        dedupe=dedupe_config(
            dedupe,
            loaded,
            connections=dedupe_connections,
            batch=dedupe_batch,
            order_key_header=order_key_header,
            order_version_header=order_version_header,
            scope=dedupe_scope,
            queue=queue,
            vhost=settings.vhost,
        ),
        conflate_key_header=conflate_key_header,
    )
    # The key ring is loaded by each worker at start-up; a bad one fails here once (exit 78).
    ring = load_keyring(*settings.keyring_sources())
    if topology is not None and no_topology:
        raise UsageError("--topology and --no-topology exclude each other — give one")
    spec, source, unlocated = None, "none (--no-topology)", None
    if topology is not None:
        spec, source = load_topology(topology), f"{topology} (--topology)"
    elif not no_topology:
        # A queue declared from a file keeps that file's attempts and permanent errors: find
        # it rather than run on defaults that would retry what the file says to park.
        located = locate_topology(queue, Path.cwd())
        if located is not None:
            shown = located.path
            if shown.is_absolute() and shown.is_relative_to(Path.cwd()):
                shown = shown.relative_to(Path.cwd())
            spec, source = located.topology, f"{shown} (found via {located.found_via})"
        else:
            source = "none found"
            unlocated = (
                "RMQKIT_TOPOLOGY unset, no rmqkit.toml naming one, no topologies/*.toml "
                f"declaring {queue!r} in {Path.cwd()}"
            )
    if spec is not None:  # an encrypting queue without a ring would park every message
        refuse_without_keyring(spec, queue, ring is not None)
    config = run_async(resolve_config(settings, loaded, queue, flags, spec, unlocated=unlocated))
    line = start_line(source, config, spec is None, hooks)
    typer.echo(_formatted(line, flags.log_format), err=True)
    raise typer.Exit(run_supervised(settings, config, processes))


def _formatted(line: str, log_format: str) -> str:
    """The start line in the consumer's log format (the supervisor's formatter is not set up
    yet): a JSON log stays one object a line."""
    record = logging.LogRecord("rmqkit.consume", logging.INFO, __file__, 0, line, None, None)
    formatter = JsonFormatter() if log_format == "json" else TextFormatter()
    return formatter.format(record)


def start_line(source: str, config: ConsumerConfig, defaults: bool, hooks: Hooks | None) -> str:
    """Which topology file, settings and hooks are in effect, for the first line of the log."""
    parts = []
    for one in (config, *config.siblings):
        policy = one.policy
        retry = "/".join(format_duration_ms(d) for d in policy.retry_delays_ms) or "none"
        permanent = ", ".join(sorted(policy.permanent_errors)) or "none"
        parts.append(
            f"queue {one.queue}: max_attempts={policy.max_attempts}, retry {retry}, "
            f"permanent: {permanent}, prefetch {one.prefetch}"
        )
    note = " (no topology file: built-in defaults where the flags say nothing)" if defaults else ""
    shown = hooks.describe() if hooks is not None else "none"
    return f"topology: {source}{note}; " + "; ".join(parts) + f"; hooks: {shown}"

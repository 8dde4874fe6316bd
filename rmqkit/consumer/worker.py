"""One worker process: logging, handler, metrics endpoint, signals, and the embedded
consumer (rmqkit.consumer.embedded) that consumes in it."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable
from multiprocessing.connection import Connection

from rmqkit.consumer.config import ConsumerConfig
from rmqkit.consumer.embedded import Consumer
from rmqkit.consumer.handler import load_handler
from rmqkit.consumer.health_server import HealthServer
from rmqkit.consumer.logs import configure_logging
from rmqkit.consumer.threads import HandlerThreads
from rmqkit.crypto import load_keyring
from rmqkit.errors import ExitCode, RmqkitError
from rmqkit.settings import Settings

log = logging.getLogger("rmqkit.consumer")
# The worker's exit code when stuck handler calls exhausted its threads: the supervisor restarts
# it (any code but the fatal ones means restart) and names the reason.
RECYCLE_EXIT_CODE = 75  # EX_TEMPFAIL


def run_worker(
    settings: Settings,
    config: ConsumerConfig,
    *,
    index: int = 0,
    cautious: bool = False,
    lifeline: Connection | None = None,
) -> int:
    """Run one consumer in this process until SIGTERM/SIGINT, or until ``lifeline`` (the read
    end of the supervisor's pipe, rmqkit.consumer.supervisor) reaches end-of-file: the
    supervisor is gone, and a worker nobody supervises must not go on taking messages.
    Returns the exit code."""
    configure_logging(config.log_format)
    # aiormq logs a lost connection as an ERROR with a traceback; the runner reports it once,
    # as one line, and reconnects.
    logging.getLogger("aiormq").setLevel(logging.CRITICAL)
    threads: list[HandlerThreads] = []
    try:
        handler = load_handler(config.handler)
        code = asyncio.run(
            _main(
                settings,
                config,
                handler,
                index=index,
                cautious=cautious,
                threads=threads,
                lifeline=lifeline,
            )
        )
    except RmqkitError as exc:
        log.error("%s", exc)
        code = exc.exit_code
    busy = sum(t.busy for t in threads)
    if busy:
        # A handler thread cannot be stopped, and the interpreter joins every pool thread at
        # exit: a call that never returns would hold the process past its grace for good. The
        # consumer has drained and closed its connection (what did not finish was not acked and
        # comes back), so leave now.
        log.warning(
            "exiting without waiting for %d sync handler call(s) still running "
            "(nothing unfinished was acked: those messages come back)",
            busy,
        )
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


async def _main(
    settings: Settings,
    config: ConsumerConfig,
    handler: object,
    *,
    index: int,
    cautious: bool,
    threads: list[HandlerThreads],
    lifeline: Connection | None = None,
) -> int:
    from rmqkit.consumer.handler import LoadedHandler

    assert isinstance(handler, LoadedHandler)
    # Loaded once, here: every message's envelopes are opened with it (None: no key ring, and a
    # message with an encrypted field is parked undecryptable). A bad ring is fatal (78).
    keyring = load_keyring(*settings.keyring_sources())
    # The embedded consumer's own path (rmqkit.Consumer), given the configuration the
    # supervisor resolved: one consumer per queue served (the work queue and its lanes, or the
    # partitions), sharing the worker's metrics and health endpoints (rmqkit.consumer.lanes).
    # A restarted worker (cautious) waits for a queue that is missing instead of exiting 78:
    # the supervisor would stop every worker, and with them every other queue they serve.
    consumer = Consumer._resolved(settings, config, handler, keyring=keyring, cautious=cautious)
    metrics = consumer.metrics
    assert metrics is not None
    threads.extend(c.threads for c in consumer._runners if c.threads is not None)
    loop = asyncio.get_running_loop()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            log.info("stopping: finishing in-flight messages (grace %.0fs)", config.grace_s)
            consumer.request_stop()
        else:
            log.warning("second signal: stopping now; unacked messages will be redelivered")
            os._exit(ExitCode.INTERRUPTED)

    # The worker process owns its signals (the embedded consumer never installs handlers).
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    if lifeline is not None:
        _watch_lifeline(loop, lifeline, on_signal, config.grace_s)
    server, rebind = None, None
    if config.metrics_port is not None:
        server = HealthServer(metrics, port=config.metrics_port)
        rebind = await _serve(server, restarted=cautious)
    try:
        # Everything loaded so far (modules, the handler's imports, settings) lives as long as
        # the worker: out of the collector's sight, a collection no longer walks it, which cost
        # every message a share (more for bodies parsed to decrypt: bench/consumer_encrypted.py).
        gc.freeze()
        await consumer._serve()  # dedupe store started (78/69 if not usable), then consume
    finally:
        if rebind is not None:
            rebind.cancel()
        if server is not None:
            await server.stop()
    log.info("stopped after %d message(s)", consumer.processed)
    if consumer.recycle and not signals:
        return RECYCLE_EXIT_CODE
    return ExitCode.OK


def _watch_lifeline(
    loop: asyncio.AbstractEventLoop,
    lifeline: Connection,
    stop: Callable[[], None],
    grace_s: float,
) -> None:
    """Call ``stop`` (as the first SIGTERM would) once the supervisor's pipe ends.

    The supervisor never writes to it: readable means end-of-file, i.e. the supervisor's end was
    closed by its exit or its death (kill -9 of it alone or of its process group included)."""
    fd = lifeline.fileno()
    parent = os.getppid()

    def on_readable() -> None:
        loop.remove_reader(fd)
        log.warning(
            "the supervisor (pid %d) is gone; stopping this worker: no new deliveries, "
            "finishing in-flight messages (grace %.0fs)",
            parent,
            grace_s,
        )
        stop()

    loop.add_reader(fd, on_readable)


METRICS_RETRY_S = 2.0


async def _serve(server: HealthServer, *, restarted: bool) -> asyncio.Task[None] | None:
    """Start the metrics server; a restarted worker consumes on while its port is taken.

    On the first start a taken port is the operator's mistake: exit 78 at once. A worker the
    supervisor restarts (after a crash or kill -9) can find its port briefly taken by something
    else, e.g. as an outgoing connection's source port; stopping the whole consumer for that
    would halt the queue over a metrics endpoint, so it warns and binds again in the background.
    """
    if not restarted:
        await server.start()
        return None
    try:
        await server.start()
    except RmqkitError as exc:
        log.warning(
            "%s; consuming without metrics, binding again every %.0fs", exc, METRICS_RETRY_S
        )
        return asyncio.create_task(_bind_later(server))
    return None


async def _bind_later(server: HealthServer) -> None:
    while not server.started:
        await asyncio.sleep(METRICS_RETRY_S)
        with contextlib.suppress(RmqkitError):
            await server.start()
    log.info("metrics server listening again")

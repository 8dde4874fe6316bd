"""One worker process: logging, handler, metrics endpoint, signals, and the Consumer."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys

from rmqkit.consumer.config import ConsumerConfig
from rmqkit.consumer.handler import load_handler
from rmqkit.consumer.health_server import HealthServer
from rmqkit.consumer.logs import configure_logging
from rmqkit.consumer.metrics import ConsumerMetrics
from rmqkit.consumer.runner import Consumer
from rmqkit.consumer.threads import HandlerThreads
from rmqkit.errors import ExitCode, RmqkitError
from rmqkit.settings import Settings

log = logging.getLogger("rmqkit.consumer")
# The worker's exit code when stuck handler calls exhausted its threads: the supervisor restarts
# it (any code but the fatal ones means restart) and names the reason.
RECYCLE_EXIT_CODE = 75  # EX_TEMPFAIL


def run_worker(
    settings: Settings, config: ConsumerConfig, *, index: int = 0, cautious: bool = False
) -> int:
    """Run one consumer in this process until SIGTERM/SIGINT; returns the exit code."""
    configure_logging(config.log_format)
    # aiormq logs a lost connection as an ERROR with a traceback; the runner reports it once,
    # as one line, and reconnects.
    logging.getLogger("aiormq").setLevel(logging.CRITICAL)
    threads: list[HandlerThreads] = []
    try:
        handler = load_handler(config.handler)
        code = asyncio.run(
            _main(settings, config, handler, index=index, cautious=cautious, threads=threads)
        )
    except RmqkitError as exc:
        log.error("%s", exc)
        code = exc.exit_code
    if threads and threads[0].busy:
        # A handler thread cannot be stopped, and the interpreter joins every pool thread at
        # exit: a call that never returns would hold the process past its grace for good. The
        # consumer has drained and closed its connection (what did not finish was not acked and
        # comes back), so leave now.
        log.warning(
            "exiting without waiting for %d sync handler call(s) still running "
            "(nothing unfinished was acked: those messages come back)",
            threads[0].busy,
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
) -> int:
    from rmqkit.consumer.handler import LoadedHandler

    assert isinstance(handler, LoadedHandler)
    metrics = ConsumerMetrics(config.queue, config.tier_names)
    consumer = Consumer(settings, config, handler, metrics, cautious=cautious)
    if consumer.threads is not None:
        threads.append(consumer.threads)
    loop = asyncio.get_running_loop()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            log.info("stopping: finishing in-flight messages (grace %.0fs)", config.grace_s)
            consumer.stop()
        else:
            log.warning("second signal: stopping now; unacked messages will be redelivered")
            os._exit(ExitCode.INTERRUPTED)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    for warning in config.warnings:
        log.warning("%s", warning)
    server = None
    if config.metrics_port is not None:
        server = HealthServer(metrics, port=config.metrics_port)
        await server.start()
    beat = asyncio.create_task(_heartbeat(metrics))
    try:
        if consumer.dedupe is not None:  # initialised (else 78, fatal) and answering (else 69)
            await consumer.dedupe.start()
        await consumer.run()
    finally:
        if consumer.dedupe is not None:
            await consumer.dedupe.close()
        consumer.close()
        beat.cancel()
        if server is not None:
            await server.stop()
    log.info("stopped after %d message(s)", consumer.processed)
    if consumer.recycle and not signals:
        return RECYCLE_EXIT_CODE
    return ExitCode.OK


async def _heartbeat(metrics: ConsumerMetrics) -> None:
    with contextlib.suppress(asyncio.CancelledError):
        while True:
            metrics.heartbeat()
            await asyncio.sleep(1.0)

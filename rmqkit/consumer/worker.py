"""One worker process: logging, handler, metrics endpoint, signals, and the Consumer."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal

from rmqkit.consumer.config import ConsumerConfig
from rmqkit.consumer.handler import load_handler
from rmqkit.consumer.logs import configure_logging
from rmqkit.consumer.metrics import ConsumerMetrics, HealthServer
from rmqkit.consumer.runner import Consumer
from rmqkit.errors import ExitCode, RmqkitError
from rmqkit.settings import Settings

log = logging.getLogger("rmqkit.consumer")


def run_worker(
    settings: Settings, config: ConsumerConfig, *, index: int = 0, cautious: bool = False
) -> int:
    """Run one consumer in this process until SIGTERM/SIGINT; returns the exit code."""
    configure_logging(config.log_format)
    # aiormq logs a lost connection as an ERROR with a traceback; the runner reports it once,
    # as one line, and reconnects.
    logging.getLogger("aiormq").setLevel(logging.CRITICAL)
    try:
        handler = load_handler(config.handler)
        return asyncio.run(_main(settings, config, handler, index=index, cautious=cautious))
    except RmqkitError as exc:
        log.error("%s", exc)
        return exc.exit_code


async def _main(
    settings: Settings, config: ConsumerConfig, handler: object, *, index: int, cautious: bool
) -> int:
    from rmqkit.consumer.handler import LoadedHandler

    assert isinstance(handler, LoadedHandler)
    metrics = ConsumerMetrics(config.queue, config.tier_names)
    consumer = Consumer(settings, config, handler, metrics, cautious=cautious)
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
        await consumer.run()
    finally:
        consumer.close()
        beat.cancel()
        if server is not None:
            await server.stop()
    log.info("stopped after %d message(s)", consumer.processed)
    return ExitCode.OK


async def _heartbeat(metrics: ConsumerMetrics) -> None:
    with contextlib.suppress(asyncio.CancelledError):
        while True:
            metrics.heartbeat()
            await asyncio.sleep(1.0)

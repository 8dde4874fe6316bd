"""``rmqkit.Consumer``: the consumer of ``rmqkit consume`` in an application's own asyncio event
loop (a FastAPI lifespan, a service, a test).

The command's path: configuration by rmqkit.consumer.resolve (lanes or partitions, wiring checks,
the topology's tiers and limits), then per served queue rmqkit.consumer.runner's connection loop
and rmqkit.consumer.dispatch's per-message path; the command's worker (rmqkit.consumer.worker)
runs this class too. Left to the application: signals (none is installed here), logging
configuration, processes. ``stop(grace_s)`` drains (no new deliveries; in-flight ones finish
and are settled; the rest is never acked and comes back); cancelling ``run()`` stops at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import types
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from rmqkit.broker.session import session
from rmqkit.consumer.config import ConsumerConfig, ConsumerFlags, refuse_without_keyring
from rmqkit.consumer.dedupe import dedupe_config
from rmqkit.consumer.health_server import HealthServer, heartbeat
from rmqkit.consumer.hooks import HookRunner, Hooks, hooks_for
from rmqkit.consumer.lanes import run_consumers
from rmqkit.consumer.loading import LoadedHandler, handler_from_callable, load_handler
from rmqkit.consumer.metrics import ConsumerMetrics
from rmqkit.consumer.resolve import check_arguments, resolve_config
from rmqkit.consumer.routing import Router
from rmqkit.consumer.runner import QueueConsumer
from rmqkit.crypto import KeyRing, load_keyring
from rmqkit.errors import BrokerUnavailable, UsageError
from rmqkit.otel_metrics import otel_metrics
from rmqkit.settings import Settings, load_settings
from rmqkit.topology import load_topology
from rmqkit.topology.model import Topology

__all__ = ["Consumer"]

log = logging.getLogger("rmqkit.consumer")
_START_POLL_S = 0.01


class Consumer:
    """Consume ``queue`` with ``handler`` in the running event loop, as ``rmqkit consume`` does.

    ``handler``: an ``async def`` or ``def`` function of one argument (or a ``"module:function"``
    spec), with the signatures ``rmqkit consume`` accepts (docs/api.md). ``topology``: a loaded
    ``Topology`` or the path of its file (delays, attempts, parking from it); None reads them
    from the broker's declared objects through the management API. ``settings``: the broker
    (default ``rmqkit.load_settings()``, i.e. the ``RMQKIT_*`` environment). The other keywords
    are ``rmqkit consume``'s options; None takes the topology's value, then the default.
    ``hooks``: ``rmqkit.Hooks(on_success=..., on_retry=..., on_park=...)``, called after each
    outcome is settled (docs/hooks.md); None takes the handler module's ``rmqkit_hooks`` if it
    defines one, as ``rmqkit consume`` does (``rmqkit.Hooks()``: none).

    Bad arguments, a handler that cannot be one or an unreadable topology file raise here
    (UsageError, ConfigError, TopologyFileError). Connecting happens in ``start()``.
    """

    def __init__(
        self,
        handler: Callable[..., Any] | str | types.ModuleType | Router,
        *,
        queue: str,
        topology: Topology | str | os.PathLike[str] | None = None,
        settings: Settings | None = None,
        prefetch: int | None = None,
        concurrency: int | None = None,
        handler_timeout_s: float | None = None,
        max_attempts: int | None = None,
        grace_s: float = 30.0,
        permanent_errors: Iterable[str] = (),
        dedupe: str | None = None,
        dedupe_connections: int | None = None,
        dedupe_batch: int = 100,
        dedupe_scope: str | None = None,
        order_key_header: str | None = None,
        order_version_header: str | None = None,
        conflate_key_header: str | None = None,
        metrics_port: int | None = None,
        keyring: KeyRing | None = None,
        start_timeout_s: float = 30.0,
        hooks: Hooks | None = None,
    ) -> None:
        check_arguments(
            queue, prefetch, concurrency, max_attempts, handler_timeout_s, grace_s, start_timeout_s
        )
        self.queue = queue
        self._loaded = (
            load_handler(handler) if isinstance(handler, str) else handler_from_callable(handler)
        )
        # None: the handler module's own ``rmqkit_hooks``, as ``rmqkit consume`` reads it.
        self._hooks = hooks_for(hooks, self._loaded)
        self._settings = settings if settings is not None else load_settings()
        self._spec = (
            topology
            if isinstance(topology, Topology) or topology is None
            else load_topology(Path(topology))
        )
        # No key ring given: the settings' (RMQKIT_KEYRING_FILE / RMQKIT_KEYRING), as the
        # command loads it; a queue that encrypts fields without one is refused (78).
        self._keyring = (
            keyring if keyring is not None else load_keyring(*self._settings.keyring_sources())
        )
        if self._spec is not None:
            refuse_without_keyring(self._spec, queue, self._keyring is not None)
        self._flags = ConsumerFlags(
            prefetch=prefetch,
            concurrency=concurrency,
            handler_timeout_s=handler_timeout_s,
            max_attempts=max_attempts,
            grace_s=grace_s,
            metrics_port=metrics_port,
            permanent_errors=tuple(permanent_errors),
            conflate_key_header=conflate_key_header,
        )
        self._dedupe_args: dict[str, Any] = {
            "connections": dedupe_connections,
            "batch": dedupe_batch,
            "order_key_header": order_key_header,
            "order_version_header": order_version_header,
            "scope": dedupe_scope,
        }
        self._dedupe_dsn = dedupe
        self._start_timeout_s = start_timeout_s
        self._config: ConsumerConfig | None = None
        self._metrics: ConsumerMetrics | None = None
        self._runners: list[QueueConsumer] = []
        self._hook_runner: HookRunner | None = None
        self._server: HealthServer | None = None
        self._task: asyncio.Task[None] | None = None
        self._starting: asyncio.Lock | None = None
        self._stopped = False
        self._abort = False  # stop() came while start() was still preparing

    @classmethod
    def _resolved(
        cls,
        settings: Settings,
        config: ConsumerConfig,
        handler: LoadedHandler,
        *,
        keyring: KeyRing | None,
        cautious: bool = False,
    ) -> Consumer:
        """A consumer of an already resolved configuration (``rmqkit consume``'s worker: the
        supervisor resolved it once). ``cautious``: restarted after a crash, prefetch 1 for a
        while, and a missing queue is waited for instead of being fatal. Run it with
        ``_serve()``; its metrics server is the worker's."""
        self = cls.__new__(cls)
        self.queue = config.queue
        self._loaded, self._settings, self._spec, self._keyring = handler, settings, None, keyring
        self._hooks = hooks_for(None, handler)  # the handler module's ``rmqkit_hooks``
        self._server, self._task, self._starting, self._stopped = None, None, None, False
        self._build(config, cautious=cautious)
        return self

    # --- what the application reads ----------------------------------------------------------
    @property
    def config(self) -> ConsumerConfig | None:
        """The resolved configuration (None before ``start()``)."""
        return self._config

    @property
    def metrics(self) -> ConsumerMetrics | None:
        """The consumer's metrics, its own Prometheus registry in ``.registry`` (None before
        ``start()``): serve them from the application's own ``/metrics`` if it has one."""
        return self._metrics

    @property
    def metrics_port(self) -> int | None:
        """The port ``/metrics``, ``/healthz`` and ``/readyz`` are served on (None: not served);
        the bound one when ``metrics_port=0`` was given."""
        return self._server.port if self._server is not None and self._server.started else None

    @property
    def consuming(self) -> bool:
        """Whether every served queue's consumer is registered with the broker right now."""
        return (
            bool(self._runners)
            and self._metrics is not None
            and all(self._metrics.consuming_queue(r.config.queue) for r in self._runners)
        )

    @property
    def processed(self) -> int:
        """Deliveries settled so far (acked, retried or parked)."""
        return sum(r.processed for r in self._runners)

    @property
    def recycle(self) -> bool:
        """Whether it stopped by itself because stuck ``def`` handlers hold every handler
        thread (a thread cannot be stopped: the process should be restarted)."""
        return any(r.recycle for r in self._runners)

    # --- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect and start consuming; returns once every served queue is consumed.

        Raises what ``rmqkit consume`` exits on: ConfigError (78: a queue missing, wiring that
        would lose messages, a dedupe store not initialised, the metrics port taken),
        AccessRefused (77), BrokerUnavailable (69: the broker, or without a topology its
        management API, cannot be reached, or no consumer was registered within
        ``start_timeout_s``). A second call while started returns at once."""
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._stopped:
                raise UsageError("this Consumer was stopped; create a new one to consume again")
            if self._task is not None:
                return
            try:
                await self._prepare()
                if self._abort:  # stop() while preparing: never consume
                    await self._abandon()
                    self._stopped = True
                    return
                self._task = asyncio.create_task(self._serve(), name=f"rmqkit consume {self.queue}")
                await self._until_consuming(self._task)
                self._task.add_done_callback(self._report_end)
            except BaseException:
                # Failed, timed out or cancelled while starting: nothing may keep running
                # (a consumer the app no longer knows of would take messages); start() may
                # be called again.
                await self._abandon()
                raise

    def _report_end(self, task: asyncio.Task[None]) -> None:
        # An app that only called start() may never await run(): a fatal error that ended
        # the consumer (access refused, a queue declared otherwise) must still be seen.
        # (A failure while start() waits is raised by start() instead.)
        if task is self._task and not task.cancelled() and (error := task.exception()):
            log.error("the consumer of %s stopped: %s (run() raises it)", self.queue, error)

    async def _abandon(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task})  # its own cleanup closes the connection
        if self._server is not None and self._server.started:
            await self._server.stop()
        self._server = None
        self._runners = []
        self._stopped = self._abort = False

    async def _prepare(self) -> None:
        settings, flags, loaded = self._settings, self._flags, self._loaded
        # The store is checked (initialised, answering) in a thread: it is a blocking call.
        dedupe = await asyncio.to_thread(
            dedupe_config,
            self._dedupe_dsn,
            loaded,
            queue=self.queue,
            vhost=settings.vhost,
            **self._dedupe_args,
        )
        config = await resolve_config(
            settings, loaded, self.queue, replace(flags, dedupe=dedupe), self._spec
        )
        # One AMQP connection first, so that an unreachable broker or refused credentials
        # raise here (the consumer's own connection loop retries them forever, as it should
        # once running).
        async with session(settings, name=f"rmqkit consume {self.queue} (check)"):
            pass
        metrics = self._build(config, cautious=False)
        if config.metrics_port is not None:
            server = HealthServer(metrics, port=config.metrics_port)
            await server.start()  # a port in use: ConfigError (78)
            self._server = server

    def _build(self, config: ConsumerConfig, *, cautious: bool) -> ConsumerMetrics:
        self._config = config
        metrics = self._metrics = ConsumerMetrics(config.queue, config.tier_names)
        metrics.otel = otel_metrics(self._settings.otel_metrics, config.queue)
        # One hook caller for every served queue, off their delivery paths (None: no hook).
        self._hook_runner = HookRunner(self._hooks) if self._hooks is not None else None
        # One consumer per served queue (the work queue and its lanes, or the partitions),
        # sharing the metrics (rmqkit.consumer.lanes).
        self._runners = [
            QueueConsumer(
                self._settings,
                one,
                self._loaded,
                metrics,
                cautious=cautious,
                keyring=self._keyring,
                missing_is_fatal=not cautious,
                hooks=self._hook_runner,
            )
            for one in (config, *config.siblings)
        ]
        for warning in dict.fromkeys(w for r in self._runners for w in r.config.warnings):
            log.warning("%s", warning)
        return metrics

    async def _until_consuming(self, task: asyncio.Task[None]) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._start_timeout_s
        while not self.consuming:
            if task.done():
                task.result()  # the fatal error that ended it; None: stopped while starting
                return
            if loop.time() >= deadline:
                metrics = self._metrics
                reason = (metrics.not_ready_reason() if metrics else None) or "not consuming"
                raise BrokerUnavailable(
                    f"{self.queue!r} not consumed after {self._start_timeout_s:g}s ({reason}) "
                    "— check the broker and the log"
                )
            await asyncio.wait({task}, timeout=_START_POLL_S)

    async def _serve(self) -> None:
        """Run every served queue's consumer until stopped; release everything after."""
        assert self._metrics is not None  # built by start() or _resolved()
        beat = asyncio.create_task(heartbeat(self._metrics))
        hooks = self._hook_runner
        calls = asyncio.create_task(hooks.run()) if hooks is not None else None
        try:
            for runner in self._runners:
                if runner.dedupe is not None:  # initialised (else 78) and answering (else 69)
                    await runner.dedupe.start()
            await run_consumers(self._runners)
            if hooks is not None:  # the last outcomes' hooks, bounded: one hook timeout
                await hooks.drain(hooks.hooks.timeout_s)
        finally:
            if calls is not None and hooks is not None:
                calls.cancel()
                hooks.close()
            self._stopped = True
            for runner in self._runners:
                if runner.dedupe is not None:
                    with contextlib.suppress(Exception):
                        await runner.dedupe.close()
                runner.close()
            beat.cancel()
            if self._server is not None:
                await self._server.stop()

    def request_stop(self, grace_s: float | None = None) -> None:
        """Begin a graceful stop and return at once (e.g. from a signal handler): as
        ``stop()``, without waiting for it."""
        if self._task is None and self._starting is not None and self._starting.locked():
            self._abort = True  # start() is preparing: it returns without consuming
        for runner in self._runners:
            if grace_s is not None:
                # Read by the drain when it begins; the grace given last wins.
                runner.config = replace(runner.config, grace_s=max(0.0, grace_s))
            runner.stop()

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop consuming: no new deliveries; the handlers in flight get ``grace_s`` (default:
        the ``grace_s`` given to the constructor) to finish and are settled; then the
        connection is closed. Messages still unfinished are not acked: the broker redelivers
        them. Before ``start()``, or again after a stop, it does nothing. A fatal error that
        ended the consumer is not raised here (``run()`` raises it; it was logged)."""
        self.request_stop(grace_s)
        if self._task is not None:
            await asyncio.wait({self._task})

    async def run(self) -> None:
        """Consume until stopped (``stop()``, or a fatal error, raised here); starts first if
        ``start()`` was not called. Cancelled, it stops at once: unsettled messages are not
        acked and come back."""
        if self._task is None:
            await self.start()
        task = self._task
        if task is None:  # stopped while starting
            return
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():
                task.cancel()
                await asyncio.wait({task})
            raise

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

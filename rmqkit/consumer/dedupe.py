"""`consume --dedupe DSN`: each delivery's handler runs in a store transaction that records its
message_id, so a redelivered or duplicated message takes effect once (issue 13).

Ids and the ordering guard's versions are recorded in the consumer's **scope**: by default its
vhost and work queue (``default_scope``; the work queue's lanes and partitions share it), so
the consumers of two queues bound to one exchange, sharing one database, each apply every
message; ``--dedupe-scope NAME`` gives consumers that must apply a message once between them
one scope.

``DedupeStep.handle(message)`` replaces the plain handler run on the dispatch path when the flag
is on (nothing here runs without it). It hands the handler call to rmqkit.idempotency's
``DedupeWorkers``, which batches several deliveries per transaction, and turns the verdict into
the outcome the dispatcher settles:

* applied → the handler's own outcome (Success: committed, then acked);
* duplicate (id already recorded, or recorded by a concurrent winner that committed) and stale
  (the ordering guard: not newer than its key's applied version) → Success without calling the
  handler: acked, logged and counted (``duplicates_total``, ``stale_total``);
* rolled back → the handler's failure: its writes and the id were rolled back; the usual
  retry/park decision follows;
* the store failed (unreachable, a transaction that could not commit) → a transient failure,
  retried through the wait queues like a handler error.

The message is acked only after the commit returned: a crash in between redelivers it, and the
redelivery is a duplicate.
"""

from __future__ import annotations

import contextlib
import logging
from time import perf_counter
from typing import Any

from rmqkit.consumer.config import ConsumerConfig, DedupeConfig
from rmqkit.consumer.decision import Failed, HandlerOutcome, HandlerTimeout, Success, Undecodable
from rmqkit.consumer.handler import LoadedHandler, run_handler
from rmqkit.consumer.logs import current_message
from rmqkit.consumer.message import Message
from rmqkit.consumer.metrics import ConsumerMetrics
from rmqkit.consumer.threads import HandlerThreads
from rmqkit.errors import ConfigError, UsageError
from rmqkit.guard import NO_VERSION, order_key
from rmqkit.idempotency import (
    DedupeVerdict,
    DedupeWorkers,
    HandlerEnd,
    OrderKey,
    WorkerOptions,
    default_scope,
    require_current,
)
from rmqkit.store import parse_dsn

log = logging.getLogger("rmqkit.consumer")
_SUCCESS = Success()


def dedupe_config(
    dsn: str | None,
    handler: LoadedHandler,
    *,
    connections: int | None = None,
    batch: int = 100,
    order_key_header: str | None = None,
    order_version_header: str | None = None,
    scope: str | None = None,
    queue: str = "",
    vhost: str = "/",
) -> DedupeConfig | None:
    """The ``--dedupe`` settings, checked at startup (None without ``--dedupe``).

    ``scope`` (``--dedupe-scope``) None: the work queue's own, ``default_scope(vhost, queue)``.
    A store in an older rmqkit's schema is refused (ConfigError, 78: ``dedupe init`` upgrades).

    A handler that takes a Transaction needs ``--dedupe`` (ConfigError, 78); the ordering
    headers need it and each other (UsageError, 2). The store must answer and have been
    initialised (``rmqkit dedupe init``): ConfigError (78) or DatabaseUnavailable (69).
    Connections default to 1 on SQLite (one writer at a time anyway); on PostgreSQL to 4 when
    handlers run one at a time per connection (they take the transaction, or the guard is on),
    else 2 (handlers of a batch run concurrently: fewer, fuller transactions are cheaper).
    """
    ordered = order_key_header is not None or order_version_header is not None
    if dsn is None:
        if handler.takes_transaction:
            raise ConfigError(
                f"handler '{handler.spec}' takes a rmqkit.Transaction: run it with --dedupe DSN "
                "(the store its writes and the message ids are committed in)"
            )
        if ordered:
            raise UsageError("--order-key-header/--order-version-header need --dedupe DSN")
        if scope is not None:
            raise UsageError("--dedupe-scope needs --dedupe DSN")
        return None
    if scope is not None and not scope.strip():
        raise UsageError("--dedupe-scope is empty: name the scope the consumers share")
    if ordered and (order_key_header is None or order_version_header is None):
        raise UsageError("--order-key-header and --order-version-header go together")
    parsed = parse_dsn(dsn)
    require_current(parsed)  # fails here, once, rather than in every worker
    if connections is None:
        if parsed.backend == "sqlite":
            connections = 1
        else:
            connections = 4 if handler.takes_transaction or ordered else 2
    return DedupeConfig(
        dsn=dsn,
        connections=connections,
        batch=batch,
        order_key_header=order_key_header,
        order_version_header=order_version_header,
        scope=scope if scope is not None else default_scope(vhost, queue),
    )


def _judge(outcome: HandlerOutcome) -> HandlerEnd:
    if type(outcome) is Success:
        return HandlerEnd.OK
    if type(outcome) is HandlerTimeout:
        return HandlerEnd.ABANDONED  # it may still hold the transaction
    return HandlerEnd.FAILED


class DedupeStep:
    """The dedupe path of one consumer process (see the module docstring)."""

    def __init__(
        self,
        config: ConsumerConfig,
        handler: LoadedHandler,
        metrics: ConsumerMetrics,
        threads: HandlerThreads | None,
        permanent: frozenset[str],
    ) -> None:
        assert config.dedupe is not None
        self.config = config
        self.handler = handler
        self.metrics = metrics
        self._threads = threads
        self._permanent = permanent
        dedupe = config.dedupe
        self._key_header = dedupe.order_key_header
        self._version_header = dedupe.order_version_header
        self.workers: DedupeWorkers[HandlerOutcome] = DedupeWorkers(
            WorkerOptions(
                dsn=dedupe.dsn,
                queue=config.queue,
                scope=dedupe.scope,
                connections=dedupe.connections,
                batch=dedupe.batch,
                pass_transaction=handler.takes_transaction,
                sync_connection=not handler.is_async,
                ordered=self._key_header is not None,
            ),
            _judge,
        )

    async def start(self) -> None:
        """Check the store and open the workers (ConfigError, exit 78, if not initialised)."""
        await self.workers.start()

    async def close(self) -> None:
        await self.workers.close()

    def _order(self, message: Message) -> OrderKey | str:
        """The guard's key and version from the headers, or why they are unusable."""
        value = message.headers.get(self._key_header or "")
        version = message.headers.get(self._version_header or "")
        # Its exact bytes: a byte-array key is never decoded (two keys would merge into one).
        key = order_key(value)
        if key is None:
            if value is None or value in ("", b""):
                return f"the ordering key header {self._key_header!r} is missing or empty"
            return (
                f"the ordering key header {self._key_header!r} is a {type(value).__name__}: "
                "a key is text, bytes or an integer"
            )
        if isinstance(version, bytes | bytearray | str):
            with contextlib.suppress(ValueError):
                version = int(version)
        if isinstance(version, bool) or not isinstance(version, int):
            return f"the ordering version header {self._version_header!r} is not an integer"
        if not NO_VERSION < version < 2**63:  # the column is BIGINT; NO_VERSION means "none"
            return (
                f"the ordering version header {self._version_header!r} is {version}: "
                "out of the 64-bit range"
            )
        return OrderKey(key, version)

    async def handle(self, message: Message) -> HandlerOutcome:
        """Run the handler on ``message`` inside its transaction; the outcome to settle."""
        order: OrderKey | None = None
        if self._key_header is not None:
            found = self._order(message)
            if isinstance(found, str):
                return Undecodable(found)
            order = found
        handler, config = self.handler, self.config
        context = (message.message_id, message.attempt)

        async def call(tx: Any) -> HandlerOutcome:
            current_message.set(context)  # the worker's task: log lines name this message
            started = perf_counter()
            outcome = await run_handler(
                handler,
                message,
                timeout_s=config.handler_timeout_s,
                permanent_types=self._permanent,
                executor=self._threads,
                transaction=tx,
            )
            self.metrics.observe_handler(perf_counter() - started)
            return outcome

        assert message.message_id  # the dispatcher parks messages without one first
        try:
            verdict, outcome = await self.workers.run(message.message_id, call, order)
        except Exception as exc:  # the store failed: transient, retried via the wait queues
            log.warning("dedupe store failed: %s: %s", type(exc).__name__, exc)
            return Failed.from_exception(exc)
        if verdict is DedupeVerdict.DUPLICATE:
            self.metrics.duplicate()
            log.info("duplicate: already processed, acked without calling the handler")
            return _SUCCESS
        if verdict is DedupeVerdict.STALE:
            self.metrics.stale()
            log.info(
                "stale: version %s of %r is not newer than the one applied; acked",
                order.version if order else "?",
                order.key if order else "?",
            )
            return _SUCCESS
        assert outcome is not None
        return outcome


__all__ = ["DedupeStep", "dedupe_config"]

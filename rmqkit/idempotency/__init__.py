"""The idempotency store: each message id recorded in the same transaction as its effects.

At-least-once delivery plus a consumer that records each message_id in the transaction of its
own writes gives exactly one effect per message (seeds 003 and 004). Public API:

* ``init_store(dsn, window_s=None)`` — create ``rmqkit_processed`` (and the ordering guard's
  ``rmqkit_versions``), upgrade a store an older rmqkit made, and record the retention window
  (``rmqkit dedupe init``);
* ``record(tx, message_id, scope=...)`` / ``await record_async(...)`` — inside the caller's
  open transaction: True if the id is new in its scope, False for a duplicate;
* ``default_scope(vhost, queue)`` — the scope ``rmqkit consume`` records in unless given one;
* ``Transaction`` — the annotation of a handler's second parameter under
  ``rmqkit consume --dedupe DSN``: the open connection of the message's transaction;
* ``dedupe_status(dsn)`` and ``prune(dsn, older_than_s=None, batch=10000)``
  (``rmqkit dedupe status|prune``);
* ``DedupeWorkers`` — what the consumer runs deliveries through (batched transactions).

The consumer side is described in docs/idempotency.md.
"""

from rmqkit.idempotency.maintenance import (
    DEFAULT_BATCH,
    DedupeStatus,
    PruneResult,
    ScopeRows,
    dedupe_status,
    prune,
    require_current,
)
from rmqkit.idempotency.record import Transaction, record, record_async
from rmqkit.idempotency.schema import (
    DEFAULT_WINDOW_S,
    PROCESSED_TABLE,
    default_scope,
    format_window,
    parse_window,
    schema_statements,
)
from rmqkit.idempotency.upgrade import InitResult, Upgrade, init_store
from rmqkit.idempotency.work import DedupeVerdict, HandlerEnd, OrderKey, WorkerOptions
from rmqkit.idempotency.workers import DedupeWorkers

__all__ = [
    "DEFAULT_BATCH",
    "DEFAULT_WINDOW_S",
    "PROCESSED_TABLE",
    "DedupeStatus",
    "DedupeVerdict",
    "DedupeWorkers",
    "HandlerEnd",
    "InitResult",
    "OrderKey",
    "PruneResult",
    "ScopeRows",
    "Transaction",
    "Upgrade",
    "WorkerOptions",
    "dedupe_status",
    "default_scope",
    "format_window",
    "init_store",
    "parse_window",
    "prune",
    "record",
    "record_async",
    "require_current",
    "schema_statements",
]

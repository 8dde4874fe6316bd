"""The idempotency store: each message id recorded in the same transaction as its effects.

At-least-once delivery plus a consumer that records each message_id in the transaction of its
own writes gives exactly one effect per message (seeds 003 and 004). Public API:

* ``init_store(dsn, window_s=None)`` — create ``rmqkit_processed`` (and the ordering guard's
  ``rmqkit_versions``) and record the retention window (``rmqkit dedupe init``);
* ``record(tx, message_id)`` / ``await record_async(tx, message_id)`` — inside the caller's
  open transaction: True if the id is new, False for a duplicate;
* ``Transaction`` — the annotation of a handler's second parameter under
  ``rmqkit consume --dedupe DSN``: the open connection of the message's transaction;
* ``dedupe_status(dsn)`` and ``prune(dsn, older_than_s=None, batch=10000)``
  (``rmqkit dedupe status|prune``);
* ``DedupeLanes`` — what the consumer runs deliveries through (batched transactions).

The consumer side is described in docs/idempotency.md.
"""

from rmqkit.idempotency.jobs import HandlerEnd, LaneOptions, OrderKey, Verdict
from rmqkit.idempotency.lanes import DedupeLanes
from rmqkit.idempotency.maintenance import (
    DEFAULT_BATCH,
    DedupeStatus,
    PruneResult,
    dedupe_status,
    prune,
)
from rmqkit.idempotency.record import Transaction, record, record_async
from rmqkit.idempotency.schema import (
    DEFAULT_WINDOW_S,
    PROCESSED_TABLE,
    InitResult,
    format_window,
    init_store,
    parse_window,
    schema_statements,
)

__all__ = [
    "DEFAULT_BATCH",
    "DEFAULT_WINDOW_S",
    "PROCESSED_TABLE",
    "DedupeLanes",
    "DedupeStatus",
    "HandlerEnd",
    "InitResult",
    "LaneOptions",
    "OrderKey",
    "PruneResult",
    "Transaction",
    "Verdict",
    "dedupe_status",
    "format_window",
    "init_store",
    "parse_window",
    "prune",
    "record",
    "record_async",
    "schema_statements",
]

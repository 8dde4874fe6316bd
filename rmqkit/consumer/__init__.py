"""The supervised consumer (``rmqkit consume``): worker processes that run a handler on each
message of one work queue, ack what succeeded and retry or park what failed, never losing one.

Who owns what:

* processes: ``supervisor`` (start N workers, restart the dead), ``worker`` (one process:
  logging, handler, health server, signals), ``threads`` (where plain ``def`` handlers run);
* the connection: ``runner`` (``QueueConsumer``: connect through ``rmqkit.broker.session``, QoS,
  consume, batched acks, reconnect, graceful drain), ``acks`` (which tags may be acked);
* one delivery: ``dispatch`` (``Dispatcher``: checks, handler, outcome), ``decision`` (the pure
  ack / retry / park decision), ``attempts`` (our attempt header and x-death, read by
  ``rmqkit.deaths``), ``copies``
  (retry/park copies, confirmed before the original is acked), ``refusals`` (backoff);
* ``--dedupe``: ``dedupe`` (``DedupeStep``: the handler in a store transaction that records the
  message id, through ``rmqkit.idempotency``; duplicate / stale / applied verdicts);
* the handler: ``loading`` (``module:function`` → ``LoadedHandler``, exit 78 on a bad one),
  ``handler`` (running it: timeouts, threads, outcomes), ``message`` (``rmqkit.Message`` and the
  exceptions a handler raises);
* configuration and checks: ``config`` (the queue's policy), ``wiring`` (dead-letter wiring);
* observability: ``metrics`` (``ConsumerMetrics``), ``health_server`` (``/metrics``,
  ``/healthz``, ``/readyz``), ``logs``.

The broker is reached only through ``rmqkit.broker``: AMQP in ``runner``, ``dispatch`` and
``copies`` (its session API), the management API in ``wiring``. Import the modules directly:
this package re-exports nothing, so importing one part never drags in the broker-facing ones.
"""

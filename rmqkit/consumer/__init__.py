"""The supervised consumer: attempt counting, the per-message decision, the runner and supervisor.

``rmqkit.consumer.attempts`` reads attempt counts and x-death; ``rmqkit.consumer.decision`` is the
pure ack / retry / park decision. Import them directly; this package re-exports nothing so that
importing one part never drags in the broker-facing ones.
"""

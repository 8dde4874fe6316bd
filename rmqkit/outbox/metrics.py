"""Prometheus metrics of one relay process (``rmqkit outbox relay --metrics-port P``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server


class RelayMetrics:
    """Counters of what the relay settled, and gauges of what is left (own registry)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.published = Counter(
            "rmqkit_outbox_published",
            "Rows published (confirmed) and marked",
            registry=self.registry,
        )
        self.returned = Counter(
            "rmqkit_outbox_returned",
            "Publishes the broker returned as unroutable (row stays pending)",
            registry=self.registry,
        )
        self.nacked = Counter(
            "rmqkit_outbox_nacked",
            "Publishes the broker refused (row stays pending)",
            registry=self.registry,
        )
        self.failed = Counter(
            "rmqkit_outbox_failed",
            "Rows not published for another reason: missing exchange, channel closed, bad headers",
            registry=self.registry,
        )
        self.pending = Gauge(
            "rmqkit_outbox_pending", "Rows not yet published", registry=self.registry
        )
        self.lag = Gauge(
            "rmqkit_outbox_lag_seconds",
            "Age of the oldest pending row (0 when none)",
            registry=self.registry,
        )

    def serve(self, port: int) -> None:
        """Serve /metrics on ``port`` (all interfaces) from a daemon thread."""
        start_http_server(port, registry=self.registry)

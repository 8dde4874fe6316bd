"""The consumer's semantic-convention metrics through the OpenTelemetry metrics API, for export
by the application's meter provider (OTLP, or any other exporter), beside Prometheus.

Off unless configured, as tracing is (``RMQKIT_OTEL_METRICS``: ``auto``, the default, is on when
``opentelemetry-api`` is installed and a meter provider from an SDK is set; ``on`` insists;
``off`` never). Off, ``ConsumerMetrics.otel`` is None and nothing is recorded twice.

Instruments (OpenTelemetry's names; attributes ``messaging.system`` = ``rabbitmq``,
``messaging.destination.name``, ``messaging.operation.name`` = ``process`` and
``rmqkit.outcome``), the same numbers as the Prometheus series of rmqkit.consumer.metrics:

* ``messaging.process.duration`` (histogram, s): a delivery from receipt to its outcome;
* ``messaging.client.consumed.messages`` (counter): deliveries handled, by outcome;
* ``messaging.client.sent.messages`` (counter): retry and park copies, by target and outcome;
* ``rmqkit.message.age`` (histogram, s): at handling, the time since the first publish.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, Literal

from rmqkit.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider

OtelMetricsMode = Literal["auto", "on", "off"]
SYSTEM: Final = "rabbitmq"

_provider: MeterProvider | None = None


def set_meter_provider(provider: MeterProvider | None) -> None:
    """Make rmqkit record into ``provider`` instead of OpenTelemetry's global one (None: back
    to the global). For applications that keep several providers, and for tests."""
    global _provider
    _provider = provider


class OtelMetrics:
    """The instruments of one consumer's work queue (``otel_metrics()`` makes it)."""

    def __init__(self, provider: MeterProvider, queue: str) -> None:
        from rmqkit._version import __version__

        meter = provider.get_meter("rmqkit", __version__)
        self._duration = meter.create_histogram(
            "messaging.process.duration",
            unit="s",
            description="Time from a delivery's receipt to its outcome.",
        )
        self._consumed = meter.create_counter(
            "messaging.client.consumed.messages",
            unit="{message}",
            description="Deliveries handled, by outcome.",
        )
        self._sent = meter.create_counter(
            "messaging.client.sent.messages",
            unit="{message}",
            description="Retry and park copies sent, by target queue and outcome.",
        )
        self._age = meter.create_histogram(
            "rmqkit.message.age",
            unit="s",
            description="At handling, the time since the message was first published.",
        )
        self.queue = queue
        self._base = {"messaging.system": SYSTEM, "messaging.destination.name": queue}
        self._by_outcome: dict[str, dict[str, Any]] = {}  # one attribute dict per outcome

    def processed(self, outcome: str, seconds: float) -> None:
        attributes = self._by_outcome.get(outcome)
        if attributes is None:
            attributes = self._by_outcome[outcome] = {
                **self._base,
                "messaging.operation.name": "process",
                "rmqkit.outcome": outcome,
            }
        self._duration.record(seconds, attributes)
        self._consumed.add(1, attributes)

    def sent(self, target: str, outcome: str) -> None:
        self._sent.add(
            1,
            {
                "messaging.system": SYSTEM,
                "messaging.destination.name": target,
                "rmqkit.outcome": outcome,
            },
        )

    def age(self, seconds: float) -> None:
        self._age.record(seconds, self._base)


def otel_metrics(mode: OtelMetricsMode, queue: str) -> OtelMetrics | None:
    """The OpenTelemetry instruments for ``queue`` in ``mode``; None when off.

    ``auto``: on when the API is installed and a meter provider from an SDK is set (the API's
    own are no-ops). ``on``: ConfigError (78) without the package."""
    if mode == "off":
        return None
    try:
        from opentelemetry import metrics
    except ImportError:
        if mode == "on":
            raise ConfigError(
                "RMQKIT_OTEL_METRICS=on needs OpenTelemetry: pip install 'rmqkit[otel]' (and "
                "an SDK meter provider with an exporter)"
            ) from None
        return None
    provider = _provider if _provider is not None else metrics.get_meter_provider()
    # The API's default providers (a proxy, a no-op) live in the API package; an SDK's do not.
    if mode == "auto" and type(provider).__module__.startswith("opentelemetry.metrics"):
        return None
    return OtelMetrics(provider, queue)


__all__ = ["OtelMetrics", "OtelMetricsMode", "otel_metrics", "set_meter_provider"]

"""OpenTelemetry tracing (``pip install 'rmqkit[otel]'``): W3C trace context carried in message
headers, one span per handling.

Off unless configured: with ``RMQKIT_TRACING=auto`` (the default) tracing is on when the
``opentelemetry-api`` package is installed and the application (or ``opentelemetry-instrument``)
has set a tracer provider; ``on`` requires both, ``off`` never traces. Off, the consumer's path
holds ``None`` and does no tracing work at all.

What travels in the headers (docs/observability.md):

* ``traceparent`` / ``tracestate`` (W3C): the context the next handling is a child of. Set by
  ``rmqkit publish``, the ``Publisher`` (a ``create`` span per message, child of the caller's
  span), ``outbox.add`` (the caller's span, carried through the relay) and ``parking replay``
  (a ``send`` span per message, child of the message's own trace). A retry or park copy keeps
  the original's, so every attempt is in the same trace.
* ``rmqkit-trace-link`` (``headers.TRACE_LINK``): the previous handling's span, as a
  traceparent. The next attempt's span links to it; so does a replay's.

Spans follow the messaging semantic conventions (``messaging.system`` ``rabbitmq``,
``messaging.operation.name``/``type``, ``messaging.destination.name``: the exchange of a publish,
the queue of a handling; ``messaging.message.id``, ``messaging.message.body.size``), plus
``rmqkit.attempt``, ``rmqkit.delivery_count``, ``rmqkit.outcome`` and ``rmqkit.parking_reason``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final, Literal, cast

from rmqkit import headers as h
from rmqkit.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer, TracerProvider

TracingMode = Literal["auto", "on", "off"]

TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"
SYSTEM: Final = "rabbitmq"

# A provider given to rmqkit alone (set_tracer_provider), else the global one.
_provider: TracerProvider | None = None
_active = False  # some component traces: the log filter adds trace ids


def set_tracer_provider(provider: TracerProvider | None) -> None:
    """Make rmqkit trace into ``provider`` instead of OpenTelemetry's global one (None: back to
    the global). For applications that keep several providers, and for tests."""
    global _provider
    _provider = provider


@functools.cache
def _api_installed() -> bool:
    try:
        import opentelemetry.trace  # noqa: F401
    except ImportError:
        return False
    return True


def tracing(mode: TracingMode = "auto") -> Tracing | None:
    """The tracing of a component (consumer, publisher, replay) in ``mode``; None when off.

    ``auto``: on when ``opentelemetry-api`` is installed and a tracer provider is configured
    (not the API's no-op default). ``on``: ConfigError (78) without the package.
    """
    global _active
    if mode == "off":
        return None
    if not _api_installed():
        if mode == "on":
            raise ConfigError(
                "RMQKIT_TRACING=on needs OpenTelemetry: pip install 'rmqkit[otel]' (and an SDK "
                "with an exporter, or run under opentelemetry-instrument)"
            )
        return None
    from opentelemetry import trace

    provider = _provider if _provider is not None else trace.get_tracer_provider()
    if mode == "auto" and isinstance(
        provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider
    ):
        return None
    from rmqkit._version import __version__

    _active = True
    return Tracing(provider.get_tracer("rmqkit", __version__))


def active() -> bool:
    """Whether any rmqkit component in this process traces (the log lines then carry ids)."""
    return _active


def current_span() -> Span:
    """The current span (a non-recording one when none is current)."""
    from opentelemetry import trace

    return trace.get_current_span()


def current_ids() -> tuple[str, str] | None:
    """(trace id, span id) of the current span, hex, or None (no valid span, or no API)."""
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes | bytearray | memoryview):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            return None
    return str(value)


class _Getter:
    """Reads W3C fields from AMQP headers (values may arrive as bytes)."""

    def get(self, carrier: Mapping[str, Any], key: str) -> list[str] | None:
        text = _text(carrier.get(key))
        return None if text is None else [text]

    def keys(self, carrier: Mapping[str, Any]) -> list[str]:
        return list(carrier)


_GETTER: Final = _Getter()


class Tracing:
    """Spans and header propagation for one component (``tracing()`` makes it)."""

    def __init__(self, tracer: Tracer) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.tracer = tracer
        self._w3c = TraceContextTextMapPropagator()

    # --- headers ------------------------------------------------------------------------------
    def inject(self, headers: MutableMapping[str, Any], context: Context | None = None) -> None:
        """Write ``context``'s (default: the current) span into ``headers`` as traceparent."""
        carrier: dict[str, str] = {}
        self._w3c.inject(carrier, context=context)
        headers.update(carrier)

    def extract(self, headers: Mapping[str, Any] | None) -> Context | None:
        """The context ``headers`` carry (None: none, or not a valid traceparent)."""
        if not headers or TRACEPARENT not in headers:
            return None
        from opentelemetry import trace

        # _GETTER is a Getter by shape (its base class would import the API at rmqkit's import)
        context = self._w3c.extract(headers, getter=cast(Any, _GETTER))
        if not trace.get_current_span(context).get_span_context().is_valid:
            return None
        return context

    def _links(self, headers: Mapping[str, Any] | None) -> list[Any]:
        """A link to the previous handling (``rmqkit-trace-link``), if the headers name one."""
        if not headers or h.TRACE_LINK not in headers:
            return []
        from opentelemetry import trace

        linked = self._w3c.extract({TRACEPARENT: _text(headers[h.TRACE_LINK]) or ""})
        span_context = trace.get_current_span(linked).get_span_context()
        if not span_context.is_valid:
            return []
        return [trace.Link(span_context, {"rmqkit.link": "previous handling"})]

    def link_to_current(self, headers: MutableMapping[str, Any]) -> None:
        """Name the current span in ``headers`` as the one the next handling links to."""
        carrier: dict[str, str] = {}
        self._w3c.inject(carrier)
        if TRACEPARENT in carrier:
            headers[h.TRACE_LINK] = carrier[TRACEPARENT]

    # --- spans --------------------------------------------------------------------------------
    @contextmanager
    def processing(
        self,
        headers: Mapping[str, Any] | None,
        *,
        queue: str,
        exchange: str,
        routing_key: str,
        message_id: str | None,
        body_size: int,
        delivery_tag: int,
    ) -> Iterator[Span]:
        """The current span while one delivery of ``queue`` is handled: a child of the context
        its headers carry, linked to the previous handling (a retry's, a replay's)."""
        from opentelemetry.trace import SpanKind

        attributes = _attributes("process", queue, routing_key, message_id, body_size)
        attributes["messaging.rabbitmq.message.delivery_tag"] = delivery_tag
        attributes["rmqkit.exchange"] = exchange
        with self.tracer.start_as_current_span(
            f"process {queue}",
            context=self.extract(headers),
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            links=self._links(headers),
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            yield span

    @contextmanager
    def sending(
        self,
        operation: Literal["create", "send"],
        *,
        exchange: str,
        routing_key: str,
        message_id: str | None,
        body_size: int,
        parent: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> Iterator[Span]:
        """A producer span for one message (``create``: the Publisher's, ``send``: a replay's),
        a child of ``parent``'s context (headers) or else of the current span; links to
        ``parent``'s previous handling. Inject it into the message's headers inside."""
        from opentelemetry.trace import SpanKind

        attributes = _attributes(operation, exchange, routing_key, message_id, body_size)
        with self.tracer.start_as_current_span(
            name or f"{operation} {exchange or '(default)'}",
            context=self.extract(parent),
            kind=SpanKind.PRODUCER,
            attributes=attributes,
            links=self._links(parent),
        ) as span:
            yield span


def _attributes(
    operation: str, destination: str, routing_key: str, message_id: str | None, body_size: int
) -> dict[str, Any]:
    """The semantic conventions' attributes every rmqkit span has."""
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.name": operation,
        "messaging.operation.type": operation,
        "messaging.destination.name": destination,
        "messaging.message.body.size": body_size,
    }
    if routing_key:
        attributes["messaging.rabbitmq.destination.routing_key"] = routing_key
    if message_id:
        attributes["messaging.message.id"] = message_id
    return attributes


def context_headers() -> dict[str, str]:
    """The caller's current span as W3C headers, when tracing is possible (the API installed
    and a valid span current); else empty. What ``outbox.add`` stores with a row."""
    if not _api_installed():
        return {}
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if not trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier


__all__ = [
    "TRACEPARENT",
    "TRACESTATE",
    "Tracing",
    "TracingMode",
    "active",
    "context_headers",
    "current_ids",
    "current_span",
    "set_tracer_provider",
    "tracing",
]

"""Prometheus metrics of one consumer process, and the state its health endpoints report.

``ConsumerMetrics`` owns a private ``CollectorRegistry`` (never prometheus_client's global one, so
several consumers in one process, and tests, do not collide). Every series carries the work queue
as a constant ``queue`` label. The methods the runner calls per message only add to plain
attributes (no ``labels()`` lookup, no lock, no dict building); a collector turns them into
series when ``/metrics`` is scraped.

Series (all prefixed ``rmqkit_consumer_``):

=====================  =========  ===============================================================
``received_total``     counter    deliveries taken from the work queue
``acked_total``        counter    deliveries acked (after success, or after a retry/park copy was
                                  confirmed)
``retried_total``      counter    copies sent to a wait queue, by ``tier`` (e.g. ``1s``)
``parked_total``       counter    copies sent to the parking queue, by ``reason``
``handler_seconds``    histogram  handler run time, buckets from 1 ms to 60 s
``in_flight``          gauge      handlers running now
``reconnects_total``   counter    connections re-established after a loss
``connected``          gauge      1 while the AMQP connection is open
``consuming``          gauge      1 while the consumer is registered on the queue
``queues_waiting``     gauge      served queues whose consumer waits: a queue it needs was
                                  deleted (or declared again with other arguments)
``stuck_handlers``     gauge      sync handler calls still running past their timeout (their
                                  threads cannot be stopped)
``handler_threads_``   counter    times stuck calls held all the spare handler threads and the
``exhausted_total``               worker process was recycled
``copies_refused_``    counter    retry/park copies the broker refused (nack: a full bounded
``total``                         queue; return: no such queue), by ``target`` queue
``cancelled_by_``      counter    times the broker cancelled the consumer (consumer timeout on
``broker_total``                  4.3, queue deleted); the consumer then reconnects
``duplicates_total``   counter    ``--dedupe``: deliveries whose message id was already recorded,
                                  acked without calling the handler
``stale_total``        counter    ordering guard: deliveries not newer than their key's applied
                                  version, acked without calling the handler
``superseded_total``   counter    ``--conflate-key-header``: deliveries a newer one with the same
                                  key replaced in the consumer's window, acked unhandled
=====================  =========  ===============================================================

Beside them, the messaging semantic conventions' metrics (OpenTelemetry's names in Prometheus
form; labels ``messaging_system="rabbitmq"`` and ``messaging_destination_name``: the work queue
a handling consumed from, or the queue a copy was sent to):

===========================================  =========  ==========================================
``messaging_process_duration_seconds``       histogram  a delivery from receipt to its outcome
                                                        (handler, and the copy's confirm), by
                                                        ``rmqkit_outcome``: acked, retried,
                                                        parked, requeued, superseded, failed
``messaging_client_consumed_messages_total`` counter    deliveries handled, by ``rmqkit_outcome``
``messaging_client_sent_messages_total``     counter    retry/park copies sent, by target queue
                                                        and ``rmqkit_outcome`` (retried, parked,
                                                        refused)
``rmqkit_consumer_message_age_seconds``      histogram  at handling, the time since the message
                                                        was first published (its AMQP timestamp,
                                                        which retry and park copies and replays
                                                        keep: the "critical time"); messages
                                                        without one are not observed
===========================================  =========  ==========================================

The HTTP endpoints that serve these numbers (``/metrics``, ``/healthz``, ``/readyz``) are
rmqkit.consumer.health_server's.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from itertools import accumulate
from typing import Final

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from rmqkit.headers import ParkingReason
from rmqkit.otel_metrics import OtelMetrics

PREFIX: Final = "rmqkit_consumer"

# Handler latency from 1 ms to 60 s (the longest sensible --handler-timeout); +Inf is implicit.
HANDLER_BUCKETS: Final[tuple[float, ...]] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)

# Message age from 1 s (the AMQP timestamp's resolution) to a week: retries and parking make
# ages of hours and days normal; +Inf is implicit.
AGE_BUCKETS: Final[tuple[float, ...]] = (
    1.0,
    5.0,
    15.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
    4 * 3600.0,
    86400.0,
    7 * 86400.0,
)
SYSTEM: Final = "rabbitmq"

# The Prometheus text exposition format generate_latest() writes. prometheus_client's own
# CONTENT_TYPE_LATEST names 1.0.0 in recent releases; the body is the 0.0.4 format either way.
METRICS_CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"


class ConsumerMetrics:
    """The metrics of one consumer of one work queue, in a registry of its own.

    ``retry_tiers`` are the tier labels (e.g. ``["1s", "5s"]``) and ``parking_reasons`` the reasons
    to pre-create (default: every ``rmqkit.headers.ParkingReason``), so that each series exists,
    at 0, from the first scrape. A tier or reason not listed still works: its series is created on
    first use.

    The per-message methods only bump plain Python numbers (tens of nanoseconds, against about a
    microsecond for each call into prometheus_client's locked metric objects); a collector
    registered in ``registry`` turns them into series when scraped. They are therefore **not
    thread-safe**: call them from the consumer's event loop thread (time a thread-pool handler
    around the ``await``, not inside the thread). ``render()`` may run at any time on that loop.

    Also the state behind the health endpoints: ``connected``, ``consuming`` and
    ``last_heartbeat`` (``time.monotonic()`` of the latest ``heartbeat()``; the construction time
    until the first call).
    """

    def __init__(
        self,
        queue: str,
        retry_tiers: Iterable[str] = (),
        parking_reasons: Iterable[str] = tuple(ParkingReason),
    ) -> None:
        self.queue = queue
        self._received = 0
        self._acked = 0
        self._retried: dict[str, int] = {str(t): 0 for t in retry_tiers}
        self._parked: dict[str, int] = {str(r): 0 for r in parking_reasons}
        # Non-cumulative counts per bucket of HANDLER_BUCKETS, the last one for +Inf.
        self._handler_buckets = [0] * (len(HANDLER_BUCKETS) + 1)
        self._handler_sum = 0.0
        self._in_flight = 0
        self._reconnects = 0
        self._stuck_handlers = 0
        self._threads_exhausted = 0
        self._copies_refused: dict[str, int] = {}
        self._cancelled_by_broker = 0
        self._duplicates = 0
        self._stale = 0
        self._superseded = 0
        # The semantic conventions' series: per outcome, non-cumulative bucket counts (the
        # last one for +Inf) and the sum of process durations; sent copies per target/outcome.
        self._process: dict[str, list[int]] = {}
        self._process_sum: dict[str, float] = {}
        self._sent: dict[tuple[str, str], int] = {}
        self._age_buckets = [0] * (len(AGE_BUCKETS) + 1)
        self._age_sum = 0.0
        # The same numbers through the OpenTelemetry metrics API (rmqkit.otel_metrics), for
        # OTLP export; None: off, recorded here only.
        self.otel: OtelMetrics | None = None
        self.threads_exhausted_now = False  # until the worker is recycled: not ready
        # Per queue served (a worker serves a work queue's lanes or partitions too, each with
        # its own connection): ready only when every one of them is connected and consuming.
        self._connected: dict[str, bool] = {}
        self._consuming: dict[str, bool] = {}
        # Per queue served: why its consumer waits instead of consuming (a queue it needs was
        # deleted, or declared again with other arguments); /readyz says so first.
        self._waiting: dict[str, str] = {}
        self.last_heartbeat = time.monotonic()

        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_Collector(self))

    # --- per message (hot path) ------------------------------------------------------------

    def received(self) -> None:
        self._received += 1

    def acked(self, n: int = 1) -> None:
        self._acked += n

    def retried(self, tier: str) -> None:
        try:
            self._retried[tier] += 1
        except KeyError:
            self._retried[str(tier)] = 1

    def parked(self, reason: str) -> None:
        try:
            self._parked[reason] += 1
        except KeyError:
            self._parked[str(reason)] = 1

    def observe_handler(self, seconds: float) -> None:
        self._handler_buckets[bisect_left(HANDLER_BUCKETS, seconds)] += 1
        self._handler_sum += seconds

    def processed(self, outcome: str, seconds: float) -> None:
        """A delivery's handling ended with ``outcome`` after ``seconds`` from its receipt."""
        try:
            buckets = self._process[outcome]
        except KeyError:
            buckets = self._process[outcome] = [0] * (len(HANDLER_BUCKETS) + 1)
            self._process_sum[outcome] = 0.0
        buckets[bisect_left(HANDLER_BUCKETS, seconds)] += 1
        self._process_sum[outcome] += seconds
        if self.otel is not None:
            self.otel.processed(outcome, seconds)

    def sent(self, target: str, outcome: str) -> None:
        """A retry/park copy to ``target``: ``outcome`` retried, parked or refused."""
        key = (target, outcome)
        self._sent[key] = self._sent.get(key, 0) + 1
        if self.otel is not None:
            self.otel.sent(target, outcome)

    def observe_age(self, seconds: float) -> None:
        """A message handled ``seconds`` after it was first published."""
        self._age_buckets[bisect_left(AGE_BUCKETS, seconds)] += 1
        self._age_sum += seconds
        if self.otel is not None:
            self.otel.age(seconds)

    def in_flight_inc(self) -> None:
        self._in_flight += 1

    def in_flight_dec(self) -> None:
        self._in_flight -= 1

    # --- connection state and liveness -----------------------------------------------------

    def reconnected(self) -> None:
        self._reconnects += 1

    def set_connected(self, connected: bool, queue: str = "") -> None:
        """Whether the consumer of ``queue`` (one of the worker's queues) is connected."""
        self._connected[queue] = connected

    def set_consuming(self, consuming: bool, queue: str = "") -> None:
        """Whether the consumer of ``queue`` is registered with the broker."""
        self._consuming[queue] = consuming

    def consuming_queue(self, queue: str) -> bool:
        """Whether the consumer of ``queue`` is registered with the broker (False before)."""
        return self._consuming.get(queue, False)

    @property
    def connected(self) -> bool:
        """Every queue's consumer is connected (False before the first connection)."""
        return bool(self._connected) and all(self._connected.values())

    @property
    def consuming(self) -> bool:
        """Every queue's consumer is consuming."""
        return bool(self._consuming) and all(self._consuming.values())

    def _not(self, states: dict[str, bool]) -> str:
        names = [queue for queue, up in states.items() if not up and queue]
        return f" ({', '.join(names)})" if names and len(states) > 1 else ""

    def set_waiting(self, queue: str, reason: str | None) -> None:
        """The consumer of ``queue`` waits (``reason``: what for) or no longer does (None)."""
        if reason is None:
            self._waiting.pop(queue, None)
        else:
            self._waiting[queue] = reason

    def set_stuck_handlers(self, stuck: int) -> None:
        """Sync handler calls still running past their timeout."""
        self._stuck_handlers = stuck

    def threads_exhausted(self) -> None:
        """Stuck calls hold the handler threads: counted, and /readyz fails from now on."""
        self._threads_exhausted += 1
        self.threads_exhausted_now = True

    def copy_refused(self, target: str) -> None:
        """A retry/park copy to ``target`` was refused (nacked or returned)."""
        self._copies_refused[target] = self._copies_refused.get(target, 0) + 1

    def duplicate(self) -> None:
        """``--dedupe``: a message whose id was already recorded, acked without the handler."""
        self._duplicates += 1

    def stale(self) -> None:
        """The ordering guard: a message not newer than its key's version, acked unhandled."""
        self._stale += 1

    def superseded(self) -> None:
        """Conflation: a newer message with the same key replaced this one; acked unhandled."""
        self._superseded += 1

    def cancelled_by_broker(self, queue: str = "") -> None:
        """The broker cancelled the consumer of ``queue`` (basic.cancel)."""
        self._cancelled_by_broker += 1
        self._consuming[queue] = False

    def heartbeat(self) -> None:
        """Called periodically by the runner's loop; ``/healthz`` fails when it stops."""
        self.last_heartbeat = time.monotonic()

    def heartbeat_age(self) -> float:
        """Seconds since the latest ``heartbeat()``."""
        return time.monotonic() - self.last_heartbeat

    def not_ready_reason(self) -> str | None:
        """Why the consumer is not ready, or None when it is (connected and consuming)."""
        if self.threads_exhausted_now:
            return (
                f"handler threads exhausted by {self._stuck_handlers} stuck handler call(s); "
                "the worker is being recycled"
            )
        if self._waiting:
            return "; ".join(self._waiting[q] for q in sorted(self._waiting))
        if not self.connected:
            return "not connected to the broker" + self._not(self._connected)
        if not self.consuming:
            return "connected but not consuming" + self._not(self._consuming)
        return None

    # --- exposition -------------------------------------------------------------------------

    def render(self) -> bytes:
        """All series in the Prometheus text format (``METRICS_CONTENT_TYPE``)."""
        return generate_latest(self.registry)


class _Collector(Collector):
    """Reads a ConsumerMetrics' numbers into metric families at scrape time."""

    def __init__(self, metrics: ConsumerMetrics) -> None:
        self._m = metrics

    def collect(self) -> Iterator[Metric]:
        m = self._m
        q = [m.queue]

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=["queue"])
            family.add_metric(q, value)
            return family

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=["queue"])
            family.add_metric(q, value)
            return family

        def by(name: str, doc: str, label: str, counts: dict[str, int]) -> CounterMetricFamily:
            family = CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=["queue", label])
            for key, count in list(counts.items()):  # a copy: the loop thread may add keys
                family.add_metric([m.queue, key], count)
            return family

        yield counter("received", "Deliveries taken from the work queue.", m._received)
        yield counter(
            "acked",
            "Deliveries acked (after success, or once their retry/park copy was confirmed).",
            m._acked,
        )

        yield by("retried", "Copies published to a wait queue, by retry tier.", "tier", m._retried)
        yield by(
            "parked",
            "Copies published to the parking queue, by parking reason.",
            "reason",
            m._parked,
        )

        handler = HistogramMetricFamily(
            f"{PREFIX}_handler_seconds",
            "Time the handler took, successful or not.",
            labels=["queue"],
        )
        handler.add_metric(q, _cumulative(_BUCKET_LABELS, m._handler_buckets), m._handler_sum)
        yield handler
        yield from _conventions(m)

        yield gauge("in_flight", "Handlers running now.", m._in_flight)
        yield counter("reconnects", "AMQP connections re-established after a loss.", m._reconnects)
        yield gauge("connected", "1 while the AMQP connection is open.", int(m.connected))
        yield gauge(
            "consuming", "1 while the consumer is registered on the work queue.", int(m.consuming)
        )
        yield gauge(
            "queues_waiting",
            "Served queues not consumed because a queue they need is missing or changed.",
            len(m._waiting),
        )
        yield gauge(
            "stuck_handlers",
            "Sync handler calls still running past their timeout (threads cannot be stopped).",
            m._stuck_handlers,
        )
        yield counter(
            "handler_threads_exhausted",
            "Times stuck handler calls held all spare handler threads (worker recycled).",
            m._threads_exhausted,
        )
        yield by(
            "copies_refused",
            "Retry/park copies the broker refused (nacked or returned), by target queue.",
            "target",
            m._copies_refused,
        )
        yield counter(
            "cancelled_by_broker",
            "Times the broker cancelled the consumer (consumer timeout, queue deleted).",
            m._cancelled_by_broker,
        )
        yield counter(
            "duplicates",
            "Deliveries whose message id was already recorded (--dedupe): acked, not handled.",
            m._duplicates,
        )
        yield counter(
            "stale",
            "Deliveries not newer than their key's applied version (ordering guard): acked.",
            m._stale,
        )
        yield counter(
            "superseded",
            "Deliveries replaced by a newer one with the same key (conflation): acked.",
            m._superseded,
        )


# As prometheus_client writes them ("0.001", "60.0"); repr is exact for these bounds.
_BUCKET_LABELS: Final = (*(repr(float(b)) for b in HANDLER_BUCKETS), "+Inf")
_AGE_LABELS: Final = (*(repr(float(b)) for b in AGE_BUCKETS), "+Inf")


__all__ = [
    "HANDLER_BUCKETS",
    "METRICS_CONTENT_TYPE",
    "ConsumerMetrics",
]


def _conventions(m: ConsumerMetrics) -> Iterator[Metric]:
    """The messaging semantic conventions' series (see the module docstring)."""
    base = ["messaging_system", "messaging_destination_name"]
    duration = HistogramMetricFamily(
        "messaging_process_duration_seconds",
        "Time from a delivery's receipt to its outcome (handler and copy confirm).",
        labels=[*base, "messaging_operation_name", "rmqkit_outcome"],
    )
    consumed = CounterMetricFamily(
        "messaging_client_consumed_messages",
        "Deliveries handled, by outcome.",
        labels=[*base, "rmqkit_outcome"],
    )
    for outcome, buckets in list(m._process.items()):
        cumulative = _cumulative(_BUCKET_LABELS, buckets)
        duration.add_metric(
            [SYSTEM, m.queue, "process", outcome], cumulative, m._process_sum[outcome]
        )
        consumed.add_metric([SYSTEM, m.queue, outcome], cumulative[-1][1])
    yield duration
    yield consumed
    sent = CounterMetricFamily(
        "messaging_client_sent_messages",
        "Retry and park copies sent, by target queue and outcome.",
        labels=[*base, "rmqkit_outcome"],
    )
    for (target, outcome), count in list(m._sent.items()):
        sent.add_metric([SYSTEM, target, outcome], count)
    yield sent
    age = HistogramMetricFamily(
        f"{PREFIX}_message_age_seconds",
        "At handling, seconds since the message was first published (its AMQP timestamp).",
        labels=["queue"],
    )
    age.add_metric([m.queue], _cumulative(_AGE_LABELS, m._age_buckets), m._age_sum)
    yield age


def _cumulative(labels: tuple[str, ...], counts: list[int]) -> list[tuple[str, float]]:
    """Per-bucket counts as a Prometheus histogram's cumulative (le, count) pairs."""
    return [(le, float(n)) for le, n in zip(labels, accumulate(counts), strict=True)]

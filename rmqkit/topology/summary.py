"""What ``plan`` says about each work queue: retries, retention, parking, and its flow keys
(lanes, partitions, single active consumer, default delay, encryption)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rmqkit.durations import format_duration_ms
from rmqkit.topology.model import Topology
from rmqkit.topology.schema import format_retention_ms


@dataclass(frozen=True)
class WorkQueueSummary:
    """What happens to a work queue's messages, as ``plan`` states it: the retry ladder, the
    attempts, the retention, where they park, and how they are spread (lanes, partitions)."""

    name: str
    retry_delays_ms: tuple[int, ...]
    default_retries: bool  # the file does not say retry_delays: the default ladder applies
    max_attempts: int
    retention_ms: int | None
    parking: str
    lanes: tuple[tuple[str, str, str], ...] = ()  # (lane, queue, what it takes)
    partitions: tuple[str, ...] = ()
    partition_key: str | None = None  # the header hashed (None: the routing key)
    partition_exchange: str | None = None
    partition_exchange_type: str | None = None  # x-consistent-hash or x-modulus-hash
    partition_note: str = ""  # why the broker's exchange type is kept, if it is not the file's
    single_active_consumer: bool = False
    delay_ms: int | None = None
    encrypt: tuple[str, ...] = ()  # the fields encrypted at the edge ((): none)
    blind_index: tuple[str, ...] = ()
    broker_retry: bool = False  # retry_engine = "broker": the work queue's own delayed retry

    def text(self) -> str:
        """``orders.work: retries 1s, 5s (max_attempts 3); retention 4d; parks in …``, then
        the flow keys the file sets (nothing more for a queue that sets none)."""
        if self.retry_delays_ms:
            ladder = ", ".join(format_duration_ms(d) for d in self.retry_delays_ms)
            retries = f"retries {ladder}" + (
                " (the default ladder)" if self.default_retries else ""
            )
            retries += f", max_attempts {self.max_attempts}"
            if self.broker_retry:
                retries += " (held back by the broker: delayed retry, no jitter, no wait queues)"
        else:
            retries = "no retries (retry_delays = []): a transient failure parks at once"
        retention = (
            f"retention {format_retention_ms(self.retention_ms)}, then parked as expired"
            if self.retention_ms is not None
            else "no retention limit"
        )
        parts = [f"{self.name}: {retries}", retention, f"parks in {self.parking}"]
        if self.lanes:
            shown = ", ".join(f"{queue} ({what})" for _, queue, what in self.lanes)
            parts.append(f"lanes {shown}, else {self.name}")
        if self.partitions:
            by = f"header {self.partition_key}" if self.partition_key else "the routing key"
            kind = self.partition_exchange_type or ""
            if self.partition_note:
                kind += f", {self.partition_note}"
            parts.append(
                f"{len(self.partitions)} partitions {self.partitions[0]}…{self.partitions[-1]} "
                f"by {by} through {self.partition_exchange} ({kind}; one active consumer each)"
            )
        elif self.single_active_consumer:
            parts.append("single active consumer")
        if self.delay_ms is not None:
            parts.append(f"default delay {format_duration_ms(self.delay_ms)} (delay ladder)")
        if self.encrypt:
            parts.append(
                f"encrypts {', '.join(self.encrypt)}"
                + (f" (blind index {', '.join(self.blind_index)})" if self.blind_index else "")
            )
        return "; ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "retry_delays_ms": list(self.retry_delays_ms),
            "default_retries": self.default_retries,
            "max_attempts": self.max_attempts,
            "retention_ms": self.retention_ms,
            "parking": self.parking,
            "lanes": [{"name": n, "queue": q, "takes": w} for n, q, w in self.lanes],
            "partitions": list(self.partitions),
            "partition_key": self.partition_key,
            "partition_exchange": self.partition_exchange,
            "partition_exchange_type": self.partition_exchange_type,
            "partition_note": self.partition_note,
            "single_active_consumer": self.single_active_consumer,
            "delay_ms": self.delay_ms,
            "encrypt": list(self.encrypt),
            "blind_index": list(self.blind_index),
            "retry_engine": "broker" if self.broker_retry else "queues",
        }


def _takes(header: dict[str, Any], body_over: int | None) -> str:
    tests = [f"{k}={v}" for k, v in header.items()]
    if body_over is not None:
        tests.append(f"body over {body_over} bytes")
    return " and ".join(tests)


def summarize(topology: Topology, name: str, partition_type: str | None = None) -> WorkQueueSummary:
    """The summary of work queue ``name`` (as named in the file); ``partition_type``: the type
    of its partition exchange on the broker at hand, if it is partitioned."""
    spec = topology.model.queues[name]
    partitioned = bool(spec.partitions)
    return WorkQueueSummary(
        name=name,
        retry_delays_ms=tuple(spec.retry_delays),
        default_retries="retry_delays" not in spec.model_fields_set,
        max_attempts=spec.max_attempts,
        retention_ms=spec.retention,
        parking=topology.parking_name(name),
        lanes=tuple(
            (
                lane.name,
                lane.queue,
                _takes(spec.lanes[lane.name].header, spec.lanes[lane.name].body_over),
            )
            for lane in topology.lanes_of(name)
        ),
        partitions=tuple(topology.partitions_of(name)),
        partition_key=spec.partition_key,
        partition_exchange=topology.partition_exchange(name),
        partition_exchange_type=partition_type if partitioned else None,
        single_active_consumer=spec.single_active_consumer,
        delay_ms=spec.delay,
        encrypt=tuple(spec.sensitive_fields) if spec.encrypt else (),
        blind_index=tuple(spec.blind_index) if spec.encrypt else (),
        broker_retry=spec.retry_engine == "broker",
    )

"""The topology file: TOML, validated by pydantic, errors naming the file, key path and line."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    model_validator,
)

from rmqkit import names
from rmqkit.delay.ladder import DEFAULT_BITS, DEFAULT_UNIT_MS
from rmqkit.durations import format_duration_ms, parse_delay_ms, parse_duration_ms
from rmqkit.errors import TopologyFileError
from rmqkit.topology import lanes
from rmqkit.topology.sources import find_line, key_path, pydantic_message

BUILTIN_EXCHANGE_PREFIX = "amq."


def _duration_text(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, str):
        raise ValueError(
            f'bad duration {value!r}: write it as a string with a unit, e.g. "5s" or "500ms"'
        )
    return value


def _duration(value: Any) -> int:
    return parse_duration_ms(_duration_text(value))


DurationMs = Annotated[int, BeforeValidator(_duration)]
"""A duration written as ``"500ms"``/``"5s"``/``"2m"``/``"1h"``, held in milliseconds."""


def _delay(value: Any) -> int | None:
    """A default delay: any spelling of zero (``"0s"``, ``"0m"``, ``"0.0s"``) means none."""
    if value is None:
        return None
    return parse_delay_ms(_duration_text(value)) or None


DelayMs = Annotated[int | None, BeforeValidator(_delay)]
"""A queue's default delay in milliseconds; a zero duration is None (no delay)."""

DAY_MS = 86_400_000
# RabbitMQ stores message-ttl as a 32-bit millisecond count: about 49.7 days.
MAX_TTL_MS = 2**32 - 1


def _retention(value: Any) -> int:
    """A retention period: a duration, or whole days (``"4d"``), as retention is usually said."""
    if isinstance(value, str) and value.strip().endswith("d") and not value.strip()[:-1].isalpha():
        days = value.strip()[:-1].strip()
        try:
            ms = round(float(days) * DAY_MS)
        except ValueError:
            raise ValueError(f'bad retention {value!r}: write e.g. "4d", "12h" or "30m"') from None
    else:
        ms = _duration(value)
    if not 0 < ms <= MAX_TTL_MS:
        raise ValueError(
            f"bad retention {value!r}: must be above zero and at most 49d (RabbitMQ's limit for "
            "a message TTL)"
        )
    return ms


def format_retention_ms(ms: int) -> str:
    """``4d`` for whole days, else as any other duration (``36h``, ``2s``)."""
    return f"{ms // DAY_MS}d" if ms % DAY_MS == 0 else format_duration_ms(ms)


RetentionMs = Annotated[int, BeforeValidator(_retention)]
"""A retention period (``"4d"``, ``"12h"``, ``"2s"``), held in milliseconds."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ExchangeModel(_Strict):
    """``[exchanges.NAME]``."""

    type: Literal["direct", "topic", "fanout", "headers"] = "direct"
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    alternate_exchange: str | None = None
    arguments: dict[str, Any] = Field(default_factory=dict)


class BindModel(_Strict):
    """One entry of a work queue's ``bind = [...]``."""

    exchange: str
    routing_key: str = ""
    arguments: dict[str, Any] = Field(default_factory=dict)


# The retry ladder of a work queue whose file does not say `retry_delays` (docs/topology.md).
# One tier per retry that the default max_attempts (5) allows, each about 6-10x the one before:
# 1 s absorbs a blip (a lock, a dropped connection), 10 s a dependency restarting, 1 m a
# failover, 5 m a short outage or a deploy. Past ~6 minutes in all, parking and a replay after
# the fix serve better than more waiting. Without it a file that forgot the key parked every
# message on its first transient failure.
DEFAULT_RETRY_DELAYS_MS: tuple[int, ...] = (1_000, 10_000, 60_000, 300_000)


# The largest default delay a queue may ask for: the default delay ladder's reach (rmqkit.delay:
# 100 ms units, 20 rungs, about 29 h). Checked here so that a file cannot promise a delay that
# `publish` would refuse message by message.
MAX_DEFAULT_DELAY_MS = DEFAULT_UNIT_MS * (2**DEFAULT_BITS - 1)
MAX_PARTITIONS = 256


class LaneModel(_Strict):
    """``[queues.NAME.lanes.LANE]``: a lane of a work queue, its own quorum queue
    ``NAME.lane.LANE`` that rmqkit publishers send matching messages to (docs/topology.md).

    ``header``: every given header must have this value; ``body_over``: the body is strictly
    larger than this many bytes. Both given: both must hold. ``prefetch``/``concurrency``: the
    consumer's for this lane (None: the work queue's).
    """

    header: dict[str, str | int | bool] = Field(default_factory=dict)
    body_over: int | None = Field(default=None, ge=0)
    prefetch: int | None = Field(default=None, ge=1, le=65535)
    concurrency: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _says_what_it_takes(self) -> LaneModel:
        if not self.header and self.body_over is None:
            raise ValueError(
                "a lane needs header = {...} and/or body_over = BYTES (which messages it takes)"
            )
        return self


class QueueModel(_Strict):
    """``[queues.NAME]``: a work queue with its wait queues and parking queue.

    ``retry_delays``: one wait-queue tier per delay, tried in order (attempt 1 → the first tier;
    the last tier repeats while attempts remain). Left out, the default ladder
    ``DEFAULT_RETRY_DELAYS_MS`` applies: 1s, 10s, 1m, 5m (one tier per retry of the default
    ``max_attempts = 5``). An explicit ``retry_delays = []`` means no retries: a transient
    failure parks the message as ``exhausted`` at once.
    """

    bind: list[BindModel] = Field(default_factory=list)
    retry_delays: list[DurationMs] = Field(default_factory=lambda: list(DEFAULT_RETRY_DELAYS_MS))
    max_attempts: int = Field(default=5, ge=1)
    delivery_limit: int = Field(default=10, ge=1)
    max_length: int | None = Field(default=None, ge=1)
    max_length_bytes: int | None = Field(default=None, ge=1)
    prefetch: int = Field(default=200, ge=1, le=65535)
    parking: str | None = None
    # Jitter: each delay tier is split into `jitter_slots` wait queues whose TTLs are spread
    # evenly over [delay * (1 - jitter), delay]; a burst of failures spreads over that window
    # without per-message TTLs (which block each other at the head of one queue).
    # jitter = 1.0 is full jitter: the consumer draws each wait uniformly over [0, delay].
    jitter: float = Field(default=0.5, ge=0.0, le=1.0)
    jitter_slots: int = Field(default=5, ge=1, le=20)
    permanent_errors: list[str] = Field(default_factory=list)
    handler_timeout: DurationMs | None = None
    require_message_id: bool = False
    max_message_bytes: int | None = Field(default=None, ge=1)
    # Retention: a message that has waited this long in the work queue (since it entered it:
    # first publish, or its return from a retry) leaves it into the parking queue with x-death
    # reason "expired", never dropped: the work queue's message-ttl, dead-lettered at-least-once
    # through the same wiring as the delivery limit. None: messages wait as long as it takes.
    retention: RetentionMs | None = None
    # Body and header fields masked in every parking view (list, show, export with --redact).
    sensitive_fields: list[str] = Field(default_factory=list)
    # encrypt = true: publish / outbox.add encrypt the sensitive_fields with the key ring
    # (docs/encryption.md); blind_index: those of them that also get an HMAC for --match.
    # Strict: a quoted "no" or 1 is an error, not silently a boolean.
    encrypt: StrictBool = False
    blind_index: list[str] = Field(default_factory=list)
    # The delay publish / outbox.add apply by default to messages routed here (delay ladder).
    delay: DelayMs = None
    # Lanes (file order = match order), a single active consumer, or N partitions by a header.
    lanes: dict[str, LaneModel] = Field(default_factory=dict)
    single_active_consumer: StrictBool = False
    partitions: int | None = Field(default=None, ge=2, le=MAX_PARTITIONS)
    partition_key: str | None = None


class BindingModel(_Strict):
    """``[[bindings]]``: a plain binding between objects of the file."""

    source: str
    destination: str
    destination_type: Literal["queue", "exchange"] = "queue"
    routing_key: str = ""
    arguments: dict[str, Any] = Field(default_factory=dict)


class TopologyModel(_Strict):
    """A whole topology file."""

    policy_priority: int = Field(default=10, ge=0, le=1000)
    exchanges: dict[str, ExchangeModel] = Field(default_factory=dict)
    queues: dict[str, QueueModel] = Field(default_factory=dict)
    bindings: list[BindingModel] = Field(default_factory=list)


class Topology:
    """A validated topology file and where it came from.

    Work queues are the file's ``[queues.NAME]``; a lane (``NAME.lane.LANE``) or partition
    (``NAME.pI``) queue is a work queue too, derived from its parent: ``queue_spec`` resolves
    either, so consumers, parking and status treat them alike.
    """

    def __init__(self, model: TopologyModel, source: str) -> None:
        self.model = model
        self.source = source
        self._derived = lanes.derived_queues(model)

    def parent_of(self, queue: str) -> str | None:
        """The file's work queue that ``queue`` is (itself) or serves (a lane or partition)."""
        if queue in self.model.queues:
            return queue
        return self._derived.get(queue)

    def work_queue_names(self) -> list[str]:
        """Every queue a consumer may serve: the file's work queues (a partitioned one excepted,
        it is not a queue on the broker), each followed by its lanes or partitions."""
        out: list[str] = []
        for name, spec in self.model.queues.items():
            if not spec.partitions:
                out.append(name)
            out.extend(q for q, parent in self._derived.items() if parent == name)
        return out

    def queue_spec(self, name: str) -> QueueModel:
        """The settings of work queue ``name``: a file's work queue, or a lane or partition
        queue (the parent's settings; its own prefetch for a lane; one active consumer for a
        partition; the parent's parking queue). KeyError for any other name."""
        parent = self.parent_of(name)
        if parent is None:
            raise KeyError(f"{self.source} has no work queue {name!r}")
        spec = self.model.queues[parent]
        if parent == name:
            return spec
        update: dict[str, Any] = {
            "parking": self.parking_name(parent),
            "lanes": {},
            "partitions": None,
            "partition_key": None,
            "bind": [],
        }
        lane = name.removeprefix(names.lane_queue(parent, ""))
        if name.startswith(names.lane_queue(parent, "")) and lane in spec.lanes:
            update["prefetch"] = spec.lanes[lane].prefetch or spec.prefetch
        else:
            update["single_active_consumer"] = True
        return spec.model_copy(update=update)

    def parking_name(self, queue: str) -> str:
        """The parking queue of work queue ``queue`` (a lane's or partition's: its parent's)."""
        parent = self.parent_of(queue)
        if parent is None:
            raise KeyError(f"{self.source} has no work queue {queue!r}")
        return self.model.queues[parent].parking or names.parking_queue(parent)

    def wait_name(self, queue: str, delay_ms: int) -> str:
        """The main wait queue of one delay tier (TTL = the full delay)."""
        return names.wait_queue(queue, delay_ms)

    def lanes_of(self, work_queue: str) -> list[lanes.LaneSpec]:
        """The lanes of a file's work queue, in match order ([] without lanes)."""
        return lanes.lane_specs(work_queue, self.model.queues[work_queue])

    def lane_for(self, work_queue: str, headers: Mapping[str, Any] | None, body_size: int) -> str:
        """The queue to publish a message for ``work_queue`` to: its first matching lane's
        queue, else ``work_queue`` itself."""
        return lanes.choose_lane(work_queue, self.model.queues[work_queue], headers, body_size)

    def partitions_of(self, work_queue: str) -> list[str]:
        """The partition queues of a partitioned work queue, p0 first ([] if not partitioned)."""
        count = self.model.queues[work_queue].partitions or 0
        return [names.partition_queue(work_queue, i) for i in range(count)]

    def partition_exchange(self, work_queue: str) -> str | None:
        """The consistent-hash exchange of a partitioned work queue (None if not partitioned)."""
        if not self.model.queues[work_queue].partitions:
            return None
        return names.partition_exchange(work_queue)

    def work_queues_for(
        self, exchange: str, routing_key: str, headers: Mapping[str, Any] | None = None
    ) -> list[str]:
        """The file's work queues (parents, as named in the file) a publish would reach;
        ``headers`` only matter for headers exchanges."""
        return lanes.work_queues_for(self.model, exchange, routing_key, headers)


def parse_topology(text: str, source: str) -> Topology:
    """Validate topology ``text``; ``source`` names it in errors. Raises TopologyFileError."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line = getattr(exc, "lineno", None)
        detail = str(exc)
        if line is None:
            match = re.search(r"line (\d+)", detail)
            line = int(match.group(1)) if match else None
        raise TopologyFileError(source, f"malformed TOML: {detail}", line=line) from None
    try:
        model = TopologyModel.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = tuple(first["loc"])
        raise TopologyFileError(
            source, pydantic_message(first), key=key_path(loc), line=find_line(text, loc)
        ) from None
    topology = Topology(model, source)
    _check_references(topology, text)
    return topology


def _check_references(topology: Topology, text: str) -> None:
    model = topology.model

    def fail(loc: tuple[int | str, ...], detail: str) -> None:
        raise TopologyFileError(
            topology.source, detail, key=key_path(loc), line=find_line(text, loc)
        )

    def exchange_known(name: str) -> bool:
        return name in model.exchanges or name.startswith(BUILTIN_EXCHANGE_PREFIX)

    work = set(model.queues)
    generated: dict[str, str] = {}
    for qname, queue in model.queues.items():
        if not qname or qname.startswith(BUILTIN_EXCHANGE_PREFIX):
            fail(("queues", qname), "queue names must be non-empty and not start with 'amq.'")
        for index, bind in enumerate(queue.bind):
            if not exchange_known(bind.exchange):
                fail(
                    ("queues", qname, "bind", index, "exchange"),
                    f"binds to exchange {bind.exchange!r}, which the file does not declare "
                    f"(add [exchanges.{bind.exchange}])",
                )
        if len(set(queue.retry_delays)) != len(queue.retry_delays):
            fail(("queues", qname, "retry_delays"), "the same delay appears twice")
        parking = topology.parking_name(qname)
        if parking in work:
            fail(("queues", qname, "parking"), f"{parking!r} is a work queue of this file")
        if queue.delay is not None and not 0 < queue.delay <= MAX_DEFAULT_DELAY_MS:
            fail(
                ("queues", qname, "delay"),
                f"delay must be above zero and at most {format_duration_ms(MAX_DEFAULT_DELAY_MS)}"
                " (the delay ladder's reach)",
            )
    for where, problem in lanes.flow_problems(model):
        fail(where, problem)
    for name, parent in lanes.derived_queues(model).items():
        if name in work or name in generated:
            fail(("queues", parent), f"lane or partition queue {name!r} clashes with another queue")
        generated[name] = parent
    for qname in topology.work_queue_names():
        parent = topology.parent_of(qname) or qname
        for delay in model.queues[parent].retry_delays:
            name = topology.wait_name(qname, delay)
            if name in work or name in generated:
                fail(("queues", parent, "retry_delays"), f"wait queue {name!r} clashes")
            generated[name] = parent
    for ename, exchange in model.exchanges.items():
        if ename.startswith(BUILTIN_EXCHANGE_PREFIX) or not ename:
            fail(("exchanges", ename), "exchange names must be non-empty and not start with 'amq.'")
        if exchange.alternate_exchange and not exchange_known(exchange.alternate_exchange):
            fail(
                ("exchanges", ename, "alternate_exchange"),
                f"exchange {exchange.alternate_exchange!r} is not declared in the file",
            )
    partitioned = {q for q, spec in model.queues.items() if spec.partitions}
    queues_all = (work - partitioned) | {topology.parking_name(q) for q in work} | set(generated)
    exchanges_all = set(model.exchanges) | {names.partition_exchange(q) for q in partitioned}
    for index, binding in enumerate(model.bindings):
        if not exchange_known(binding.source):
            fail(
                ("bindings", index, "source"),
                f"exchange {binding.source!r} is not declared in the file",
            )
        known = queues_all if binding.destination_type == "queue" else exchanges_all
        if binding.destination_type == "queue" and binding.destination in partitioned:
            fail(
                ("bindings", index, "destination"),
                f"{binding.destination!r} is partitioned, not a queue: bind to its exchange "
                f"{names.partition_exchange(binding.destination)!r} (destination_type = "
                '"exchange")',
            )
        if binding.destination not in known:
            fail(
                ("bindings", index, "destination"),
                f"{binding.destination_type} {binding.destination!r} is not declared in the file",
            )


def load_topology(path: str | Path) -> Topology:
    """Read and validate the topology file at ``path``. Raises TopologyFileError (exit 65)."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TopologyFileError(source, "no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TopologyFileError(source, f"cannot be read: {exc}") from None
    return parse_topology(text, source)

"""What a consumer needs to know about its queue, from a topology file, the broker, or flags.

Precedence for each setting: an explicit flag, then the topology file, then what the broker's
declared objects say (wait queues, parking target: rmqkit.consumer.wiring), then the defaults
here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from rmqkit.consumer.loading import LoadedHandler, type_label
from rmqkit.consumer.policy import QueuePolicy
from rmqkit.crypto.errors import KeyRingError
from rmqkit.crypto.keyring import ENV_FILE, ENV_INLINE
from rmqkit.durations import format_duration_ms
from rmqkit.errors import ConfigError
from rmqkit.names import parking_queue, wait_prefix
from rmqkit.topology.expand import wait_queue_names
from rmqkit.topology.model import Topology
from rmqkit.topology.schema import QueueModel

DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_PREFETCH = 200
DEFAULT_HANDLER_TIMEOUT_S = 30.0
# RabbitMQ's default consumer (ack) timeout since 3.8.17: a delivery held unacked longer gets
# its channel closed (≤ 4.2) or its consumer cancelled (4.3).
BROKER_CONSUMER_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class DedupeConfig:
    """``--dedupe``: the store, its connections and batch, and the ordering guard's headers."""

    dsn: str
    connections: int = 4
    batch: int = 100
    order_key_header: str | None = None
    order_version_header: str | None = None
    # Whose ids and versions (rmqkit.consumer.dedupe); None: the queue's name.
    scope: str | None = None


# RabbitMQ 4.3 takes a consumer timeout per consumer (``x-consumer-timeout`` on basic.consume),
# which outranks the queue's and the broker's; older brokers ignore it or lack it, so it is
# passed from 4.3 on only.
PER_CONSUMER_TIMEOUT_SINCE = (4, 3, 0)


def consumer_timeout_ms(handler_timeout_s: float | None) -> int | None:
    """The ``x-consumer-timeout`` a consumer asks for: longer than any delivery can stay
    unacked under rmqkit (the handler's timeout, then the ack flush, a retry's publish and
    confirm: a margin of the handler's timeout again, at least 60 s). None: no handler
    timeout, so nothing bounds a delivery and the broker's own timeout stays in force."""
    if handler_timeout_s is None:
        return None
    return round((handler_timeout_s + max(60.0, handler_timeout_s)) * 1000)


@dataclass(frozen=True)
class ConsumerConfig:
    """Everything one consumer process runs with (picklable: handed to worker processes)."""

    handler: str
    queue: str
    policy: QueuePolicy
    prefetch: int = DEFAULT_PREFETCH
    # Handlers in flight (None: the prefetch). The consumer never prefetches more than this:
    # a message it holds can always start (build_config caps prefetch and says so).
    concurrency: int | None = None
    handler_timeout_s: float | None = DEFAULT_HANDLER_TIMEOUT_S
    grace_s: float = 30.0
    max_message_bytes: int | None = None
    require_message_id: bool = False
    metrics_port: int | None = None
    log_format: Literal["text", "json"] = "text"
    ack_flush_s: float = 0.005
    consumer_timeout_s: float = BROKER_CONSUMER_TIMEOUT_S
    warnings: tuple[str, ...] = field(default=())
    dedupe: DedupeConfig | None = None  # None: no store, no per-message database work
    # --conflate-key-header: of the messages held with the same value of this header, only the
    # newest is handled (rmqkit.consumer.conflation); None: every message is handled
    conflate_key_header: str | None = None
    # The other queues the same worker serves beside ``queue``, each with its own consumer,
    # channel, prefetch and handler slots (rmqkit.consumer.lanes): the work queue's lanes, or
    # the other partitions of a partitioned one. Their own ``siblings`` are empty.
    siblings: tuple[ConsumerConfig, ...] = ()
    # The queue's encrypted fields (topology: encrypt = true, sensitive_fields): opened first,
    # so a body holding envelopes only there skips the walk over the whole body. Every other
    # envelope is still opened (all or nothing): this is a fast path, not a filter. Also the
    # fields the handler's model marks rmqkit.Sensitive (LoadedHandler.sensitive).
    encrypted_fields: tuple[str, ...] = ()

    @property
    def queues(self) -> tuple[str, ...]:
        """Every queue this consumer serves: ``queue`` first, then the siblings'."""
        return (self.queue, *(c.queue for c in self.siblings))

    @property
    def tier_names(self) -> tuple[str, ...]:
        return tuple(format_duration_ms(d) for d in self.policy.retry_delays_ms)


@dataclass(frozen=True)
class ConsumerFlags:
    """Settings given on the command line (None: not given)."""

    prefetch: int | None = None
    concurrency: int | None = None
    handler_timeout_s: float | None = None
    max_attempts: int | None = None
    grace_s: float | None = None
    metrics_port: int | None = None
    log_format: Literal["text", "json"] = "text"
    permanent_errors: tuple[str, ...] = ()
    dedupe: DedupeConfig | None = None
    conflate_key_header: str | None = None


def policy_from_topology(topology: Topology, queue: str, max_attempts: int | None) -> QueuePolicy:
    """The consumer view of work queue ``queue`` in ``topology`` (a file's work queue, or one
    of its lane or partition queues)."""
    spec = queue_spec(topology, queue)
    tiers = wait_queue_names(topology, queue)  # as declare names them (none: broker retry)
    return QueuePolicy(
        queue=queue,
        parking_queue=topology.parking_name(queue),
        retry_delays_ms=tuple(spec.retry_delays),
        max_attempts=max_attempts or spec.max_attempts,
        wait_queues=tuple(tuple(name for name, _ in slots) for slots in tiers),
        permanent_errors=frozenset(spec.permanent_errors),
        wait_ttls_ms=tuple(tuple(ttl for _, ttl in slots) for slots in tiers),
        full_jitter=full_jitter(spec) and spec.retry_engine != "broker",
        broker_retry=spec.retry_engine == "broker",
    )


def queue_spec(topology: Topology, queue: str) -> QueueModel:
    """The settings of work queue ``queue`` (lane and partition queues resolve to their
    parent's), or ConfigError naming the work queues the file has."""
    try:
        return topology.queue_spec(queue)
    except KeyError:
        known = ", ".join(topology.work_queue_names()) or "none"
        raise ConfigError(
            f"{topology.source} has no work queue {queue!r} (work queues in it: {known})"
        ) from None


def full_jitter(spec: object) -> bool:
    """Whether a queue's retries use full jitter (a wait uniform over [0, d]): its topology says
    ``jitter = 1.0``, the jitter window ``[d*(1-jitter), d]`` grown to ``[0, d]``. (The topology
    model accepts jitter < 1.0 today; the field is read here so that allowing 1.0 there is the
    only change needed.)"""
    jitter = getattr(spec, "jitter", 0.0)
    return isinstance(jitter, int | float) and jitter >= 1.0


def build_config(
    handler: str,
    queue: str,
    policy: QueuePolicy,
    flags: ConsumerFlags,
    topology: Topology | None = None,
    broker_consumer_timeout_s: float | None = None,
    loaded: LoadedHandler | None = None,
    broker_version: tuple[int, int, int] | None = None,
) -> ConsumerConfig:
    """Combine flags, topology and broker facts; collect warnings for the operator.

    ``loaded``: the handler ``load_handler(handler)`` returned (``rmqkit consume`` passes it);
    the fields its model marks ``rmqkit.Sensitive`` join ``encrypted_fields``.
    """
    spec = queue_spec(topology, queue) if topology is not None else None
    if flags.permanent_errors:
        policy = replace(
            policy, permanent_errors=policy.permanent_errors | frozenset(flags.permanent_errors)
        )
    prefetch = flags.prefetch or (spec.prefetch if spec else DEFAULT_PREFETCH)
    timeout_s = flags.handler_timeout_s
    if timeout_s is None and spec is not None and spec.handler_timeout is not None:
        timeout_s = spec.handler_timeout / 1000
    if timeout_s is None:
        timeout_s = DEFAULT_HANDLER_TIMEOUT_S
    consumer_timeout_s = broker_consumer_timeout_s or BROKER_CONSUMER_TIMEOUT_S
    warnings: list[str] = []
    # From 4.3 the consumer asks for a timeout of its own (consume_arguments), which outranks
    # the queue's and the broker's: nothing to warn about.
    own_timeout = broker_version is not None and broker_version >= PER_CONSUMER_TIMEOUT_SINCE
    if timeout_s >= consumer_timeout_s and not own_timeout:
        source = (
            f"queue {queue!r} has a consumer timeout of {consumer_timeout_s:g}s "
            "(x-consumer-timeout or a policy)"
            if broker_consumer_timeout_s
            else f"the broker's consumer timeout is assumed to be the default "
            f"{consumer_timeout_s:g}s (rabbitmq.conf consumer_timeout cannot be read through "
            "the management API)"
        )
        warnings.append(
            f"handler timeout {timeout_s:g}s is not below the consumer timeout: {source}. A "
            "handler running that long gets its consumer cancelled (4.3) or its channel closed "
            "(up to 4.2); the consumer reconnects and the message is redelivered, and on 4.3 "
            "such returns do not count toward the delivery limit, so it can loop — set "
            "--handler-timeout below it"
        )
    if policy.effective_max_attempts == 1:
        warnings.append(
            f"queue {queue!r} has no retry tiers: every transient failure is parked at once"
        )
    if flags.concurrency is not None and flags.concurrency < prefetch:
        # A message prefetched but not started is handed back when the worker stops or
        # restarts, and on 3.10-4.2 every return counts toward the queue's delivery limit (on
        # 4.3 a channel close still does): restarts would park healthy messages as
        # delivery_limit without their handler ever running. So hold only what can start.
        warnings.append(
            f"prefetch {prefetch} capped to --concurrency {flags.concurrency}: messages held "
            "but not started would be handed back at every stop or restart, spending their "
            "delivery attempts"
        )
        prefetch = flags.concurrency
    if prefetch > 2000:
        warnings.append(f"prefetch {prefetch} is above the 2,000 quorum queues allow")
    encrypted = tuple(spec.sensitive_fields) if spec is not None and spec.encrypt else ()
    marked = loaded.sensitive[0] if loaded is not None else ()
    if topology is not None and loaded is not None:
        warnings += [
            _unencrypted_warning(topology, queue, path, loaded)
            for path in marked
            if path not in encrypted
        ]
    return ConsumerConfig(
        handler=handler,
        queue=queue,
        policy=policy,
        prefetch=prefetch,
        concurrency=flags.concurrency,
        handler_timeout_s=timeout_s,
        grace_s=flags.grace_s if flags.grace_s is not None else 30.0,
        max_message_bytes=spec.max_message_bytes if spec else None,
        # --dedupe keys on the message_id: a message without one is parked, never guessed at.
        require_message_id=(spec.require_message_id if spec else False) or bool(flags.dedupe),
        metrics_port=flags.metrics_port,
        log_format=flags.log_format,
        consumer_timeout_s=consumer_timeout_s,
        warnings=tuple(warnings),
        dedupe=flags.dedupe,
        conflate_key_header=flags.conflate_key_header or None,
        encrypted_fields=(*encrypted, *(p for p in marked if p not in encrypted)),
    )


def rmqkit_wiring(queues: Mapping[str, Any], queue: str) -> str | None:
    """What shows that ``queue`` was declared by rmqkit (from a topology file), or None: it
    dead-letters to a queue, or ``<queue>.parking`` / ``<queue>.wait.*`` queues exist."""
    work = queues.get(queue)
    arguments: Mapping[str, Any] = getattr(work, "arguments", None) or {}
    target = arguments.get("x-dead-letter-routing-key")
    if "x-dead-letter-exchange" in arguments and target:
        return f"it dead-letters to {target!r}"
    if parking_queue(queue) in queues:
        return f"queue {parking_queue(queue)!r} exists"
    waits = sorted(n for n in queues if n.startswith(wait_prefix(queue)))
    if waits:
        return f"wait queue {waits[0]!r} exists"
    return None


def refuse_unlocated(queues: Mapping[str, Any], queue: str, looked: str) -> None:
    """ConfigError (78) when ``queue`` carries rmqkit wiring but no topology file was found:
    its max_attempts and permanent errors live in that file, and running on the defaults
    would retry what it says to park."""
    evidence = rmqkit_wiring(queues, queue)
    if evidence is None:
        return
    raise ConfigError(
        f"queue {queue!r} was declared from a topology file ({evidence}) but none was found "
        f"({looked}) — pass --topology FILE, set RMQKIT_TOPOLOGY, or --no-topology to run on "
        f"the defaults ({DEFAULT_MAX_ATTEMPTS} attempts, no permanent errors)"
    )


def refuse_without_keyring(topology: Topology, queue: str, has_keyring: bool) -> None:
    """KeyRingError (exit 78) when work queue ``queue`` (or the work queue of a lane or
    partition queue) encrypts fields (``encrypt = true``) and no key ring is loaded: every
    message would be parked ``undecryptable`` — the consumer refuses to start, as
    ``rmqkit publish`` refuses to publish."""
    if has_keyring:
        return
    spec = queue_spec(topology, queue)
    if not (spec.encrypt and spec.sensitive_fields):
        return
    raise KeyRingError(
        f"queue {queue!r} encrypts {', '.join(spec.sensitive_fields)} (encrypt = true in "
        f"{topology.source}) but no key ring is loaded, so every message would be parked "
        f"undecryptable — set {ENV_FILE} (the path of the key-ring file, from `rmqkit keys "
        f"generate`) or {ENV_INLINE} (its JSON); nothing was consumed"
    )


def _unencrypted_warning(topology: Topology, queue: str, path: str, loaded: LoadedHandler) -> str:
    # The consumer decrypts whatever arrives encrypted; it is the publishers (rmqkit publish
    # --topology, the outbox relay's check) that go by the topology file, so a field only the
    # model marks reaches the broker, and parking, in plaintext from them.
    return (
        f"{type_label(loaded.input_type)} marks {path} rmqkit.Sensitive, but work queue "
        f"{queue!r} in {topology.source} does not encrypt it (sensitive_fields with "
        "encrypt = true): publishers using the topology send it in plaintext — add it there"
    )

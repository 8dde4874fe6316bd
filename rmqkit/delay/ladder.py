"""The delay ladder as data: its broker objects, the headers of a delayed message, and the bound
on its error. Pure; no broker (``rmqkit.delay.live`` declares and counts on a live one).

A ladder of ``bits`` queues L_0 … L_{bits-1} delays a message by any whole number of ``unit_ms``
up to ``2**bits - 1``. L_k holds every message for the same ``unit_ms * 2**k`` (a queue-level
``x-message-ttl``, never a per-message one, so messages expire in arrival order and none waits
behind another's longer TTL) and dead-letters into its own headers exchange ``after-k``, whose
bindings send the message on to the next lower set bit's queue or, when no lower bit is set, out
of the ladder. A delay of ``n`` units visits exactly the queues of the set bits of ``n``, highest
first, so the time spent in the ladder is ``n * unit_ms`` plus the broker's latency per hop.

Routing information travels in the message's own headers (``rmqkit-delay-*``, never ``x-``: the
headers exchange ignores ``x-`` keys when matching): one ``"0"``/``"1"`` header per bit up to
the highest set one, the highest set bit, and the target (exchange and routing key). Bindings
only ever test bits at or below a message's highest bit, so adding higher rungs later (a larger
``max_delay``) never changes where a message already in the ladder goes. The unit is part of
every object name: two ladders with different units share nothing.

Leaving the ladder: the ``out`` exchange has one binding per target — an exchange-to-exchange
binding into the target exchange (the message keeps its routing key, so the target routes it
exactly as if it had been published there now: topic patterns, fan-out, alternate exchange),
or, for the default exchange, a queue binding to the queue named by the routing key.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from rmqkit import headers as h
from rmqkit.delay.objects import Binding, Exchange, LadderObjects, Queue
from rmqkit.durations import age_text, format_duration_ms
from rmqkit.errors import DataError

# --- the headers a delayed message carries (named and documented in rmqkit.headers) ------------
BIT_PREFIX: Final = h.DELAY_BIT_PREFIX  # "1"/"0" per bit of the delay in units, up to the top
TOP: Final = h.DELAY_TOP  # the highest set bit: the entry exchange routes on it alone
EXCHANGE: Final = h.DELAY_EXCHANGE  # where the message is delivered when due ("": default)
ROUTING_KEY: Final = h.DELAY_ROUTING_KEY  # its routing key (kept by dead-lettering too)
DELAY_MS: Final = h.DELAY_MS  # the delay asked for, in ms
UNITS: Final = h.DELAY_UNITS  # the delay in whole units the ladder applies
ALL_HEADERS_PREFIX: Final = h.DELAY_PREFIX

MAX_TTL_MS: Final = 2**32 - 1  # the broker refuses a larger x-message-ttl
DEFAULT_PREFIX: Final = "rmqkit.delay"
DEFAULT_UNIT_MS: Final = 100
DEFAULT_BITS: Final = 20  # 100 ms * (2**20 - 1) = 29 h 7 min

QueueType = Literal["quorum", "classic"]


class DelayRangeError(DataError):
    """A delay the ladder cannot apply (negative, beyond its maximum) or a message it must not
    carry (one with a per-message ``expiration``): exit 65."""


@dataclass(frozen=True)
class DelayedPublish:
    """Where and how to publish a message so that it reaches ``target`` after ``delay_ms``."""

    exchange: str  # publish here (the ladder's entry, or the target itself for no delay)
    routing_key: str  # the target's routing key, unchanged
    headers: dict[str, Any]  # the message's headers plus the ladder's
    delay_ms: int  # asked for
    applied_ms: int  # what the ladder applies: units * unit_ms (>= delay_ms, < delay_ms + unit)
    hops: int  # ladder queues on the way (bits set): each adds the broker's hop latency


@dataclass(frozen=True)
class Ladder:
    """One delay ladder: ``bits`` rungs of ``unit_ms * 2**k`` under the name ``prefix``.

    ``queue_type``: ``quorum`` (the default: replicated, and dead-lettering is at-least-once, so
    a hop into a target that refuses or cannot route the message waits in the ladder instead of
    dropping it) or ``classic`` (one node, at-most-once hops; cheaper). See docs/delay.md.
    """

    prefix: str = DEFAULT_PREFIX
    unit_ms: int = DEFAULT_UNIT_MS
    bits: int = DEFAULT_BITS
    queue_type: QueueType = "quorum"

    def __post_init__(self) -> None:
        if self.unit_ms < 1:
            raise ValueError(f"delay unit must be at least 1 ms, not {self.unit_ms}")
        if not 1 <= self.bits <= 32:
            raise ValueError(f"a delay ladder has 1 to 32 rungs, not {self.bits}")
        if self.unit_ms * 2 ** (self.bits - 1) > MAX_TTL_MS:
            raise ValueError(
                f"a ladder of {self.bits} rungs of {format_duration_ms(self.unit_ms)} needs a "
                f"queue TTL above the broker's maximum ({MAX_TTL_MS} ms): use fewer rungs"
            )
        if self.queue_type not in ("quorum", "classic"):
            raise ValueError(f"queue_type must be quorum or classic, not {self.queue_type!r}")

    @classmethod
    def for_max_delay(
        cls,
        max_delay_ms: int,
        *,
        prefix: str = DEFAULT_PREFIX,
        unit_ms: int = DEFAULT_UNIT_MS,
        queue_type: QueueType = "quorum",
    ) -> Ladder:
        """The smallest ladder of ``unit_ms`` that can delay by ``max_delay_ms``."""
        units = max(1, math.ceil(max_delay_ms / unit_ms))
        return cls(prefix, unit_ms, units.bit_length(), queue_type)

    # --- names --------------------------------------------------------------------------------
    @property
    def base(self) -> str:
        """The name every object of this ladder starts with (prefix and unit)."""
        return f"{self.prefix}.{format_duration_ms(self.unit_ms)}"

    @property
    def entry(self) -> str:
        """The exchange delayed messages are published to."""
        return self.base

    @property
    def out(self) -> str:
        """The exchange messages leave the ladder through."""
        return f"{self.base}.out"

    def queue_name(self, bit: int) -> str:
        """Rung ``bit``'s queue; its TTL is in the name (``rmqkit.delay.100ms.03-800ms``)."""
        return f"{self.base}.{bit:02d}-{format_duration_ms(self.ttl_ms(bit))}"

    def after(self, bit: int) -> str:
        """The exchange rung ``bit`` dead-letters into."""
        return f"{self.base}.after-{bit:02d}"

    def ttl_ms(self, bit: int) -> int:
        return self.unit_ms << bit

    @property
    def queue_names(self) -> list[str]:
        return [self.queue_name(bit) for bit in range(self.bits)]

    # --- bounds -------------------------------------------------------------------------------
    @property
    def max_delay_ms(self) -> int:
        """The longest delay it applies: ``unit_ms * (2**bits - 1)``."""
        return self.unit_ms * ((1 << self.bits) - 1)

    @property
    def max_rounding_ms(self) -> int:
        """Delays are rounded up to whole units: a message is never early and at most
        ``unit_ms - 1`` ms late from rounding (the broker's hop latency comes on top)."""
        return self.unit_ms - 1

    def units(self, delay_ms: int) -> int:
        """The delay in whole units (rounded up); DelayRangeError beyond ``max_delay_ms``."""
        if isinstance(delay_ms, bool) or not isinstance(delay_ms, int):
            raise DelayRangeError(f"delay must be whole milliseconds, not {delay_ms!r}")
        if delay_ms < 0:
            raise DelayRangeError(f"delay must not be negative ({delay_ms} ms)")
        if delay_ms > self.max_delay_ms:
            raise DelayRangeError(
                f"delay {format_duration_ms(delay_ms)} exceeds the maximum of delay ladder "
                f"{self.base!r}: about {age_text(self.max_delay_ms / 1000)} "
                f"({format_duration_ms(self.max_delay_ms)}: {self.bits} rungs of "
                f"{format_duration_ms(self.unit_ms)})"
            )
        return -(-delay_ms // self.unit_ms)

    # --- objects ------------------------------------------------------------------------------
    def queue_arguments(self, bit: int) -> dict[str, Any]:
        """x-arguments of rung ``bit`` (arguments, not a policy: a rung never changes, and a
        policy on it would be the only one applying, see rabbitmq-facts.md)."""
        args: dict[str, Any] = {
            "x-message-ttl": self.ttl_ms(bit),
            "x-dead-letter-exchange": self.after(bit),
        }
        if self.queue_type == "quorum":
            # at-least-once dead-lettering needs reject-publish (with drop-head the broker falls
            # back to at-most-once with a log line only). Nothing bounds a rung, so reject-publish
            # never refuses a publish here.
            args.update(
                {
                    "x-queue-type": "quorum",
                    "x-dead-letter-strategy": "at-least-once",
                    "x-overflow": "reject-publish",
                }
            )
        else:
            args["x-queue-type"] = "classic"
        return args

    def objects(self, targets: Iterable[tuple[str, str]] = ()) -> LadderObjects:
        """The exchanges, queues and bindings of the ladder, plus the exits to ``targets``
        (``(exchange, routing_key)`` pairs, see ``target_bindings``)."""
        exchanges = [Exchange(self.entry, internal=False), Exchange(self.out, internal=True)]
        exchanges += [Exchange(self.after(bit), internal=True) for bit in range(self.bits)]
        queues = [
            Queue(self.queue_name(bit), bit, self.ttl_ms(bit), self.queue_arguments(bit))
            for bit in range(self.bits)
        ]
        bindings = [
            Binding(self.entry, self.queue_name(bit), "queue", {TOP: str(bit)})
            for bit in range(self.bits)
        ]
        for stage in range(self.bits):
            # After rung `stage`: on to the highest set bit below it, or out when there is none.
            for lower in range(stage):
                match = {_bit(lower): "1"} | {_bit(b): "0" for b in range(lower + 1, stage)}
                bindings.append(Binding(self.after(stage), self.queue_name(lower), "queue", match))
            done = {_bit(b): "0" for b in range(stage)}
            bindings.append(Binding(self.after(stage), self.out, "exchange", done))
        for exchange, routing_key in targets:
            for binding in self.target_bindings(exchange, routing_key):
                if binding not in bindings:
                    bindings.append(binding)
        return LadderObjects(exchanges, queues, bindings)

    def target_bindings(self, exchange: str, routing_key: str = "") -> list[Binding]:
        """The exit for messages delayed on their way to ``exchange``: an exchange-to-exchange
        binding (the routing key does not matter: the target routes the message by its own
        key), or for the default exchange a binding to the queue named ``routing_key``."""
        if exchange:
            return [Binding(self.out, exchange, "exchange", {EXCHANGE: exchange})]
        if not routing_key:
            raise DelayRangeError("a delayed message to the default exchange needs a queue name")
        return [Binding(self.out, routing_key, "queue", {EXCHANGE: "", ROUTING_KEY: routing_key})]

    # --- publishing ---------------------------------------------------------------------------
    def plan(
        self,
        delay_ms: int,
        exchange: str,
        routing_key: str,
        headers: Mapping[str, Any] | None = None,
        *,
        expiration: str | None = None,
    ) -> DelayedPublish:
        """How to publish a message for ``exchange``/``routing_key`` so that it arrives there
        ``delay_ms`` from now (rounded up to whole units).

        ``headers``: the message's own; returned without the broker's (x-death and friends,
        ``rmqkit.headers.strip_broker_headers``: on 3.10-3.12 a message still carrying the x-death
        of an earlier trip through the ladder is dropped by the broker's dead-letter cycle
        detection) and without an earlier trip's ``rmqkit-delay-*``. A delay that rounds to 0
        units publishes straight to the target. ``expiration``: the message's per-message TTL;
        refused, because it would expire the message out of a rung early.
        """
        units = self.units(delay_ms)
        if expiration not in (None, ""):
            raise DelayRangeError(
                "a delayed message cannot have a per-message expiration: it would leave the "
                "delay ladder early (drop the expiration or the delay)"
            )
        own = {
            k: v
            for k, v in h.strip_broker_headers(headers).items()
            if not k.startswith(ALL_HEADERS_PREFIX)
        }
        if units == 0:
            return DelayedPublish(exchange, routing_key, own, delay_ms, 0, 0)
        top = units.bit_length() - 1
        ladder: dict[str, Any] = {_bit(b): "1" if units >> b & 1 else "0" for b in range(top + 1)}
        ladder |= {
            TOP: str(top),
            EXCHANGE: exchange,
            ROUTING_KEY: routing_key,
            DELAY_MS: delay_ms,
            UNITS: units,
        }
        return DelayedPublish(
            self.entry,
            routing_key,
            own | ladder,
            delay_ms,
            units * self.unit_ms,
            units.bit_count(),
        )

    def route(self, headers: Mapping[str, Any]) -> list[str]:
        """The rungs a message with these headers visits, in order (what the bindings do,
        computed: for tests and ``rmqkit status`` explanations)."""
        units = sum(1 << b for b in range(self.bits) if _text(headers.get(_bit(b))) == "1")
        return [self.queue_name(b) for b in reversed(range(self.bits)) if units >> b & 1]

    # --- status -------------------------------------------------------------------------------
    def delayed_in(self, queue_stats: Iterable[Mapping[str, Any]]) -> dict[str, RungCount]:
        """What each rung holds, from the management API's ``/api/queues`` entries of the vhost
        (what ``rmqkit status`` already fetches). Rungs missing from ``queue_stats`` are left
        out. Management statistics lag by up to ~5 s (``delayed_counts`` reads ready counts at
        once, over AMQP)."""
        wanted = set(self.queue_names)
        counts: dict[str, RungCount] = {}
        for stats in queue_stats:
            name = stats.get("name")
            if name in wanted:
                # On 3.10 and 4.3 alike `messages` includes `messages_dlx` (seen on both).
                stuck = _count(stats.get("messages_dlx"))
                waiting = max(_count(stats.get("messages")) - stuck, 0)
                counts[str(name)] = RungCount(waiting, stuck)
        return {name: counts[name] for name in self.queue_names if name in counts}


@dataclass(frozen=True)
class RungCount:
    """Messages in one rung: still waiting out their TTL, and ``stuck``: due, but the next hop
    has not been accepted yet (a quorum rung keeps such a message and the broker retries the
    hop every few minutes: the target exchange has no exit binding, routes the key nowhere, or
    its queue refuses it with ``overflow = reject-publish``)."""

    waiting: int
    stuck: int


_STAGE_EXCHANGE = re.compile(r"\.after-\d{2}$")


def delivered_route(
    exchange: str, routing_key: str, headers: Mapping[str, Any] | None
) -> tuple[str, str]:
    """The exchange and routing key a delivery was published *for*.

    A message that left a delay ladder is delivered with the exchange it was dead-lettered
    through (``rmqkit.delay.100ms.after-00``), not the one its producer named: this maps such a
    delivery back to the target recorded in its ``rmqkit-delay-*`` headers (what a consumer
    should show as ``Message.exchange`` and keep as ``rmqkit-original-exchange``). Any other
    delivery is returned as is.
    """
    if headers and TOP in headers and _STAGE_EXCHANGE.search(exchange):
        target = headers.get(EXCHANGE)
        key = headers.get(ROUTING_KEY)
        if (text := _text(target)) is not None:
            exchange = text
            routing_key = _text(key) or routing_key
    return exchange, routing_key


def _bit(bit: int) -> str:
    return f"{BIT_PREFIX}{bit:02d}"


def _text(value: object) -> str | None:
    # Typed decoding or another client may hand a header back as bytes.
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", errors="replace")
    return value if isinstance(value, str) else None


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def strip_delay_headers(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """``headers`` without the ladder's ``rmqkit-delay-*`` (e.g. for a copy that must not look
    delayed)."""
    return {k: v for k, v in (headers or {}).items() if not k.startswith(ALL_HEADERS_PREFIX)}

"""The publishing edge a topology defines (issues 15 and 16): lanes, delays, encrypted fields.

Shared by ``rmqkit publish --topology/--delay`` (rmqkit/cli/publish.py), ``rmqkit.outbox.add(...,
encryptor=, delay=)`` and ``rmqkit outbox relay --topology``. The publishing layer (rank 3, beside
the outbox) holds it: it needs the topology, the delay ladder and the crypto library below it,
and both the publishers and the outbox use it (docs/outbox.md, docs/delay.md "Wiring").

- ``Encryptor``: which fields of a message to encrypt, from the work queues its exchange and
  routing key reach (``encrypt = true``: their ``sensitive_fields``, with ``blind_index``), a
  fixed list, or the fields a pydantic model marks ``rmqkit.Sensitive`` (``model=``); applied
  with ``rmqkit.crypto.encrypt_fields`` and the key ring.
- ``Edge.route``: where a message goes: its lane (``topology.lane_for``; a lane message is
  published to the default exchange with the lane queue as routing key) and, delayed (explicitly,
  or by the work queue's default ``delay``), the delay ladder's entry with the ladder's headers.
- ``Edge.declare``: the ladder and the exits the routed messages need, declared once per process.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rmqkit.broker.session import Session
from rmqkit.crypto import (
    KeyRing,
    Undecryptable,
    encrypt_fields,
    keyring_from_env,
    leaves,
    sensitive_fields,
    shape_problem,
)
from rmqkit.crypto.envelope import is_sealed, loads_json, open_envelope
from rmqkit.delay import DelayRangeError, Ladder, declare_ladder, declare_target
from rmqkit.durations import format_duration_ms
from rmqkit.errors import DataError
from rmqkit.topology import Topology, load_topology


def _load(topology: Topology | str | Path | None) -> Topology | None:
    if topology is None or isinstance(topology, Topology):
        return topology
    return load_topology(topology)


def _spec(topology: Topology, queue: str) -> Any:
    return topology.model.queues.get(queue)


def reached(
    topology: Topology | None,
    exchange: str,
    routing_key: str,
    headers: Mapping[str, Any] | None = None,
) -> list[str]:
    """The work queues of ``topology`` a publish to ``exchange``/``routing_key`` reaches."""
    if topology is None:
        return []
    return list(topology.work_queues_for(exchange, routing_key, headers))


def marked_fields(model: type | None) -> tuple[list[str], list[str]]:
    """The fields ``model`` (a pydantic model class) marks ``rmqkit.Sensitive``, and the
    blind-indexed ones, under both their JSON key (alias) and their field name: a body may be
    dumped either way (``model_dump_json(by_alias=...)``), and a path missing from it is not an
    error, so naming both never leaves a marked value in plaintext. ([], []) for None."""
    if model is None:
        return [], []
    paths: list[str] = []
    indexed: list[str] = []
    for by_alias in (True, False):
        marked, marked_indexed = sensitive_fields(model, by_alias=by_alias)
        paths += [p for p in marked if p not in paths]
        indexed += [p for p in marked_indexed if p not in indexed]
    return paths, indexed


@dataclass
class Encryptor:
    """Encrypts the sensitive fields of message bodies before they leave (or enter the outbox).

    ``fields`` / ``blind_index``: encrypted in every message. ``topology``: in addition, for a
    message whose exchange and routing key reach a work queue with ``encrypt = true``, that
    queue's ``sensitive_fields`` (blind-indexed: its ``blind_index``). ``keyring``: the ring
    (``Encryptor.from_env`` loads it from RMQKIT_KEYRING_FILE / RMQKIT_KEYRING); it is needed
    only when a message has fields to encrypt: then no ring is a KeyRingError (exit 78), and a
    body that is not JSON a DataError (65) — never sent in plaintext. ``model=`` (to
    ``from_env``, ``fields_for``, ``encrypt``): also the fields a pydantic model class marks
    ``rmqkit.Sensitive`` (``rmqkit.outbox.add`` passes the class of a model body itself).
    """

    fields: Sequence[str] = ()
    blind_index: Sequence[str] = ()
    keyring: KeyRing | None = None
    topology: Topology | None = None

    @classmethod
    def from_env(
        cls,
        topology: Topology | str | Path | None = None,
        *,
        fields: Sequence[str] = (),
        blind_index: Sequence[str] = (),
        model: type | None = None,
    ) -> Encryptor:
        """An Encryptor with the key ring of the environment (None if not set: an error only
        once a message needs it). ``model``: a pydantic model class whose ``rmqkit.Sensitive``
        fields are encrypted in every message (for publishers that send its JSON as bytes);
        ConfigError (78) for a mark no path can name."""
        marked, marked_indexed = marked_fields(model)
        paths = [*fields, *(p for p in marked if p not in fields)]
        indexed = [*blind_index, *(p for p in marked_indexed if p not in blind_index)]
        return cls(paths, indexed, keyring_from_env(), _load(topology))

    def fields_for(
        self,
        exchange: str,
        routing_key: str,
        headers: Mapping[str, Any] | None = None,
        *,
        model: type | None = None,
    ) -> tuple[list[str], list[str]]:
        """The fields to encrypt in a message for ``exchange``/``routing_key``, and which of them
        get a blind index (the union over the work queues it reaches: each gets ciphertext, and
        the fields ``model`` marks)."""
        paths, indexed = list(self.fields), list(self.blind_index)
        marked, marked_indexed = marked_fields(model)
        paths += [p for p in marked if p not in paths]
        indexed += [p for p in marked_indexed if p not in indexed]
        for queue in reached(self.topology, exchange, routing_key, headers):
            spec = _spec(self.topology, queue) if self.topology is not None else None
            if spec is None or not spec.encrypt:
                continue
            paths += [p for p in spec.sensitive_fields if p not in paths]
            indexed += [p for p in spec.blind_index if p not in indexed]
        return paths, indexed

    def encrypt(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        headers: Mapping[str, Any] | None = None,
        *,
        model: type | None = None,
    ) -> bytes:
        """``body`` with its sensitive fields encrypted (the same bytes when there are none);
        ``model``: the pydantic model class ``body`` is the JSON of (its marked fields too)."""
        paths, indexed = self.fields_for(exchange, routing_key, headers, model=model)
        if not paths:
            return body
        return encrypt_fields(body, paths, indexed, self.keyring)

    def plaintext(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        headers: Mapping[str, Any] | None = None,
    ) -> str | None:
        """Why ``body`` must not be published as it is: a field it should carry encrypted holds
        plaintext or something that only looks like an envelope, the body is shaped so it could
        hold such a field where the path does not reach (``rmqkit.crypto.shape_problem``), or
        it is not JSON; None if it is fine. No key ring needed (the outbox relay checks rows
        with it: they are encrypted by ``add``, never by the relay): only a sealed envelope
        (``is_sealed``: version, key id, nonce, tag and index lengths) counts as encrypted, and
        with ``keyring`` set it must also open under it."""
        paths, _ = self.fields_for(exchange, routing_key, headers)
        if not paths:
            return None
        try:
            parsed = loads_json(body)
        except ValueError:
            return "the body is not JSON: its sensitive fields cannot be encrypted"
        bare: list[str] = []
        for path in paths:
            problem = shape_problem(parsed, path)
            if problem is not None:
                return problem
            if not all(self._sealed(path, value) for value in leaves(parsed, path)):
                bare.append(path)
        if not bare:
            return None
        return (
            f"sensitive field(s) {', '.join(bare)} in plaintext (or not a sealed envelope): "
            "write the row with add(..., encryptor=rmqkit.outbox.Encryptor...) — the relay "
            "never publishes them so"
        )

    def _sealed(self, path: str, value: Any) -> bool:
        if not is_sealed(value):
            return False
        if self.keyring is None:
            return True
        try:
            open_envelope(self.keyring, path, value)
        except Undecryptable:
            return False
        return True


@dataclass(frozen=True)
class PublishRoute:
    """Where one message is published: the exchange and routing key to use, its headers, the
    queue it was steered to (a lane) and its delay (``applied_ms`` 0: not delayed)."""

    exchange: str
    routing_key: str
    headers: dict[str, Any] | None
    lane: str | None = None
    delay_ms: int = 0  # asked for (after time already spent, e.g. in the outbox)
    applied_ms: int = 0  # what the ladder applies (rounded up to its unit)
    target: tuple[str, str] | None = None  # the ladder's exit it needs (delayed only)


class Edge:
    """Lanes and delays for messages published at the edge (module docstring).

    ``topology``: lanes and default delays (None: neither). ``ladder``: the delay ladder
    (default ``Ladder()``: 100 ms unit, 20 rungs, up to 29 h). ``Edge.check_delay`` and the
    constructor refuse a delay (a work queue's default) beyond the ladder's maximum with a
    DelayRangeError (65), before anything is published.
    """

    def __init__(
        self, topology: Topology | str | Path | None = None, *, ladder: Ladder | None = None
    ) -> None:
        self.topology = _load(topology)
        self.ladder = ladder or Ladder()
        self._declared_ladder = False
        self._exits: set[tuple[str, str]] = set()
        if self.topology is not None:
            for name, spec in self.topology.model.queues.items():
                default = spec.delay
                if default is not None:
                    self.check_delay(default, f"queues.{name}.delay: ")

    def check_delay(self, delay_ms: int, what: str = "") -> None:
        """DelayRangeError (65) if the ladder cannot apply ``delay_ms``."""
        try:
            self.ladder.units(delay_ms)
        except DelayRangeError as exc:
            raise DelayRangeError(f"{what}{exc}") from None

    def default_delay(self, queues: Iterable[str]) -> int | None:
        """The default delay of the work queues a message reaches (None: none has one);
        DataError if they disagree (the message would be delayed for all of them)."""
        if self.topology is None:
            return None
        found = {q: _spec(self.topology, q).delay for q in queues}
        if len(set(found.values())) > 1:
            shown = ", ".join(
                f"{q}: {'none' if d is None else format_duration_ms(d)}" for q, d in found.items()
            )
            raise DataError(
                f"the message reaches work queues with different default delays ({shown}): "
                "give the delay explicitly (--delay / delay=)"
            )
        return next(iter(found.values()), None)

    def lane(
        self, exchange: str, routing_key: str, headers: Mapping[str, Any] | None, body_size: int
    ) -> tuple[list[str], str | None]:
        """The work queues reached and the lane queue the message goes to (None: no lane, it
        is published as asked). Lanes are picked by the headers and the size of the body as
        published (after encryption: what the broker and the consumer carry)."""
        queues = reached(self.topology, exchange, routing_key, headers)
        if self.topology is None or not queues:
            return queues, None
        if exchange == "" and routing_key not in self.topology.model.queues:
            return queues, None  # sent to a lane or partition queue by name: it stays there
        picked = {q: self.topology.lane_for(q, headers or {}, body_size) for q in queues}
        lanes = {q: lane for q, lane in picked.items() if lane != q}
        if not lanes:
            return queues, None
        if len(queues) > 1:
            raise DataError(
                f"the message reaches {len(queues)} work queues ({', '.join(queues)}) and "
                f"{', '.join(lanes)} would take it in lane {', '.join(lanes.values())}: a lane "
                "is picked only for a message that reaches one work queue"
            )
        return queues, lanes[queues[0]]

    def route(
        self,
        exchange: str,
        routing_key: str,
        headers: Mapping[str, Any] | None,
        body_size: int,
        *,
        delay_ms: int | None = None,
        waited_ms: float = 0.0,
        expiration: str | None = None,
    ) -> PublishRoute:
        """Where to publish one message. ``delay_ms``: asked for (None: the work queue's default
        delay, if any; 0: none); ``waited_ms``: time it already waited (the outbox row's age),
        deducted from the delay. DelayRangeError (65) beyond the ladder's maximum or with an
        ``expiration``; DataError for an ambiguous lane or default delay."""
        queues, lane = self.lane(exchange, routing_key, headers, body_size)
        if delay_ms is None:
            delay_ms = self.default_delay(queues)
        own = dict(headers) if headers else None
        target = ("", lane) if lane is not None else (exchange, routing_key)
        if not delay_ms:
            return PublishRoute(target[0], target[1], own, lane)
        self.check_delay(delay_ms)
        left = max(0, int(delay_ms - waited_ms))
        plan = self.ladder.plan(left, target[0], target[1], own, expiration=expiration)
        if plan.applied_ms == 0:  # waited long enough already: straight to the target
            return PublishRoute(target[0], target[1], own, lane, left)
        return PublishRoute(
            plan.exchange, plan.routing_key, plan.headers, lane, left, plan.applied_ms, target
        )

    async def declare(
        self, session: Session, routed: Iterable[PublishRoute], *, again: bool = False
    ) -> dict[tuple[str, str], DataError]:
        """Declare the ladder and the exits the ``routed`` messages need, each once per Edge
        (idempotent on the broker; the cache saves the round trips). ``again``: declare the
        exits even if this Edge declared them before (a long-running relay: an exit is a
        binding, gone with its target when that is deleted, even if it is declared again).
        Returns the exits that could not be declared (their target exchange or queue is
        missing: 65) with the error, so only the messages for them fail; a ladder that cannot
        be declared raises."""
        targets = {r.target for r in routed if r.target is not None}
        if not again:
            targets -= self._exits
        failed: dict[tuple[str, str], DataError] = {}
        if not targets:
            return failed
        if not self._declared_ladder:
            await declare_ladder(session, self.ladder)
            self._declared_ladder = True
        for target in sorted(targets):
            try:
                await declare_target(session, self.ladder, *target)
            except DataError as exc:
                failed[target] = exc
                self._exits.discard(target)
            else:
                self._exits.add(target)
        if failed and not await session.exchange_exists(self.ladder.out):
            self.forget_ladder()  # the ladder itself was deleted: declare it again next time
        return failed

    def forget_ladder(self) -> None:
        """Declare the ladder again before the next delayed message (it was found missing or
        in conflict: deleted by hand, or a rung redeclared)."""
        self._declared_ladder = False

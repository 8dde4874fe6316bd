"""`rmqkit publish` as one library call: ``publish_input`` publishes a stream of
``OutgoingMessage`` (lines, --body values, NDJSON records) through the same edge as
``rmqkit.Publisher`` (``at_edge``: encryption, lane, delay; the id and header checks of
``prepare``), then through the streaming engine (``publish_messages``: window, busy retries,
block notices, the stall timeout).

What it decides, for the command and for any caller alike:

- with a topology or a delay, every message is encrypted and routed before the first is
  published (a delay beyond the ladder, a missing key ring, a body that cannot be encrypted
  publish nothing), and the delay ladder and its exits are declared first;
- an id taken from a field the topology encrypts is refused before anything is read, and a
  message whose id *is* the value of one of its sensitive fields is refused too (65);
- a derived id of a body with sensitive fields is keyed (``derived_message_id(keyed=)``);
- an id or a header AMQP cannot carry is refused before anything of the input is sent;
- the report counts messages per lane and the delays applied; ``PublishReport.failure`` is
  the error of a run with returned or refused messages.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rmqkit.errors import DataError, UsageError
from rmqkit.publishing.edge import SensitiveIdError, at_edge
from rmqkit.publishing.engine import DEFAULT_WINDOW, Notice, Progress, publish_messages
from rmqkit.publishing.ids import IdSource, derived_message_id
from rmqkit.publishing.inputs import OutgoingMessage

if TYPE_CHECKING:  # without a topology or delay neither crypto nor topology is loaded
    from rmqkit.broker.session import Session
    from rmqkit.crypto import KeyRing
    from rmqkit.publishing.report import PublishReport
    from rmqkit.publishing.routing import Edge, Encryptor, PublishRoute
    from rmqkit.settings import Settings
    from rmqkit.topology import Topology


@dataclass(frozen=True)
class PublishEdge:
    """The topology side of one publish run: lanes and delays (``edge``), the fields to
    encrypt (``encryptor``, None when no queue of the topology encrypts) and the delay every
    message gets (``delay_ms``; None: each work queue's default)."""

    edge: Edge
    encryptor: Encryptor | None
    delay_ms: int | None = None

    @classmethod
    def load(
        cls,
        settings: Settings,
        topology: Topology | str | Path | None = None,
        delay_ms: int | None = None,
        *,
        keyring: KeyRing | None = None,
        delay_option: str = "--delay",
    ) -> PublishEdge | None:
        """The edge of ``topology`` / ``delay_ms``; None without either (published as asked).
        A delay beyond the ladder's maximum: DelayRangeError (65); a topology that encrypts
        and a key ring setting that cannot be read: KeyRingError (78) — both before anything
        is read. ``keyring``: default, the ring ``settings`` name (RMQKIT_KEYRING_FILE /
        RMQKIT_KEYRING), loaded only when a queue of the topology encrypts."""
        if topology is None and delay_ms is None:
            return None
        from rmqkit.crypto import load_keyring
        from rmqkit.publishing.routing import Edge, Encryptor
        from rmqkit.topology import Topology, load_topology

        spec = None
        if topology is not None:
            spec = topology if isinstance(topology, Topology) else load_topology(topology)
        edge = Edge(spec)
        if delay_ms:
            edge.check_delay(delay_ms, f"{delay_option}: ")
        encryptor = None
        if spec is not None and any(q.encrypt for q in spec.model.queues.values()):
            if keyring is None:
                keyring = load_keyring(*settings.keyring_sources())
            encryptor = Encryptor(keyring=keyring, topology=spec)
        return cls(edge, encryptor, delay_ms)

    def refuse_sensitive_id_field(self, ids: IdSource) -> None:
        """UsageError (64) for an id taken from a field (``ids.field``) that the topology
        encrypts for ``ids``' exchange and routing key: the message_id would carry its value
        in plaintext (in every log line, parking list and export)."""
        field = ids.body_field
        if field is None or self.encryptor is None:
            return
        paths, _ = self.encryptor.fields_for(ids.exchange, ids.routing_key)
        for path in paths:
            if field == path or field.startswith((path + ".", path + "[")):
                raise UsageError(
                    f"--id-from {ids.field}: {path} is a sensitive field the topology encrypts; "
                    "as the message_id its value would travel in plaintext — take the id from "
                    "another field (nothing was published)"
                )

    def prepare(
        self, message: OutgoingMessage, number: int, exchange: str, routing_key: str
    ) -> tuple[OutgoingMessage, PublishRoute]:
        """``message`` (the ``number``-th of the input) encrypted and routed (lane, delay
        ladder), with its derived id keyed when its body has sensitive fields.

        The keyed id (``derived_message_id`` with the key ring's index key) is over the body as
        given: a rerun gets the same ids, and no one reading an id can test guesses of an
        encrypted value against it. Errors name the message by where it came from (line or
        --body index), not by such an id."""
        key = message.routing_key if message.routing_key is not None else routing_key
        message_id = message.message_id
        encryptor = self.encryptor
        try:
            body, where = at_edge(
                self.edge,
                encryptor,
                exchange,
                key,
                message.body,
                message.headers,
                delay_ms=self.delay_ms,
                expiration=message.expiration,
                message_id=message_id if message.derived_at is None else None,
            )
            # a derived id of a body with sensitive fields (encrypted: a new object) is keyed
            if (
                encryptor is not None
                and message.derived_at is not None
                and body is not message.body
            ):
                assert encryptor.keyring is not None  # encrypt refuses without one
                message_id = derived_message_id(
                    exchange,
                    key,
                    message.derived_at,
                    message.body,
                    keyed=encryptor.keyring.index_digest,
                )
        except SensitiveIdError as exc:
            raise SensitiveIdError(f"{_where(message, number)}: {exc}") from None
        except DataError as exc:
            raise DataError(f"{named(message, number)}: {exc}") from None
        routed = replace(
            message,
            body=body,
            message_id=message_id,
            exchange=where.exchange,
            routing_key=where.routing_key,
            headers=where.headers,
        )
        return routed, where

    async def declare(self, session: Session, routed: Iterable[PublishRoute]) -> None:
        """The delay ladder and the exits of the delayed messages; DataError (65) naming the
        first exit that cannot be declared (nothing is published: a delayed message would
        wait for an exit that is not there)."""
        failed = await self.edge.declare(session, routed)
        if failed:
            (exchange, key), error = next(iter(failed.items()))
            where = f"exchange {exchange!r}" if exchange else f"queue {key!r}"
            raise DataError(f"delayed messages for {where}: {error}")


async def publish_input(
    settings: Settings,
    exchange: str,
    routing_key: str,
    messages: Iterable[OutgoingMessage],
    *,
    edge: PublishEdge | None = None,
    ids: IdSource | None = None,
    all_first: bool = True,
    window: int = DEFAULT_WINDOW,
    retry_busy: bool = False,
    busy_retries: int = 8,
    progress: Progress | None = None,
    notice: Notice | None = None,
    notice_every_s: float = 10.0,
    timeout_s: float | None = None,
) -> PublishReport:
    """Publish ``messages`` to ``exchange`` / ``routing_key`` (a message's own routing key
    wins) as `rmqkit publish` does: persistent, ``mandatory``, confirmed (module docstring).

    ``edge``: the run's topology and delay (``PublishEdge.load``); ``ids``: how the messages
    got their ids (a sensitive ``--id-from`` field is refused here, before ``messages`` is
    read; it also decides what a lost connection's error advises). ``all_first``: check every
    message before the first is published (a bad one publishes nothing); False streams them
    (each is checked as it is sent), for an unbounded input — with an edge or ids from a field
    every message is checked first regardless. The rest: ``publish_messages``.

    Returns the report (counts, lanes, delays); a run with returned or refused messages is
    ``report.failure()`` — not raised, so the caller can show the counts first; its returned
    messages' error names the bindings of their exchange (``rmqkit.publishing.targets``).
    Cancelled (Ctrl-C), it sends nothing more, waits a moment for the confirms in flight and
    raises PublishStopped (130) with the report and how to resume (``publishing.stopping``)."""
    ids = ids or IdSource(exchange, routing_key)
    if edge is not None:
        edge.refuse_sensitive_id_field(ids)
    checked = _checked(messages)
    routed: list[PublishRoute] | None = None
    if edge is not None:
        pairs = [edge.prepare(m, n, exchange, routing_key) for n, m in enumerate(checked, 1)]
        checked = iter([m for m, _ in pairs])
        routed = [r for _, r in pairs]
    elif all_first or ids.field is not None:
        checked = iter(list(checked))
    prepare = None
    if edge is not None and routed is not None:
        targets = routed

        async def prepare(session: Session) -> None:
            await edge.declare(session, targets)

    report = await publish_messages(
        settings,
        exchange,
        routing_key,
        checked,
        window=window,
        retry_busy=retry_busy,
        busy_retries=busy_retries,
        progress=progress,
        repeatable_ids=ids.repeatable,
        notice=notice,
        notice_every_s=notice_every_s,
        timeout_s=timeout_s,
        prepare=prepare,
    )
    if report.returned_to:  # name the routing keys the exchange does bind (management API)
        from rmqkit.publishing.targets import routing_hint

        target = report.returned_to[0][0]
        keys = list(dict.fromkeys(k for e, k in report.returned_to if e == target))
        report.routing_hint = await routing_hint(settings, target, keys)
    if routed is not None:
        report.lanes = dict(Counter(r.lane for r in routed if r.lane))
        report.delays_ms = [r.applied_ms for r in routed if r.applied_ms]
    return report


def _checked(messages: Iterable[OutgoingMessage]) -> Iterator[OutgoingMessage]:
    """Each message with an id and headers AMQP can carry (DataError 65 naming it otherwise).
    The headers every message of an input shares (``--header``) are encoded once."""
    from rmqkit.broker.codec import Properties
    from rmqkit.publishing.prepare import check_encodes, check_message_id

    seen: list[Any] = []  # header objects checked already (by identity: shared by messages)
    for number, message in enumerate(messages, start=1):
        given = message.message_id
        if not given or len(given) > 63:  # 63 characters are at most 252 bytes: no need to encode
            check_message_id(given, _where(message, number))
        headers = message.headers
        if headers and not any(headers is h for h in seen):
            check_encodes(Properties(headers=headers), named(message, number))
            if len(seen) < 4:
                seen.append(headers)
        yield message


def _where(message: OutgoingMessage, number: int) -> str:
    return f"message {number} ({message.where})" if message.where else f"message {number}"


def named(message: OutgoingMessage, number: int) -> str:
    """How an error names a message: where it came from, and its message_id unless derived
    from the body (a derived id of a body with sensitive fields is not shown before it is
    keyed)."""
    if message.derived_at is not None:
        return _where(message, number)
    return f"{_where(message, number)} (message_id {message.message_id})"

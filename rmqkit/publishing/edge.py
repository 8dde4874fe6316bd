"""The one step every publisher of rmqkit takes at the edge: encrypt a message's sensitive
fields, then pick where it goes (its lane, or the delay ladder's entry). ``rmqkit.Publisher``
(``prepare``) and ``rmqkit publish`` (``rmqkit.publishing.run``) both call ``at_edge``; the
relay's rows were encrypted when written and take ``Edge.route`` alone (rmqkit/outbox/rows.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rmqkit.errors import DataError

if TYPE_CHECKING:  # `rmqkit publish` without --topology/--delay loads neither crypto nor topology
    from rmqkit.publishing.routing import Edge, Encryptor, PublishRoute


class SensitiveIdError(DataError):
    """A message_id that is the value of one of the message's sensitive fields (exit 65): sent,
    that value would travel in plaintext in a property every log line, parking list and export
    shows. Messages about it never quote the id."""


def at_edge(
    edge: Edge,
    encryptor: Encryptor | None,
    exchange: str,
    routing_key: str,
    body: bytes,
    headers: Mapping[str, Any] | None,
    *,
    delay_ms: int | None = None,
    expiration: str | None = None,
    model: type | None = None,
    message_id: str | None = None,
) -> tuple[bytes, PublishRoute]:
    """``body`` with its sensitive fields encrypted (the same object when it has none) and
    where to publish it. The lane is chosen by the size of the body as sent (encrypted).
    DataError (65) for a body that cannot be encrypted or routed, KeyRingError (78) for
    sensitive fields without a key ring, DelayRangeError (65) beyond the ladder;
    SensitiveIdError (65) when ``message_id`` is the value of a field it encrypts."""
    if encryptor is not None:
        encrypted = encryptor.encrypt(exchange, routing_key, body, headers, model=model)
        if message_id is not None and encrypted is not body:
            _refuse_id_in_plaintext(
                encryptor, exchange, routing_key, body, headers, model, message_id
            )
        body = encrypted
    routed = edge.route(
        exchange, routing_key, headers, len(body), delay_ms=delay_ms, expiration=expiration
    )
    return body, routed


def _refuse_id_in_plaintext(
    encryptor: Encryptor,
    exchange: str,
    routing_key: str,
    body: bytes,
    headers: Mapping[str, Any] | None,
    model: type | None,
    message_id: str,
) -> None:
    """SensitiveIdError if ``message_id`` equals a value ``body`` (plaintext JSON, already
    encrypted once, so it parses) holds in a field that is encrypted."""
    from rmqkit.crypto import leaves
    from rmqkit.crypto.envelope import loads_json

    paths, _ = encryptor.fields_for(exchange, routing_key, headers, model=model)
    parsed = loads_json(body)
    for path in paths:
        for value in leaves(parsed, path):
            scalar = isinstance(value, str | int) and not isinstance(value, bool)
            if scalar and str(value) == message_id:
                raise SensitiveIdError(
                    f"its message_id is the value of the sensitive field {path}, which "
                    "would travel in plaintext as the message_id (in every log line, "
                    "parking list and export) — give it an id that is not personal data "
                    "(nothing was published)"
                )

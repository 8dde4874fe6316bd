"""Edit and retry: one parked message's body changed and sent where a replay would send it.

``edit_parked`` is the whole of `rmqkit parking edit`, in three steps:

1. **Read** the parked message by id (a browse that leaves the queue as it was) and refuse
   early what cannot be edited: a topology whose work queue does not set ``allow_edit``, an
   audit log that cannot be opened, a message that is not there, one a replay would not know
   where to send.
2. **Edit** the body (the caller's ``edit``: ``$EDITOR`` or a file), with no connection open:
   an operator may take minutes, and a browse would hold the whole lane unacked meanwhile.
   Then check the edited body: changed at all; no encrypted field turned into plaintext (the
   editor sees the body as stored, envelopes included, and nothing is decrypted for it); and,
   with a handler, valid as the handler's body parameter — the consumer's own conversion
   (``LoadedHandler.convert``), so an edit is refused exactly when the consumer would park it
   as undecodable.
3. **Publish and remove**, in a second browse that finds the same message again (same id and
   the same content: ``message_identity``): append the audit entry (fsynced), publish the copy
   (confirmed, ``mandatory``) under a new message id with ``rmqkit-edited-from`` and the
   replay headers (attempts reset, one more replay), and ack the original only once the
   broker confirmed the copy — as replay does: a crash leaves it parked, or in both places,
   never in neither. The audit entry comes first: if it cannot be written nothing is published.

Only the body is edited. The headers are rmqkit's (``rmqkit-*``) and the broker's (``x-*``)
and are rewritten as a replay rewrites them; the other properties are kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from pydantic import ValidationError

from rmqkit import headers as h
from rmqkit.broker.codec import copy_properties
from rmqkit.broker.session import Outcome, outcome_of
from rmqkit.consumer.handler import _validation_detail
from rmqkit.consumer.loading import (
    HandlerInput,
    LoadedHandler,
    load_handler,
    one_line,
    type_label,
)
from rmqkit.consumer.message import DecodeError, Message
from rmqkit.consumer.outcomes import Undecodable
from rmqkit.crypto import KeyRing, KeyRingError, decrypt_fields, is_envelope, leaves
from rmqkit.crypto.envelope import is_sealed
from rmqkit.crypto.paths import ITEMS, join
from rmqkit.errors import BrokerError, DataError, OutputError, UsageError
from rmqkit.parking.audit import DEFAULT_AUDIT_LOG, AuditLog, EditRecord, amqp_user, os_user
from rmqkit.parking.audit import body_digest as digest
from rmqkit.parking.browse import BrowseIncomplete, Settlement, Verdict, browse
from rmqkit.parking.model import ParkedMessage, json_safe, redact_body
from rmqkit.parking.ops import find_parked, message_identity, parking_session
from rmqkit.parking.replay import replay_headers, replay_target
from rmqkit.publishing.ids import new_message_id
from rmqkit.settings import Settings
from rmqkit.topology import Topology

EDITED_FROM: Final = h.EDITED_FROM
"""str: on an edited copy, the message_id of the parked message it was edited from."""

Editor = Callable[[bytes], bytes]
"""The edit itself: the body as stored in, the edited body out."""


class EditUnchanged(UsageError):
    """The edit left the body as it was, or the editor failed: nothing published (exit 64)."""


@dataclass
class EditResult:
    """What an edit did (or, dry, would do)."""

    queue: str
    work_queue: str
    message_id: str
    new_message_id: str | None  # None on a dry run: an id is drawn only when publishing
    exchange: str
    routing_key: str
    body_sha256_before: str
    body_sha256_after: str
    validated_as: str | None  # the handler's body type the edit was checked against
    dry_run: bool
    audit_log: Path | None  # where the edit was logged (None on a dry run)
    headers: dict[str, Any] = field(default_factory=dict)  # of the copy
    body: bytes = b""  # the edited body

    def as_dict(self, redact: frozenset[str] = frozenset()) -> dict[str, Any]:
        """The ``--json`` result: a dry run adds the copy's headers and body (the body as
        parsed JSON when it is JSON, else text), which a real run leaves out; shown as every
        parking view shows a body (``redact_body``): encrypted fields as ``[encrypted kid=…]``,
        the ``redact`` fields (the topology's sensitive ones) masked."""
        document: dict[str, Any] = {
            "dry_run": self.dry_run,
            "queue": self.queue,
            "work_queue": self.work_queue,
            "message_id": self.message_id,
            "new_message_id": self.new_message_id,
            "exchange": self.exchange,
            "routing_key": self.routing_key,
            "body_sha256_before": self.body_sha256_before,
            "body_sha256_after": self.body_sha256_after,
            "validated_as": self.validated_as,
            "audit_log": None if self.audit_log is None else str(self.audit_log),
        }
        if self.dry_run:
            document["headers"] = json_safe(self.headers)
            document["body"] = redact_body(self.body, redact)
        return document


def shown_body(body: bytes) -> Any:
    """``body`` for display: parsed JSON, else UTF-8 text, else ``0x…`` hex."""
    try:
        return json.loads(body)
    except ValueError:
        pass
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + body.hex()


# --- refusals before anything is read ----------------------------------------------------------
def editable_work_queue(topology: Topology, parking: str) -> str:
    """The topology's work queue whose parking queue is ``parking``, if it allows editing;
    else UsageError (64) saying what to change. Lanes and partitions share their parent's
    parking queue and its ``allow_edit``."""
    for work, spec in topology.model.queues.items():
        if topology.parking_name(work) != parking:
            continue
        if not spec.allow_edit:
            raise UsageError(
                f"editing messages in {parking!r} is not allowed: work queue {work!r} in "
                f"{topology.source} does not set allow_edit = true — add it there to allow "
                "`parking edit`; nothing was changed"
            )
        return work
    raise UsageError(
        f"{topology.source} declares no work queue whose parking queue is {parking!r}; "
        "nothing was changed"
    )


# --- the edit ----------------------------------------------------------------------------------
def body_from_file(path: Path) -> bytes:
    """The edited body from ``path`` (``-``: stdin), byte for byte; DataError (65) if unreadable."""
    try:
        return sys.stdin.buffer.read() if str(path) == "-" else path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot be read: {exc.strerror or exc}") from None


def editor_command(environ: dict[str, str] | None = None) -> str:
    """``$VISUAL``, else ``$EDITOR`` (as git and crontab choose); UsageError if neither."""
    env = os.environ if environ is None else environ
    command = (env.get("VISUAL") or env.get("EDITOR") or "").strip()
    if not command:
        raise UsageError("no editor: set $EDITOR (or $VISUAL), or pass --body-file PATH")
    return command


def run_editor(body: bytes, command: str | None = None) -> bytes:
    """Open ``body`` in the editor ``command`` (default ``editor_command()``) and return the
    file as the editor left it; EditUnchanged (64) if the editor fails.

    The file lives in a fresh directory only this user can enter (mode 0700, the file 0600)
    and is removed afterwards: a parked body may hold personal data. It is named ``.json``
    when the body is JSON, so the editor highlights it.
    """
    argv = shlex.split(command if command is not None else editor_command())
    suffix = ".json" if isinstance(shown_body(body), dict | list) else ".txt"
    with tempfile.TemporaryDirectory(prefix="rmqkit-edit-") as folder:
        path = Path(folder) / f"message{suffix}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(body)
        try:
            done = subprocess.run([*argv, str(path)], check=False)
        except OSError as exc:
            raise EditUnchanged(
                f"the editor {argv[0]!r} could not be started ({exc.strerror or exc}): "
                "nothing published"
            ) from None
        if done.returncode != 0:
            raise EditUnchanged(
                f"the editor {argv[0]!r} exited with {done.returncode}: nothing published"
            )
        try:
            return path.read_bytes()
        except OSError as exc:  # the editor removed or renamed it
            raise EditUnchanged(
                f"the edited file cannot be read ({exc.strerror or exc}): nothing published"
            ) from None


# --- checks of the edited body ------------------------------------------------------------------
def _parsed(body: bytes) -> tuple[bool, Any]:
    try:
        return True, json.loads(body)
    except ValueError:
        return False, None


def envelope_paths(value: Any) -> set[str]:
    """The field paths (``customer.name``, ``items[].card``) of every envelope in a parsed
    body, named as ``sensitive_fields`` name them."""
    return {join(parts) for parts in _walk(value, [])}


def _walk(value: Any, parts: list[str]) -> Iterator[list[str]]:
    if is_envelope(value):
        yield list(parts)
    elif isinstance(value, dict):
        for key, child in value.items():
            yield from _walk(child, [*parts, str(key)])
    elif isinstance(value, list):
        for child in value:
            yield from _walk(child, [*parts, ITEMS])


def plaintext_problem(before: bytes, after: bytes, sensitive: Iterable[str]) -> str | None:
    """Why ``after`` may not replace ``before`` as far as encryption goes, or None.

    Only for a stored body that holds envelopes (encrypted at the edge): every field that was
    an envelope there, and every ``sensitive`` field, must still be an envelope (or null, or
    absent) in the edited body — an edit must not publish a field in plaintext by accident.
    An envelope the edit damaged (not the shape rmqkit writes) is refused too: the consumer
    would park it as undecryptable.
    """
    ok, old = _parsed(before)
    if not ok:
        return None
    was_encrypted = envelope_paths(old)
    if not was_encrypted:
        return None
    ok, new = _parsed(after)
    if not ok:
        return (
            "the stored body holds encrypted fields and the edited body is not JSON: "
            "the encrypted fields would be lost or in plaintext"
        )
    for path in sorted(was_encrypted | set(sensitive)):
        for value in leaves(new, path):
            if value is not None and not is_envelope(value):
                return (
                    f"field {path} is encrypted in the stored body but plaintext in the "
                    "edited one — keep its envelope as it was (nothing is re-encrypted)"
                )
    for path in sorted(envelope_paths(new)):
        if any(is_envelope(v) and not is_sealed(v) for v in leaves(new, path)):
            return f"field {path} holds a damaged envelope — keep it exactly as stored"
    return None


def validate_edited(
    handler: LoadedHandler,
    body: bytes,
    original: ParkedMessage,
    keyring: KeyRing | None,
    *,
    routing_key: str = "",
) -> str:
    """Check ``body`` as the consumer would before calling ``handler``: the handler's own
    conversion of its body parameter (a pydantic model, a type pydantic validates, ``str``).
    Returns the type it was validated as; DataError (65) with the consumer's value-free
    detail if it does not validate.

    Envelopes are opened in memory for the check only (the consumer validates decrypted
    bodies); the published body keeps them. A routed handler checks the route the message's
    type selects. ``routing_key``: the one the copy is published with (what the consumer sees).
    """
    ok, parsed = _parsed(body)
    if ok and envelope_paths(parsed):
        if keyring is None:
            raise KeyRingError(
                "validating an encrypted body against --handler needs the key ring: set "
                "RMQKIT_KEYRING_FILE or RMQKIT_KEYRING (or leave out --handler)"
            )
        body = decrypt_fields(body, None, keyring)  # Undecryptable (65) names the field
    message = Message(
        body,
        headers=dict(original.headers),
        message_id=original.message_id,
        routing_key=routing_key,
        content_type=original.properties.content_type,
    )
    if handler.routes is not None:
        chosen = handler.routes.select(message)
        if isinstance(chosen, Undecodable):
            raise DataError(f"the edited message cannot be handled: {chosen.detail}")
        handler = chosen
    if handler.convert is None:
        raise UsageError(
            f"--handler {handler.spec} takes no body parameter (only the Message): there is "
            "no model to validate the edit against — leave out --handler"
        )
    try:
        handler.convert(message)
    except ValidationError as exc:
        detail = _validation_detail(exc, handler.input_type)
        raise DataError(f"{detail}; nothing was published") from None
    except DecodeError as exc:
        raise DataError(f"{exc}; nothing was published") from None
    except RecursionError:
        raise DataError("the body is nested too deeply to decode; nothing was published") from None
    except Exception as exc:  # a model's own validator raising something else
        raise DataError(
            one_line(f"the body does not validate: {type(exc).__name__}: {exc}")
        ) from None
    plain = {HandlerInput.BODY: "bytes", HandlerInput.TEXT: "str"}.get(handler.input)
    return plain or type_label(handler.input_type)


# --- the library call ---------------------------------------------------------------------------
async def edit_parked(
    settings: Settings,
    topology: Topology,
    queue: str,
    message_id: str,
    edit: Editor,
    *,
    handler: str | None = None,
    audit_log: Path = DEFAULT_AUDIT_LOG,
    keyring: KeyRing | None = None,
    dry_run: bool = False,
) -> EditResult:
    """Edit the body of parked message ``message_id`` in ``queue`` with ``edit`` and send the
    copy where a replay would (see the module docstring for the order of things).

    ``handler`` (``module:function``): validate the edited body as its body parameter.
    ``keyring``: only to open envelopes for that validation. ``dry_run``: every check, the
    edit included, and the result says what would be published; nothing is published, removed
    or logged. Errors: UsageError (64: not allowed, unchanged, editor failed), DataError (65:
    not found, invalid, plaintext, no target, changed meanwhile, unroutable), OutputError (74:
    audit log), BrokerError (69: the broker refused the copy or the channel failed).
    """
    work = editable_work_queue(topology, queue)
    spec = topology.queue_spec(work)
    loaded = load_handler(handler) if handler is not None else None  # 78 before anything
    log = AuditLog(audit_log).open() if not dry_run else None
    try:
        original = await find_parked(settings, queue, message_id)
        if original is None:
            raise DataError(
                f"no message with message_id {message_id!r} in {queue!r}; nothing was changed"
            )
        target = replay_target(original, queue)
        if isinstance(target, str):
            why = target.split(":", 1)[0]
            raise DataError(
                f"cannot tell where the edited copy of {message_id!r} would go ({why}): it "
                "goes where a replay would; nothing was changed"
            )
        exchange, routing_key = target
        after = await asyncio.to_thread(edit, original.body)
        if after == original.body:
            raise EditUnchanged("unchanged: nothing published")
        sensitive = [*spec.sensitive_fields, *(loaded.sensitive[0] if loaded else ())]
        problem = plaintext_problem(original.body, after, sensitive)
        if problem is not None:
            raise DataError(f"{problem}; nothing was published")
        validated = (
            validate_edited(loaded, after, original, keyring, routing_key=routing_key)
            if loaded
            else None
        )
        now = datetime.now(UTC)
        headers = replay_headers(original.headers, now)
        headers[EDITED_FROM] = message_id
        result = EditResult(
            queue=queue,
            work_queue=work,
            message_id=message_id,
            new_message_id=None,
            exchange=exchange,
            routing_key=routing_key,
            body_sha256_before=digest(original.body),
            body_sha256_after=digest(after),
            validated_as=validated,
            dry_run=dry_run,
            audit_log=None if dry_run else audit_log,
            headers=headers,
            body=after,
        )
        if log is None:
            return result
        result.new_message_id = new_message_id()
        record = EditRecord(
            at=h.format_timestamp(now),
            amqp_user=amqp_user(settings),
            os_user=os_user(),
            vhost=settings.vhost,
            queue=queue,
            work_queue=work,
            message_id=message_id,
            new_message_id=result.new_message_id,
            exchange=exchange,
            routing_key=routing_key,
            body_sha256_before=result.body_sha256_before,
            body_sha256_after=result.body_sha256_after,
            handler=handler,
        )
        await _publish_and_remove(settings, original, after, headers, record, log)
        return result
    finally:
        if log is not None:
            log.close()


async def _publish_and_remove(
    settings: Settings,
    original: ParkedMessage,
    body: bytes,
    headers: dict[str, Any],
    record: EditRecord,
    log: AuditLog,
) -> None:
    """The second browse: find the message read before, log, publish, ack after the confirm."""
    queue, message_id = record.queue, record.message_id
    identity = message_identity(original)
    # A shallow copy with the new id, so copy_properties builds the copy's properties with it
    # (TypedProperties pins the id it is built with: setting it afterwards is not sent).
    shadow = copy.copy(original.properties)
    shadow.message_id = record.new_message_id
    properties = copy_properties(shadow, headers)
    found = changed = False
    failure: Exception | None = None
    settlement: asyncio.Task[bool] | None = None

    async with parking_session(settings, queue) as session:
        channel = await session.amqp.channel(confirms=True, window=1)
        publisher = channel.publisher

        async def confirmed(settled: asyncio.Future[Outcome]) -> bool:
            """True (the browse acks the original) only for a confirmed copy."""
            nonlocal failure
            await asyncio.wait([settled])
            outcome = outcome_of(settled)
            if outcome is Outcome.CONFIRMED:
                return True
            if outcome is Outcome.RETURNED:
                failure = DataError(
                    f"the edited copy was unroutable (exchange {record.exchange!r} key "
                    f"{record.routing_key!r} reached no queue): nothing was published, "
                    f"{message_id!r} stays parked"
                )
            else:
                shown = "nacked by the broker: the target full?"
                if not isinstance(outcome, Outcome):  # the channel failed: its error's name
                    shown = f"publish failed: {outcome}"
                failure = BrokerError(
                    f"the edited copy was not confirmed ({shown}): {message_id!r} stays "
                    "parked — check the target queue and run again"
                )
            _log_not_published(log, record, getattr(outcome, "value", str(outcome)))
            return False

        async def visit(message: ParkedMessage) -> Verdict | Settlement:
            nonlocal found, changed, failure, settlement
            if found:
                return Verdict.STOP
            if message.message_id != message_id:
                return Verdict.KEEP
            if message_identity(message) != identity:
                changed = True  # same id, other content (parked again?): not what was read
                return Verdict.KEEP
            found = True
            try:
                log.append(record.as_dict())  # durable before the copy exists
            except OutputError as exc:
                failure = OutputError(f"{exc}: nothing was published, {message_id!r} stays parked")
                return Verdict.STOP
            try:
                settled = await publisher.publish(
                    body,
                    exchange=record.exchange,
                    routing_key=record.routing_key,
                    properties=properties,
                )
            except Exception as exc:  # the channel is gone: the copy was never sent
                failure = BrokerError(
                    f"publishing the edited copy failed ({type(exc).__name__}): "
                    f"{message_id!r} stays parked"
                )
                _log_not_published(log, record, type(exc).__name__)
                return Verdict.STOP
            settlement = asyncio.ensure_future(confirmed(settled))
            return settlement

        try:
            await browse(session.amqp, queue, visit)
        except BrowseIncomplete as exc:
            done = settlement is not None and settlement.done() and settlement.result()
            raise BrowseIncomplete(
                f"{exc} (the edited copy was {'confirmed' if done else 'not confirmed'})"
            ) from None
        finally:
            await channel.close()
    if failure is not None:
        raise failure
    if not found:
        why = "its content changed since it was read" if changed else "it is no longer there"
        raise DataError(
            f"{message_id!r} in {queue!r} was not edited: {why} (replayed, purged or parked "
            "again meanwhile?); nothing was published — run the command again"
        )


def _log_not_published(log: AuditLog, record: EditRecord, why: str) -> None:
    """A second line for an edit whose copy the broker did not take (best effort: the first
    line says what was attempted, this one that it did not happen)."""
    entry = {
        "event": "not_published",
        "at": h.format_timestamp(datetime.now(UTC)),
        "message_id": record.message_id,
        "new_message_id": record.new_message_id,
        "why": why,
    }
    # the edit failed anyway; the error the caller raises says so
    with contextlib.suppress(OutputError):
        log.append(entry)


__all__ = [
    "EDITED_FROM",
    "EditResult",
    "EditUnchanged",
    "Editor",
    "body_from_file",
    "edit_parked",
    "editable_work_queue",
    "editor_command",
    "envelope_paths",
    "plaintext_problem",
    "run_editor",
    "shown_body",
    "validate_edited",
]

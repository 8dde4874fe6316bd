"""`rmqkit parking edit`'s checks without a broker: who may edit (the topology's allow_edit),
what an edit may not do to encrypted fields, validation through the consumer's own body
conversion, the $EDITOR runner, and the audit log's lines (docs/parking.md, "Edit and retry").
The broker side is tests/integration/test_parking_edit.py."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import rmqkit
from rmqkit.broker.codec import TypedProperties
from rmqkit.consumer.loading import handler_from_callable
from rmqkit.crypto import KeyRing, KeyRingError, encrypt_fields, generate_keyring
from rmqkit.errors import DataError, OutputError, TopologyFileError, UsageError
from rmqkit.parking.audit import AuditLog, EditRecord, body_digest
from rmqkit.parking.edit import (
    EDITED_FROM,
    EditResult,
    EditUnchanged,
    body_from_file,
    editable_work_queue,
    editor_command,
    envelope_paths,
    plaintext_problem,
    run_editor,
    validate_edited,
)
from rmqkit.parking.model import ParkedMessage
from rmqkit.topology import parse_topology

TOPOLOGY = """
[queues."open.work"]
allow_edit = true

[queues."shut.work"]
parking = "shut.lane"
"""


# --- who may edit ------------------------------------------------------------------------------
def test_only_a_work_queue_that_sets_allow_edit_can_have_its_parked_messages_edited() -> None:
    topology = parse_topology(TOPOLOGY, "t.toml")
    assert editable_work_queue(topology, "open.work.parking") == "open.work"
    with pytest.raises(UsageError, match=r"'shut\.work' in t\.toml does not set allow_edit = true"):
        editable_work_queue(topology, "shut.lane")
    with pytest.raises(UsageError, match=r"no work queue whose parking queue is 'open\.work'"):
        editable_work_queue(topology, "open.work")  # the work queue itself is no parking queue


def test_allow_edit_is_off_by_default_and_strictly_a_boolean() -> None:
    assert parse_topology('[queues."q"]\n', "t.toml").model.queues["q"].allow_edit is False
    with pytest.raises(TopologyFileError, match="allow_edit"):
        parse_topology('[queues."q"]\nallow_edit = "yes"\n', "t.toml")


# --- encrypted fields ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ring() -> KeyRing:
    return generate_keyring()


def _sealed(ring: KeyRing, plain: dict[str, Any], paths: list[str]) -> bytes:
    sealed: bytes = encrypt_fields(json.dumps(plain).encode(), paths, [], ring)
    return sealed


def test_envelope_paths_name_fields_as_sensitive_fields_do(ring: KeyRing) -> None:
    body = _sealed(ring, {"a": {"b": "x"}, "items": [{"card": "1"}, {"card": "2"}]},
                   ["a.b", "items[].card"])  # fmt: skip
    assert envelope_paths(json.loads(body)) == {"a.b", "items[].card"}
    assert envelope_paths({"a": 1}) == set()


def test_an_edit_that_turns_an_envelope_into_plaintext_is_refused(ring: KeyRing) -> None:
    stored = _sealed(ring, {"customer": {"name": "Ann"}, "qty": "x"}, ["customer.name"])
    parsed = json.loads(stored)
    kept = json.dumps({**parsed, "qty": 3}).encode()
    assert plaintext_problem(stored, kept, []) is None
    leaked = json.dumps({**parsed, "customer": {"name": "Ann"}}).encode()
    problem = plaintext_problem(stored, leaked, [])
    assert problem is not None and "customer.name" in problem and "plaintext" in problem
    cleared = json.dumps({**parsed, "customer": {"name": None}}).encode()
    assert plaintext_problem(stored, cleared, []) is None  # null leaks nothing
    removed = json.dumps({"qty": 3}).encode()
    assert plaintext_problem(stored, removed, []) is None  # absent: nothing to protect


def test_a_sensitive_field_added_in_plaintext_to_an_encrypted_body_is_refused(
    ring: KeyRing,
) -> None:
    stored = _sealed(ring, {"customer": {"name": "Ann"}}, ["customer.name"])
    added = json.dumps({**json.loads(stored), "tax_id": "123"}).encode()
    assert plaintext_problem(stored, added, []) is None
    problem = plaintext_problem(stored, added, ["tax_id"])
    assert problem is not None and "tax_id" in problem


def test_an_edit_of_a_body_without_envelopes_is_not_checked_for_them() -> None:
    assert plaintext_problem(b'{"name": "Ann"}', b'{"name": "Bob"}', ["name"]) is None
    assert plaintext_problem(b"\x00 not json", b"other", ["name"]) is None


def test_a_damaged_envelope_or_a_body_no_longer_json_is_refused(ring: KeyRing) -> None:
    stored = _sealed(ring, {"customer": {"name": "Ann"}}, ["customer.name"])
    envelope = json.loads(stored)["customer"]["name"]
    damaged = json.dumps({"customer": {"name": {**envelope, "n": "short"}}}).encode()
    problem = plaintext_problem(stored, damaged, [])
    assert problem is not None and "damaged envelope" in problem
    problem = plaintext_problem(stored, b"customer name Ann", [])
    assert problem is not None and "not JSON" in problem


# --- validation: the consumer's own conversion ---------------------------------------------------
class Order(BaseModel):
    order_id: str
    qty: int


class Customer(BaseModel):
    name: str


class Signup(BaseModel):
    customer: Customer


def takes_order(order: Order) -> None:
    """A handler with a model."""


def takes_text(text: str) -> None:
    """A handler of text bodies."""


def takes_message(message: rmqkit.Message) -> None:
    """A handler with no body parameter."""


def takes_signup(signup: Signup) -> None:
    """A handler whose body has a field the topology encrypts."""


def _parked(body: bytes = b"{}") -> ParkedMessage:
    properties = TypedProperties(message_id="m-1", headers={"rmqkit-origin-queue": "w"})
    return ParkedMessage.from_delivery(1, properties, body)


def test_validation_uses_the_handlers_model_and_names_no_value() -> None:
    handler = handler_from_callable(takes_order)
    ok = validate_edited(handler, b'{"order_id": "o", "qty": 3}', _parked(), None)
    assert ok == "Order"
    with pytest.raises(DataError) as refused:
        validate_edited(handler, b'{"order_id": "o", "qty": "SECRET-VALUE"}', _parked(), None)
    text = str(refused.value)
    assert "does not validate as Order" in text and "qty" in text
    assert "nothing was published" in text
    assert "SECRET-VALUE" not in text
    with pytest.raises(DataError, match="does not validate as Order"):
        validate_edited(handler, b"not json", _parked(), None)


def test_validation_of_text_and_message_handlers() -> None:
    assert validate_edited(handler_from_callable(takes_text), b"hi", _parked(), None) == "str"
    with pytest.raises(DataError, match="not valid UTF-8"):
        validate_edited(handler_from_callable(takes_text), b"\xff\xfe", _parked(), None)
    with pytest.raises(UsageError, match="takes no body parameter"):
        validate_edited(handler_from_callable(takes_message), b"{}", _parked(), None)


def test_an_encrypted_body_is_validated_decrypted_in_memory(ring: KeyRing) -> None:
    handler = handler_from_callable(takes_signup)
    body = _sealed(ring, {"customer": {"name": "Ann"}}, ["customer.name"])
    with pytest.raises(KeyRingError, match="needs the key ring"):
        validate_edited(handler, body, _parked(body), None)
    assert validate_edited(handler, body, _parked(body), ring) == "Signup"
    wrong = _sealed(ring, {"customer": {"name": 5}}, ["customer.name"])
    with pytest.raises(DataError, match=r"customer\.name"):
        validate_edited(handler, wrong, _parked(wrong), ring)


# --- the editor ---------------------------------------------------------------------------------
def _script(tmp_path: Path, text: str) -> str:
    path = tmp_path / "editor"
    path.write_text("#!/bin/sh\n" + text)
    path.chmod(0o755)
    return str(path)


def test_the_editor_edits_a_private_temporary_file_that_is_removed(tmp_path: Path) -> None:
    record = tmp_path / "seen"
    editor = _script(
        tmp_path, f'echo "$1" > {record}\nstat -c %a "$1" "$(dirname "$1")" >> {record}\n'
        "sed -i 's/1/2/' \"$1\"\n",
    )  # fmt: skip
    assert run_editor(b'{"n": 1}', editor) == b'{"n": 2}'
    path, mode, folder_mode = record.read_text().split()
    assert (mode, folder_mode) == ("600", "700") and path.endswith(".json")
    assert not Path(path).exists()
    assert not Path(path).parent.exists()  # its private directory is gone too


def test_a_failing_or_missing_editor_publishes_nothing(tmp_path: Path) -> None:
    with pytest.raises(EditUnchanged, match="exited with 4: nothing published"):
        run_editor(b"x", _script(tmp_path, "exit 4\n"))
    with pytest.raises(EditUnchanged, match="could not be started"):
        run_editor(b"x", str(tmp_path / "no-such-editor"))
    assert issubclass(EditUnchanged, UsageError)  # exit 64


def test_the_editor_is_visual_then_editor() -> None:
    assert editor_command({"VISUAL": "code -w", "EDITOR": "vi"}) == "code -w"
    assert editor_command({"EDITOR": "nano"}) == "nano"
    with pytest.raises(UsageError, match="--body-file"):
        editor_command({"EDITOR": " "})


def test_a_body_file_is_read_byte_for_byte(tmp_path: Path) -> None:
    (tmp_path / "b").write_bytes(b"\x00\xffraw")
    assert body_from_file(tmp_path / "b") == b"\x00\xffraw"
    with pytest.raises(DataError, match="cannot be read"):
        body_from_file(tmp_path / "missing")


# --- the audit log ------------------------------------------------------------------------------
def _record(**changes: Any) -> EditRecord:
    values: dict[str, Any] = {
        "at": "2026-12-01T20:00:00.000Z",
        "amqp_user": "ops",
        "os_user": "ann",
        "vhost": "/",
        "queue": "w.parking",
        "work_queue": "w",
        "message_id": "m-1",
        "new_message_id": "n-1",
        "exchange": "",
        "routing_key": "w",
        "body_sha256_before": body_digest(b"before"),
        "body_sha256_after": body_digest(b"after"),
        "handler": None,
        **changes,
    }
    return EditRecord(**values)


def test_the_audit_log_appends_one_json_line_per_edit_with_digests_not_bodies(
    tmp_path: Path,
) -> None:
    path = tmp_path / "edits.log"
    path.write_text('{"event": "edit", "message_id": "earlier"}\n')
    with AuditLog(path) as log:
        log.append(_record().as_dict())
    first, second = (json.loads(line) for line in path.read_text().splitlines())
    assert first["message_id"] == "earlier"
    assert second["event"] == "edit" and second["new_message_id"] == "n-1"
    assert second["body_sha256_before"] == hashlib.sha256(b"before").hexdigest()
    assert len(second["body_sha256_after"]) == 64 and "body" not in second


def test_an_audit_log_with_a_cut_last_line_or_in_no_directory_is_refused(tmp_path: Path) -> None:
    cut = tmp_path / "cut.log"
    cut.write_text('{"event": "edit"')
    with pytest.raises(OutputError, match="incomplete line"):
        AuditLog(cut).open()
    with pytest.raises(OutputError, match="does not exist"):
        AuditLog(tmp_path / "none" / "edits.log").open()
    with pytest.raises(UsageError, match="is a directory"):
        AuditLog(tmp_path).open()


def test_the_result_shows_the_copy_only_on_a_dry_run() -> None:
    result = EditResult(
        queue="w.parking", work_queue="w", message_id="m-1", new_message_id=None,
        exchange="", routing_key="w", body_sha256_before="a", body_sha256_after="b",
        validated_as=None, dry_run=True, audit_log=None,
        headers={EDITED_FROM: "m-1"}, body=b'{"qty": 3}',
    )  # fmt: skip
    shown = result.as_dict()
    assert shown["body"] == {"qty": 3} and shown["headers"] == {EDITED_FROM: "m-1"}
    result.dry_run, result.new_message_id = False, "n-1"
    assert "body" not in result.as_dict() and "headers" not in result.as_dict()

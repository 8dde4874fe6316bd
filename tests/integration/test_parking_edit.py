"""`rmqkit parking edit` on the real broker (docs/parking.md, "Edit and retry").

Messages are parked straight into the parking queues of tests/topologies/edit.toml with rmqkit's
parking headers (as the consumer parks them), then edited through the real command in a
subprocess. Every test asserts on what the broker holds afterwards (the count of each queue,
the copy's message id, headers and body) and on the audit log's lines.
"""

from __future__ import annotations

import hashlib
import json
import resource
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from rmqkit import headers as h
from rmqkit.crypto import encrypt_fields, generate, load_keyring_file
from rmqkit.errors import DataError
from rmqkit.parking.edit import EDITED_FROM, edit_parked
from rmqkit.parking.model import ParkedFilter, ParkedMessage
from rmqkit.parking.ops import list_parked
from rmqkit.topology import declare_topology, load_topology
from tests import broker

ROOT = Path(__file__).resolve().parents[2]
EDIT = ROOT / "tests" / "topologies" / "edit.toml"
WORK, PARKING = "edit.work", "edit.work.parking"
LOCKED, LOCKED_PARKING = "edit.locked", "edit.locked.parking"
SECRET, SECRET_PARKING = "edit.secret", "edit.secret.parking"
QUEUES = [WORK, PARKING, LOCKED, LOCKED_PARKING, SECRET, SECRET_PARKING]
BAD = b'{"order_id": "o-1", "qty": "many", "note": "ORIGINAL-TEXT-1c9e"}'
FIXED = b'{"order_id": "o-1", "qty": 3, "note": "EDITED-TEXT-77ab"}'
HANDLER = "tests.integration.test_parking_edit:handle"


class Order(BaseModel):
    """The body model of ``handle``: what --handler validates an edit against."""

    order_id: str
    qty: int


def handle(order: Order) -> None:
    """A handler as an application writes one (only its signature matters here)."""


@pytest.fixture(scope="module")
def declared(vhost: str) -> str:
    broker.run(declare_topology(broker.settings_for(vhost), load_topology(EDIT)))
    return vhost


@pytest.fixture
def v(declared: str) -> Iterator[str]:
    """The module's vhost with every queue of edit.toml empty at the start of each test."""
    for name in QUEUES:
        broker.api("DELETE", f"/queues/{broker.q(declared)}/{broker.q(name)}/contents")
    assert set(broker.depths(declared, QUEUES).values()) == {0}
    yield declared


def _parked_headers(origin: str = WORK) -> dict[str, Any]:
    return {
        h.PARK_REASON: "permanent",
        h.ORIGIN_QUEUE: origin,
        h.ORIGINAL_EXCHANGE: "edit",
        h.ORIGINAL_ROUTING_KEY: "job",
        h.ERROR_TYPE: "shop.errors.BadQuantity",
        h.ERROR_MESSAGE: "qty is not a number",
        h.ATTEMPT: 1,
        h.FIRST_FAILED_AT: "2026-12-01T20:00:00.000Z",
        h.LAST_FAILED_AT: "2026-12-01T20:00:00.000Z",
        "tenant": "t-9",  # an application header: kept on the copy
    }


def _park(vhost: str, parking: str, message_id: str, body: bytes, origin: str = WORK) -> None:
    broker.publish_exact(vhost, "", [(parking, message_id, body, _parked_headers(origin))])


def _edit(vhost: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**broker.cli_env(vhost), **env}
    return broker.cli("parking", "edit", *args, "--topology", str(EDIT), env=environment)


def _depths(vhost: str) -> dict[str, int | None]:
    return broker.depths(vhost, [WORK, PARKING, LOCKED_PARKING, SECRET, SECRET_PARKING])


def _parked_ids(vhost: str, parking: str = PARKING) -> list[str]:
    found: list[ParkedMessage] = []
    broker.run(list_parked(broker.settings_for(vhost), parking, ParkedFilter(), found.append))
    return [str(m.message_id) for m in found]


def _audit(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def _sha(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("rmqkit: error: "), result.stderr
    return lines[0]


# --- 1. an edit with --body-file ---------------------------------------------------------------
def test_body_file_edit_publishes_one_copy_under_a_new_id_and_removes_the_original(
    v: str, tmp_path: Path
) -> None:
    _park(v, PARKING, "m-edit", BAD)
    _park(v, PARKING, "m-bystander", BAD)
    (tmp_path / "fixed.json").write_bytes(FIXED)
    log = tmp_path / "edits.log"
    result = _edit(
        v, PARKING, "m-edit", "--body-file", str(tmp_path / "fixed.json"),
        "--audit-log", str(log), "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    new_id = summary["new_message_id"]
    assert new_id and new_id != "m-edit"
    assert (summary["exchange"], summary["routing_key"], summary["dry_run"]) == ("", WORK, False)

    # the broker: exactly one copy in the work queue, the original gone, the bystander kept
    assert _depths(v)[WORK] == 1 and _depths(v)[PARKING] == 1
    assert _parked_ids(v) == ["m-bystander"]
    [copy] = broker.drain(v, WORK)
    assert copy["message_id"] == new_id and copy["body"] == FIXED
    headers = copy["headers"]
    assert headers[EDITED_FROM] == "m-edit"
    assert headers[h.ATTEMPT] == 0 and headers[h.REPLAY_COUNT] == 1 and h.REPLAYED_AT in headers
    assert headers["tenant"] == "t-9" and headers[h.ERROR_TYPE] == "shop.errors.BadQuantity"
    # no dead-letter history travels with it (the work queue's own x-delivery-count may)
    assert not set(headers) & (h.BROKER_HEADERS - h.DELIVERY_COUNTERS), headers

    # the audit log: one entry, the right digests and ids, no body text
    [entry] = _audit(log)
    assert entry["event"] == "edit"
    assert (entry["message_id"], entry["new_message_id"]) == ("m-edit", new_id)
    assert entry["body_sha256_before"] == _sha(BAD) and entry["body_sha256_after"] == _sha(FIXED)
    assert (entry["queue"], entry["work_queue"], entry["vhost"]) == (PARKING, WORK, v)
    assert entry["amqp_user"] == "guest" and entry["os_user"]
    assert entry["at"].endswith("Z")
    text = log.read_text()
    for secret in ("ORIGINAL-TEXT-1c9e", "EDITED-TEXT-77ab", "many", "order_id"):
        assert secret not in text


def test_the_audit_log_defaults_to_the_current_directory(v: str, tmp_path: Path) -> None:
    _park(v, PARKING, "m-default-log", BAD)
    (tmp_path / "fixed.json").write_bytes(FIXED)
    done = subprocess.run(
        [sys.executable, "-m", "rmqkit", "parking", "edit", PARKING, "m-default-log",
         "--topology", str(EDIT), "--body-file", "fixed.json"],
        capture_output=True, text=True, cwd=tmp_path, env=broker.cli_env(v), timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [entry] = _audit(tmp_path / "rmqkit-edits.log")
    assert entry["message_id"] == "m-default-log"
    assert _depths(v)[WORK] == 1 and _depths(v)[PARKING] == 0


# --- 2. refused where the topology does not allow editing --------------------------------------
def test_refused_where_the_topology_does_not_allow_editing(v: str, tmp_path: Path) -> None:
    _park(v, LOCKED_PARKING, "m-locked", BAD, origin=LOCKED)
    (tmp_path / "fixed.json").write_bytes(FIXED)
    log = tmp_path / "edits.log"
    result = _edit(
        v, LOCKED_PARKING, "m-locked", "--body-file", str(tmp_path / "fixed.json"),
        "--audit-log", str(log),
    )  # fmt: skip
    assert result.returncode == 64
    assert "allow_edit = true" in _one_line_error(result)
    assert _parked_ids(v, LOCKED_PARKING) == ["m-locked"]
    assert broker.depths(v, [LOCKED])[LOCKED] == 0
    assert not log.exists()  # refused before the log was even opened


# --- 3. validation against --handler's model ---------------------------------------------------
def test_handler_validation_refuses_an_invalid_edit_and_passes_a_valid_one(
    v: str, tmp_path: Path
) -> None:
    _park(v, PARKING, "m-valid", BAD)
    log = tmp_path / "edits.log"
    still_bad = tmp_path / "still-bad.json"
    still_bad.write_bytes(b'{"order_id": "o-1", "qty": "three"}')
    refused = _edit(
        v, PARKING, "m-valid", "--body-file", str(still_bad), "--handler", HANDLER,
        "--audit-log", str(log),
    )  # fmt: skip
    assert refused.returncode == 65
    line = _one_line_error(refused)
    assert "does not validate as Order" in line and "qty" in line and "three" not in line
    assert _depths(v)[WORK] == 0 and _parked_ids(v) == ["m-valid"]
    assert _audit(log) == []

    (tmp_path / "fixed.json").write_bytes(FIXED)
    accepted = _edit(
        v, PARKING, "m-valid", "--body-file", str(tmp_path / "fixed.json"),
        "--handler", HANDLER, "--audit-log", str(log), "--json",
    )  # fmt: skip
    assert accepted.returncode == 0, accepted.stderr
    summary = json.loads(accepted.stdout)
    assert summary["validated_as"] == "Order"
    assert _depths(v)[PARKING] == 0
    [copy] = broker.drain(v, WORK)
    assert copy["body"] == FIXED and copy["message_id"] == summary["new_message_id"]
    [entry] = _audit(log)
    assert entry["handler"] == HANDLER


# --- 4. the $EDITOR path -----------------------------------------------------------------------
def _script(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + text)
    path.chmod(0o755)
    return path


def test_editor_edits_the_temporary_file(v: str, tmp_path: Path) -> None:
    _park(v, PARKING, "m-editor", BAD)
    log = tmp_path / "edits.log"
    # It also records the temporary file's mode: the body may hold personal data.
    editor = _script(
        tmp_path, "fix-qty", f"stat -c %a \"$1\" > {tmp_path}/mode\n"
        "sed -i 's/\"qty\": \"many\"/\"qty\": 3/' \"$1\"\n",
    )  # fmt: skip
    result = _edit(
        v, PARKING, "m-editor", "--handler", HANDLER, "--audit-log", str(log), "--json",
        EDITOR=str(editor), VISUAL="",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "mode").read_text().strip() == "600"
    [copy] = broker.drain(v, WORK)
    expected = BAD.replace(b'"qty": "many"', b'"qty": 3')
    assert copy["body"] == expected and copy["headers"][EDITED_FROM] == "m-editor"
    assert _depths(v)[PARKING] == 0
    [entry] = _audit(log)
    assert entry["body_sha256_after"] == _sha(expected)


@pytest.mark.parametrize(
    ("script", "said"),
    [("exit 3\n", "exited with 3: nothing published"), ("true\n", "unchanged: nothing published")],
    ids=["editor-fails", "unchanged"],
)
def test_a_failed_or_unchanged_edit_publishes_nothing(
    v: str, tmp_path: Path, script: str, said: str
) -> None:
    _park(v, PARKING, "m-noop", BAD)
    log = tmp_path / "edits.log"
    editor = _script(tmp_path, "editor", script)
    result = _edit(v, PARKING, "m-noop", "--audit-log", str(log), EDITOR=str(editor), VISUAL="")
    assert result.returncode == 64
    assert said in _one_line_error(result)
    assert _depths(v)[WORK] == 0 and _parked_ids(v) == ["m-noop"]
    assert _audit(log) == []


# --- 5. adversarial ------------------------------------------------------------------------------
def test_headers_cannot_be_edited(v: str, tmp_path: Path) -> None:
    """Only the body is editable: there is no way to hand in headers, and a body that looks
    like headers stays a body (the copy's rmqkit-* headers are the replay's)."""
    _park(v, PARKING, "m-headers", BAD)
    (tmp_path / "h.json").write_text(json.dumps({h.ATTEMPT: 7, h.REPLAY_COUNT: 0}))
    offered = _edit(v, PARKING, "m-headers", "--headers-file", str(tmp_path / "h.json"))
    assert offered.returncode == 64 and "--headers-file" in _one_line_error(offered)
    assert _depths(v)[WORK] == 0 and _parked_ids(v) == ["m-headers"]

    body = json.dumps({h.ATTEMPT: 7, EDITED_FROM: "forged", "x-death": []}).encode()
    (tmp_path / "b.json").write_bytes(body)
    log = tmp_path / "edits.log"
    done = _edit(
        v, PARKING, "m-headers", "--body-file", str(tmp_path / "b.json"), "--audit-log", str(log)
    )
    assert done.returncode == 0, done.stderr
    [copy] = broker.drain(v, WORK)
    assert copy["body"] == body
    assert copy["headers"][h.ATTEMPT] == 0 and copy["headers"][EDITED_FROM] == "m-headers"


def test_an_unopenable_audit_log_publishes_nothing(v: str, tmp_path: Path) -> None:
    _park(v, PARKING, "m-nolog", BAD)
    (tmp_path / "fixed.json").write_bytes(FIXED)
    (tmp_path / "a-file").write_text("not a directory\n")
    (tmp_path / "a-dir").mkdir()
    for log, code in ((tmp_path / "a-file" / "edits.log", 74), (tmp_path / "a-dir", 64)):
        result = _edit(
            v, PARKING, "m-nolog", "--body-file", str(tmp_path / "fixed.json"),
            "--audit-log", str(log),
        )  # fmt: skip
        assert result.returncode == code, (log, result.stderr)
        _one_line_error(result)
        assert _depths(v)[WORK] == 0 and _parked_ids(v) == ["m-nolog"], log


def test_an_audit_log_that_cannot_grow_publishes_nothing(v: str, tmp_path: Path) -> None:
    """The log opens but the entry cannot be written (a file size limit, as a full disk): the
    entry comes before the copy, so nothing is published and the message stays parked."""
    _park(v, PARKING, "m-full", BAD)
    (tmp_path / "fixed.json").write_bytes(FIXED)
    log = tmp_path / "edits.log"
    earlier = '{"event": "edit", "message_id": "earlier"}\n'
    log.write_text(earlier)

    def limit() -> None:
        size = len(earlier.encode())
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill

    done = subprocess.run(
        [sys.executable, "-m", "rmqkit", "parking", "edit", PARKING, "m-full",
         "--topology", str(EDIT), "--body-file", str(tmp_path / "fixed.json"),
         "--audit-log", str(log)],
        capture_output=True, text=True, env=broker.cli_env(v), timeout=60, check=False,
        preexec_fn=limit,
    )  # fmt: skip
    assert done.returncode == 74, done.stderr
    assert "nothing was published" in _one_line_error(done)
    assert _depths(v)[WORK] == 0 and _parked_ids(v) == ["m-full"]
    assert log.read_text() == earlier


def test_an_unknown_message_id_changes_nothing(v: str, tmp_path: Path) -> None:
    _park(v, PARKING, "m-present", BAD)
    (tmp_path / "fixed.json").write_bytes(FIXED)
    log = tmp_path / "edits.log"
    result = _edit(
        v, PARKING, "m-absent", "--body-file", str(tmp_path / "fixed.json"),
        "--audit-log", str(log),
    )  # fmt: skip
    assert result.returncode == 65
    assert "no message with message_id 'm-absent'" in _one_line_error(result)
    assert _depths(v)[WORK] == 0 and _parked_ids(v) == ["m-present"]
    assert _audit(log) == []


def test_an_unroutable_copy_leaves_the_original_parked_and_says_so_in_the_log(
    v: str, tmp_path: Path
) -> None:
    _park(v, PARKING, "m-nowhere", BAD, origin="edit.gone")  # its origin queue was deleted
    (tmp_path / "fixed.json").write_bytes(FIXED)
    log = tmp_path / "edits.log"
    result = _edit(
        v, PARKING, "m-nowhere", "--body-file", str(tmp_path / "fixed.json"),
        "--audit-log", str(log),
    )  # fmt: skip
    assert result.returncode == 65
    assert "unroutable" in _one_line_error(result)
    assert _depths(v)[WORK] == 0 and _parked_ids(v) == ["m-nowhere"]
    attempted, failed = _audit(log)
    assert attempted["event"] == "edit" and failed["event"] == "not_published"
    assert failed["new_message_id"] == attempted["new_message_id"] and failed["why"] == "returned"


def test_dry_run_shows_the_copy_and_changes_nothing(v: str, tmp_path: Path) -> None:
    _park(v, PARKING, "m-dry", BAD)
    (tmp_path / "fixed.json").write_bytes(FIXED)
    log = tmp_path / "edits.log"
    result = _edit(
        v, PARKING, "m-dry", "--body-file", str(tmp_path / "fixed.json"),
        "--audit-log", str(log), "--dry-run", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["dry_run"] is True and plan["new_message_id"] is None
    assert plan["body"] == json.loads(FIXED) and plan["headers"][EDITED_FROM] == "m-dry"
    assert plan["headers"][h.ATTEMPT] == 0 and plan["routing_key"] == WORK
    assert _depths(v)[WORK] == 0 and _parked_ids(v) == ["m-dry"]
    assert not log.exists()


def test_a_message_changed_while_being_edited_is_not_published(v: str, tmp_path: Path) -> None:
    """The copy replaces the message that was read: if it was replaced meanwhile (same id,
    other content) or removed, nothing is published and nothing is logged."""
    _park(v, PARKING, "m-race", BAD)
    log = tmp_path / "edits.log"
    settings = broker.settings_for(v)

    def edit_while_someone_reparks(stored: bytes) -> bytes:
        broker.api("DELETE", f"/queues/{broker.q(v)}/{broker.q(PARKING)}/contents")
        _park(v, PARKING, "m-race", b'{"order_id": "o-1", "qty": "other"}')
        return FIXED

    with pytest.raises(DataError, match="content changed since it was read"):
        broker.run(
            edit_parked(
                settings, load_topology(EDIT), PARKING, "m-race", edit_while_someone_reparks,
                audit_log=log,
            )
        )  # fmt: skip
    assert _depths(v)[WORK] == 0 and _parked_ids(v) == ["m-race"]
    assert _audit(log) == []


# --- encrypted bodies --------------------------------------------------------------------------
@pytest.fixture
def sealed(tmp_path: Path) -> tuple[Path, bytes]:
    """A key ring and a body whose customer.name is an envelope."""
    ring_file = tmp_path / "ring.json"
    generate(ring_file)
    plain = {"order_id": "o-2", "qty": "many", "customer": {"name": "SENTINEL-NAME-0b1d"}}
    body = encrypt_fields(
        json.dumps(plain).encode(), ["customer.name"], [], load_keyring_file(ring_file)
    )
    assert b"SENTINEL-NAME-0b1d" not in body and b"$rmqkit_enc" in body
    return ring_file, body


def test_an_edit_that_would_publish_an_encrypted_field_in_plaintext_is_refused(
    v: str, tmp_path: Path, sealed: tuple[Path, bytes]
) -> None:
    _, body = sealed
    _park(v, SECRET_PARKING, "m-secret", body, origin=SECRET)
    log = tmp_path / "edits.log"
    leaked = {"order_id": "o-2", "qty": 3, "customer": {"name": "SENTINEL-NAME-0b1d"}}
    (tmp_path / "leak.json").write_text(json.dumps(leaked))
    refused = _edit(
        v, SECRET_PARKING, "m-secret", "--body-file", str(tmp_path / "leak.json"),
        "--audit-log", str(log),
    )  # fmt: skip
    assert refused.returncode == 65
    assert "customer.name" in _one_line_error(refused) and "plaintext" in refused.stderr
    assert broker.depths(v, [SECRET])[SECRET] == 0
    assert _parked_ids(v, SECRET_PARKING) == ["m-secret"]
    assert _audit(log) == []

    # The editor sees the body as stored: changing another field keeps the envelope as it was.
    editor = _script(tmp_path, "fix", 'sed -i \'s/"qty":"many"/"qty":3/\' "$1"\n')
    assert b'"qty":"many"' in body  # encrypt_fields writes compact JSON
    done = _edit(
        v, SECRET_PARKING, "m-secret", "--audit-log", str(log), EDITOR=str(editor), VISUAL=""
    )
    assert done.returncode == 0, done.stderr
    [copy] = broker.drain(v, SECRET)
    assert copy["body"] == body.replace(b'"qty":"many"', b'"qty":3')
    assert json.loads(copy["body"])["customer"] == json.loads(body)["customer"]
    assert b"SENTINEL-NAME-0b1d" not in copy["body"]
    assert broker.depths(v, [SECRET_PARKING])[SECRET_PARKING] == 0


def test_handler_validation_of_an_encrypted_body_opens_envelopes_in_memory_only(
    v: str, tmp_path: Path, sealed: tuple[Path, bytes]
) -> None:
    ring_file, body = sealed
    _park(v, SECRET_PARKING, "m-secret-valid", body, origin=SECRET)
    log = tmp_path / "edits.log"
    edited = body.replace(b'"qty":"many"', b'"qty":3')
    (tmp_path / "edited.json").write_bytes(edited)
    args = ("--body-file", str(tmp_path / "edited.json"), "--handler", HANDLER)
    without_ring = _edit(v, SECRET_PARKING, "m-secret-valid", *args, "--audit-log", str(log))
    assert without_ring.returncode == 78
    assert "key ring" in _one_line_error(without_ring)
    assert _parked_ids(v, SECRET_PARKING) == ["m-secret-valid"]

    done = _edit(
        v, SECRET_PARKING, "m-secret-valid", *args, "--audit-log", str(log),
        RMQKIT_KEYRING_FILE=str(ring_file),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [copy] = broker.drain(v, SECRET)
    assert copy["body"] == edited  # published as edited: ciphertext, never the decrypted copy
    assert broker.depths(v, [SECRET_PARKING])[SECRET_PARKING] == 0


def test_the_topology_option_is_required(v: str) -> None:
    result = broker.cli("parking", "edit", PARKING, "m-x", env=broker.cli_env(v))
    assert result.returncode == 64 and "--topology" in _one_line_error(result)


def test_a_dry_run_shows_the_body_as_every_parking_view_does(
    v: str, tmp_path: Path, sealed: tuple[Path, bytes]
) -> None:
    """Encrypted fields as [encrypted kid=…], the envelope's ciphertext never printed; in the
    text output and in --json."""
    _, body = sealed
    _park(v, SECRET_PARKING, "m-secret-dry", body, origin=SECRET)
    envelope = json.loads(body)["customer"]["name"]
    ciphertext = envelope["ct"]
    edited = body.replace(b'"qty":"many"', b'"qty":4')
    (tmp_path / "fixed.json").write_bytes(edited)
    log = tmp_path / "edits.log"
    for extra in ([], ["--json"]):
        shown = _edit(
            v, SECRET_PARKING, "m-secret-dry", "--body-file", str(tmp_path / "fixed.json"),
            "--audit-log", str(log), "--dry-run", *extra,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        assert ciphertext not in shown.stdout and "$rmqkit_enc" not in shown.stdout
        assert "[encrypted kid=" in shown.stdout and '"qty": 4' in shown.stdout
    assert _parked_ids(v, SECRET_PARKING) == ["m-secret-dry"] and not log.exists()

"""Field encryption: what leaked around the ciphertext, and the shapes that went out in
plaintext — on the real broker (and SQLite / PostgreSQL for the outbox).

- a derived message_id of a body with sensitive fields cannot be brute-forced back into the
  value (the test tries, over the value's keyspace);
- a key ring pasted into RMQKIT_KEYRING_FILE is never printed (config, publish, consume);
- a handler's error quoting a decrypted value (json.dumps, repr, ascii, pydantic's truncated
  input_value, plain) leaves no trace of it in the parked headers, the consumer's log (text
  and JSON), `parking show` or `parking list --json`;
- a sensitive value at a shape the path does not reach (a list of objects, a list body, a
  flattened key, a scalar where an object was expected) is refused (65, the path named) by
  `publish --topology`, `outbox.add(encryptor=)` and the relay's check; a fake envelope is not
  "encrypted"; array paths (``items[].card``) are encrypted;
- a consumer without a key ring refuses an ``encrypt = true`` queue (78);
- a lone surrogate in a sensitive field is 65 naming the line and field at publish, and an
  envelope holding one parks ``undecryptable`` at the consumer;
- a message sent past the file's exchanges (to a partition exchange, a partition or a lane queue
  by name) is encrypted like one sent through them, and stays where it was sent.
"""

from __future__ import annotations

import base64
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

import rmqkit.outbox
from rmqkit.crypto import KeyRing, is_envelope, load_keyring_file
from rmqkit.crypto.envelope import _aad
from rmqkit.errors import DataError
from rmqkit.outbox import Encryptor, RelayOptions, run_relay
from rmqkit.publish import derived_message_id
from rmqkit.topology import declare_topology, load_topology
from tests import broker
from tests.consumer_harness import ROOT, wait_until
from tests.integration.test_outbox import drop_schema, pg_schema_dsn

TOKEN = "ZqX7wP"  # in every planted value, at both ends: survives quoting, escaping, truncation
TOPOLOGY = """
[exchanges.lk]
type = "direct"

[queues."lk.work"]
bind = [{ exchange = "lk", routing_key = "order" }]
retry_delays = []
max_attempts = 1
sensitive_fields = ["customer.name", "tax_id"]
blind_index = ["tax_id"]
encrypt = true

[queues."lk.ids"]
bind = [{ exchange = "lk", routing_key = "id" }]
retry_delays = []
sensitive_fields = ["tax_id"]
encrypt = true

[queues."lk.shapes"]
bind = [{ exchange = "lk", routing_key = "shape" }]
retry_delays = []
sensitive_fields = ["customer.name", "items[].card", "tax_id"]
encrypt = true

[queues."lk.guard"]
bind = [{ exchange = "lk", routing_key = "guard" }]
retry_delays = []
sensitive_fields = ["tax_id"]
encrypt = true

[queues."lk.parts"]
partitions = 2
partition_key = "acct"
retry_delays = []
sensitive_fields = ["tax_id"]
encrypt = true

[queues."lk.laned"]
bind = [{ exchange = "lk", routing_key = "laned" }]
retry_delays = []
sensitive_fields = ["tax_id"]
encrypt = true
[queues."lk.laned".lanes.vip]
header = { tier = "vip" }
"""


def planted(i: int) -> str:
    """A value with quotes, a backslash, non-ASCII, longer than 40 characters."""
    return f'{TOKEN} "quo\\ted" Ünï€ №{i:02d} ' + "x" * 30 + f" {TOKEN}"


@dataclass
class Setup:
    vhost: str
    tmp: Path
    topology: Path
    ring_file: Path
    ring: KeyRing

    @property
    def env(self) -> dict[str, str]:
        return {"RMQKIT_KEYRING_FILE": str(self.ring_file)}

    def run(
        self, *args: str, stdin: str | None = None, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        full = broker.cli_env(self.vhost)
        full.update(self.env if env is None else env)
        return subprocess.run(
            [sys.executable, "-m", "rmqkit", *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=full,
            cwd=ROOT,
            timeout=120,
            check=False,
        )


@pytest.fixture(scope="module")
def setup(vhost: str, tmp_path_factory: pytest.TempPathFactory) -> Setup:
    tmp = tmp_path_factory.mktemp("leaks")
    topology = tmp / "lk.toml"
    topology.write_text(TOPOLOGY)
    broker.run(declare_topology(broker.settings_for(vhost), load_topology(topology)))
    ring_file = tmp / "ring.json"
    state = Setup(vhost, tmp, topology, ring_file, None)  # type: ignore[arg-type]
    made = state.run("keys", "generate", "--out", str(ring_file))
    assert made.returncode == 0, made.stderr
    state.ring = load_keyring_file(ring_file)
    return state


def _materials(ring_file: Path) -> list[str]:
    data = json.loads(ring_file.read_text())
    return [k["key"] for k in data["keys"]] + [data["index_key"]["key"]]


# --- the message id -----------------------------------------------------------------------------
def test_a_derived_id_does_not_give_the_encrypted_value_away(setup: Setup) -> None:
    values = [f"{v:06d}" for v in random.Random(6).sample(range(100_000, 200_000), 10)]
    stdin = "".join(json.dumps({"order": i, "tax_id": v}) + "\n" for i, v in enumerate(values))
    first = setup.run("publish", "lk", "id", "--topology", str(setup.topology), stdin=stdin)
    assert first.returncode == 0, first.stderr
    got = broker.drain(setup.vhost, "lk.ids")
    assert len(got) == 10 and all(is_envelope(json.loads(m["body"])["tax_id"]) for m in got)
    # A reader of the queue knows the input's format, the exchange, the key, the line numbers
    # and a keyspace of 10**5 holding every value: the id must not confirm any guess.
    recovered = []
    for message in got:
        order = json.loads(message["body"])["order"]
        for v in range(100_000, 200_000):
            line = f'{{"order": {order}, "tax_id": "{v:06d}"}}'.encode()
            if derived_message_id("lk", "id", order + 1, line) == message["message_id"]:
                recovered.append(v)
                break
    assert recovered == []
    # still stable: the same input published again gets the same ids (dedupe of a rerun)
    again = setup.run("publish", "lk", "id", "--topology", str(setup.topology), stdin=stdin)
    assert again.returncode == 0, again.stderr
    assert sorted(m["message_id"] for m in broker.drain(setup.vhost, "lk.ids")) == sorted(
        m["message_id"] for m in got
    )


# --- the key ring in the wrong setting ----------------------------------------------------------
@pytest.mark.parametrize(
    "command",
    [
        ["config"],
        ["config", "--json"],
        ["publish", "lk", "id", "--topology", "{topology}", "--body", '{"tax_id": "1"}'],
        ["consume", "tests.leak_handlers:leak", "--queue", "lk.guard", "--topology", "{topology}"],
    ],
    ids=["config", "config-json", "publish", "consume"],
)
def test_a_key_ring_pasted_into_the_file_setting_is_never_printed(
    setup: Setup, command: list[str]
) -> None:
    args = [a.replace("{topology}", str(setup.topology)) for a in command]
    result = setup.run(*args, env={"RMQKIT_KEYRING_FILE": setup.ring_file.read_text()})
    assert result.returncode == 78, result.stderr
    out = result.stdout + result.stderr
    for material in _materials(setup.ring_file):
        assert material not in out and material[:12] not in out
    assert '"format"' not in out and "index_key" not in out
    # what the setting should hold, and where the JSON goes
    assert "RMQKIT_KEYRING_FILE takes the path" in result.stderr, result.stderr
    assert "goes in RMQKIT_KEYRING" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


# --- handler errors quoting decrypted values ----------------------------------------------------
MODES = ["json", "repr", "ascii", "pydantic", "raw"]


class Consumer:
    """`rmqkit consume HANDLER --queue QUEUE` with the key ring, its log in a file."""

    def __init__(
        self, setup: Setup, handler: str, log_format: str, name: str, queue: str = "lk.work"
    ) -> None:
        env = broker.cli_env(setup.vhost) | setup.env
        self.log_path = setup.tmp / f"{name}.log"
        self._log = self.log_path.open("w")
        cmd = [sys.executable, "-m", "rmqkit", "--verbose", "consume", handler]
        cmd += ["--queue", queue, "--topology", str(setup.topology)]
        cmd += ["--log-format", log_format]
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT
        )

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log.close()
        return self.log_path.read_text()


def publish_records(setup: Setup, records: list[dict[str, Any]]) -> None:
    stdin = "".join(json.dumps(r) + "\n" for r in records)
    args = ["publish", "lk", "order", "--ndjson", "--topology", str(setup.topology)]
    result = setup.run(*args, stdin=stdin)
    assert result.returncode == 0, result.stderr


def parked_count(setup: Setup) -> int:
    return broker.depths(setup.vhost, ["lk.work.parking"])["lk.work.parking"] or 0


@pytest.fixture(scope="module")
def failed(setup: Setup) -> Iterator[dict[str, str]]:
    """Every mode's message handled and parked, half under a text log, half under JSON; the
    texts each place holds (the parked copies are drained at the end)."""
    texts: dict[str, str] = {}
    ids: list[str] = []
    for n, log_format in enumerate(["text", "json"]):
        records = [
            {
                "message_id": f"{mode}-{log_format}",
                "body": {"mode": mode, "customer": {"name": planted(n * 10 + i)}, "tax_id": "9"},
            }
            for i, mode in enumerate(MODES)
        ]
        ids += [r["message_id"] for r in records]
        before = parked_count(setup)
        publish_records(setup, records)
        consumer = Consumer(setup, "tests.leak_handlers:leak", log_format, f"leak-{log_format}")
        try:
            assert wait_until(lambda n=before: parked_count(setup) >= n + len(MODES), 30)
        finally:
            texts[f"consumer log ({log_format})"] = consumer.stop()
    parking = "lk.work.parking"
    listed = setup.run("parking", "list", parking, "--json")
    assert listed.returncode == 0, listed.stderr
    texts["parking list --json"] = listed.stdout + listed.stderr
    for mid in ids[: len(MODES)]:  # the headers do not depend on the log format
        shown = setup.run("parking", "show", parking, mid)
        assert shown.returncode == 0, shown.stderr
        texts[f"parking show {mid}"] = shown.stdout + shown.stderr
    texts["listed ids"] = "\n".join(
        json.loads(line)["message_id"] for line in listed.stdout.split("\n") if line
    )
    yield texts


def test_no_spelling_of_a_decrypted_value_in_error_text(
    setup: Setup, failed: dict[str, str]
) -> None:
    for mode in MODES:
        for log_format in ("text", "json"):
            assert f"{mode}-{log_format}" in failed["listed ids"]
    for place, text in failed.items():
        assert TOKEN not in text, place
    parked = {m["message_id"]: m["headers"] for m in broker.drain(setup.vhost, "lk.work.parking")}
    assert set(parked) >= {f"{m}-{f}" for m in MODES for f in ("text", "json")}
    for mid, headers in parked.items():
        text = json.dumps({k: str(v) for k, v in headers.items()}, ensure_ascii=False)
        assert TOKEN not in text, mid
        message = str(headers["rmqkit-error-message"])
        # what stays for triage: the type, a digest to group equal errors, the frames
        assert (
            message.startswith("[withheld: ") and "Permanent on a message with decrypted" in message
        )
        assert "digest " in message
        assert 'leak_handlers.py", line' in str(headers["rmqkit-traceback"])


# --- shapes the path does not reach -------------------------------------------------------------
V = planted(99)
REFUSED = {
    "list of objects": ({"customer": [{"name": V}]}, "customer.name"),
    "list body": ([{"customer": {"name": V}}], "customer.name"),
    "flattened key": ({"customer.name": V}, "customer.name"),
    "scalar for an object": ({"customer": V}, "customer.name"),
    "object for a list": ({"items": {"card": V}}, "items[].card"),
}


@pytest.mark.parametrize("shape", list(REFUSED))
def test_publish_refuses_a_shape_the_path_does_not_reach(setup: Setup, shape: str) -> None:
    body, path = REFUSED[shape]
    stdin = json.dumps({"ok": 1}) + "\n" + json.dumps(body) + "\n"
    result = setup.run("publish", "lk", "shape", "--topology", str(setup.topology), stdin=stdin)
    assert result.returncode == 65, result.stderr
    assert path in result.stderr and ":2" in result.stderr and TOKEN not in result.stderr
    assert broker.depths(setup.vhost, ["lk.shapes"])["lk.shapes"] == 0  # not even line 1


def test_array_paths_are_encrypted(setup: Setup) -> None:
    body = {"items": [{"card": V}, {"sku": "a"}, {"card": {"holder": V}}], "tax_id": V}
    args = ["publish", "lk", "shape", "--topology", str(setup.topology), "--body", json.dumps(body)]
    result = setup.run(*args)
    assert result.returncode == 0, result.stderr
    [message] = broker.drain(setup.vhost, "lk.shapes")
    assert TOKEN.encode() not in message["body"]
    items = json.loads(message["body"])["items"]
    assert is_envelope(items[0]["card"]) and is_envelope(items[2]["card"])


@pytest.mark.parametrize(
    ("exchange", "routing_key", "lands_in"),
    [
        ("lk.parts.partition", "", ("lk.parts.p0", "lk.parts.p1")),
        ("", "lk.parts.p1", ("lk.parts.p1",)),
        ("", "lk.laned.lane.vip", ("lk.laned.lane.vip",)),
        # not a vip message, sent to the lane by name: it is not moved to another queue
        ("", "lk.laned.lane.vip", ("lk.laned.lane.vip",)),
    ],
    ids=["partition-exchange", "partition-queue", "lane-queue", "lane-queue-no-match"],
)
def test_a_message_sent_past_the_files_exchanges_is_encrypted(
    setup: Setup, exchange: str, routing_key: str, lands_in: tuple[str, ...], request: Any
) -> None:
    tier = "bulk" if request.node.callspec.id.endswith("no-match") else "vip"
    body = {"tax_id": V, "n": 1}
    args = ["publish", exchange, routing_key, "--topology", str(setup.topology)]
    args += ["--header", "acct=a-17", "--header", f"tier={tier}", "--body", json.dumps(body)]
    result = setup.run(*args)
    assert result.returncode == 0, result.stderr
    held = {queue: broker.drain_consumed(setup.vhost, queue) for queue in lands_in}
    messages = [m for got in held.values() for m in got]
    assert len(messages) == 1, {q: len(m) for q, m in held.items()}
    assert TOKEN.encode() not in messages[0]["body"]
    assert is_envelope(json.loads(messages[0]["body"])["tax_id"])
    others = {"lk.laned", "lk.work", "lk.parts.p0", "lk.parts.p1", "lk.laned.lane.vip"}
    assert set(broker.depths(setup.vhost, others - set(lands_in)).values()) == {0}


@pytest.fixture(params=["sqlite", "postgresql"])
def dsn(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/app.db"
        return
    schema, pg = pg_schema_dsn("rmqkit_leak")
    yield pg
    drop_schema(schema)


def _connect(dsn: str) -> Any:
    if dsn.startswith("sqlite"):
        return sqlite3.connect(dsn.removeprefix("sqlite:///"))
    return psycopg.connect(dsn)


def _rows(conn: Any) -> int:
    return int(conn.execute("SELECT count(*) FROM rmqkit_outbox").fetchone()[0])


FAKE = {"tax_id": {"$rmqkit_enc": 1, "v": V}}


def test_outbox_add_and_the_relay_refuse_shapes_and_fake_envelopes(setup: Setup, dsn: str) -> None:
    rmqkit.outbox.init(dsn)
    conn = _connect(dsn)
    try:
        encryptor = Encryptor(keyring=setup.ring, topology=load_topology(setup.topology))
        for shape, (body, path) in REFUSED.items():
            with pytest.raises(DataError, match=path.replace("[", r"\[").replace("]", r"\]")):
                rmqkit.outbox.add(
                    conn, exchange="lk", routing_key="shape", body=body, encryptor=encryptor
                )
            assert _rows(conn) == 0, shape
        # rows written without the encryptor: the relay's check keeps every one pending
        bad = [
            rmqkit.outbox.add(conn, exchange="lk", routing_key="shape", body=body)
            for body, _ in [*REFUSED.values(), (FAKE, "tax_id")]
        ]
        conn.commit()
        options = RelayOptions(dsn=dsn, once=True, topology=str(setup.topology))
        report = broker.run(run_relay(broker.settings_for(setup.vhost), options))
        assert (report.published, report.left_pending) == (0, len(bad)), report.errors
        for mid, (_, path) in zip(bad, [*REFUSED.values(), (FAKE, "tax_id")], strict=True):
            assert path in report.errors[mid] and TOKEN not in report.errors[mid]
        assert broker.depths(setup.vhost, ["lk.shapes"])["lk.shapes"] == 0
    finally:
        conn.close()


# --- a consumer without the key ring ------------------------------------------------------------
def test_a_consumer_without_a_key_ring_refuses_an_encrypting_queue(setup: Setup) -> None:
    body = json.dumps({"tax_id": "123"})
    sent = setup.run("publish", "lk", "guard", "--topology", str(setup.topology), "--body", body)
    assert sent.returncode == 0, sent.stderr
    args = ["consume", "tests.leak_handlers:leak", "--queue", "lk.guard"]
    env = broker.cli_env(setup.vhost)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rmqkit", *args, "--topology", str(setup.topology)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
        pytest.fail("consume started on an encrypt = true queue without a key ring")
    assert proc.returncode == 78, err
    assert "RMQKIT_KEYRING_FILE" in err and "lk.guard" in err
    assert broker.depths(setup.vhost, ["lk.guard", "lk.guard.parking"]) == {
        "lk.guard": 1,
        "lk.guard.parking": 0,
    }
    broker.drain(setup.vhost, "lk.guard")


# --- lone surrogates ----------------------------------------------------------------------------
def test_a_lone_surrogate_is_65_naming_line_and_field(setup: Setup) -> None:
    stdin = '{"tax_id": "ok"}\n\n{"tax_id": "\\ud83d", "x": 1}\n'
    result = setup.run("publish", "lk", "guard", "--topology", str(setup.topology), stdin=stdin)
    assert result.returncode == 65, result.stderr
    assert ":3" in result.stderr and "tax_id" in result.stderr and "surrogate" in result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr
    assert broker.depths(setup.vhost, ["lk.guard"])["lk.guard"] == 0
    # elsewhere in the body a lone surrogate is just carried (escaped, as it came)
    stdin = '{"tax_id": "ok", "note": "\\ud83d"}\n'
    result = setup.run("publish", "lk", "guard", "--topology", str(setup.topology), stdin=stdin)
    assert result.returncode == 0, result.stderr
    [message] = broker.drain(setup.vhost, "lk.guard")
    assert b'"\\ud83d"' in message["body"] and is_envelope(json.loads(message["body"])["tax_id"])


def _surrogate_envelope(ring: KeyRing, path: str) -> dict[str, Any]:
    """An authentic envelope (not one rmqkit would write) whose plaintext is "\\ud83d"."""
    kid, nonce = ring.current_id, os.urandom(12)
    ct = ring.cipher(kid).encrypt(nonce, b'"\\ud83d"', _aad(path, kid))
    return {
        "$rmqkit_enc": 1,
        "kid": kid,
        "n": base64.b64encode(nonce).decode(),
        "ct": base64.b64encode(ct).decode(),
    }


def test_an_envelope_holding_a_lone_surrogate_parks_undecryptable(setup: Setup) -> None:
    body = {"mode": "raw", "customer": {"name": _surrogate_envelope(setup.ring, "customer.name")}}
    broker.publish_with_ids(
        setup.vhost, "lk", "order", [("surrogate-1", json.dumps(body).encode())]
    )
    before = parked_count(setup)
    consumer = Consumer(setup, "tests.leak_handlers:leak", "text", "surrogate")
    try:
        assert wait_until(lambda: parked_count(setup) > before, 30), consumer.log_path.read_text()
    finally:
        log = consumer.stop()
    parked = {m["message_id"]: m["headers"] for m in broker.drain(setup.vhost, "lk.work.parking")}
    assert parked["surrogate-1"]["rmqkit-park-reason"] == "undecryptable", log
    assert "surrogate" in str(parked["surrogate-1"]["rmqkit-error-message"])

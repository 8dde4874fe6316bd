"""One more variant of each field-encryption leak, as an on-call engineer or an attacker would
try it (test_encryption_leaks.py has the cases as reported), on the real broker and SQLite.

- ids: NDJSON records without a message_id, the value in an array path, a 4-digit keyspace;
  one ``--body``; the attacker brute-forces every id;
- key ring settings holding a bare base64 key (both settings), the ring's JSON in a ``.env``
  file, ``keys show`` reading the environment;
- handler errors: the value URL-encoded, split over two lines, base64-encoded, only in a chained
  cause and a note, and quoted by a pydantic model's own validator (parked undecodable);
- shapes: nested arrays ``a[].b[].c`` with a scalar or an object in the way; a marked field that
  is null, a number or an object (encrypted, not skipped); envelopes with a malformed key id, a
  truncated tag, ``$rmqkit_enc: true``, an unknown key id;
- a consumer of a lane of an encrypting work queue, with both key-ring settings empty: 78;
- lone surrogates: a low one in an array path, inside an object value, through ``--body`` and
  through ``outbox.add``.
"""

from __future__ import annotations

import base64
import json
import signal
import sqlite3
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import rmqkit.outbox
from rmqkit.crypto import generate_keyring, is_envelope, load_keyring_file
from rmqkit.crypto.envelope import seal
from rmqkit.errors import DataError
from rmqkit.outbox import Encryptor, RelayOptions, run_relay
from rmqkit.publish import derived_message_id
from rmqkit.topology import declare_topology, load_topology
from tests import broker
from tests.consumer_harness import ROOT, wait_until
from tests.integration.test_encryption_leaks import TOKEN, Consumer, Setup, planted

TOPOLOGY = """
[exchanges.lk]
type = "direct"

[queues."lk.work"]
bind = [{ exchange = "lk", routing_key = "order" }]
retry_delays = []
max_attempts = 1
sensitive_fields = ["customer.name", "tax_id"]
encrypt = true

[queues."lk.typed"]
bind = [{ exchange = "lk", routing_key = "typed" }]
retry_delays = []
sensitive_fields = ["customer.name"]
encrypt = true

[queues."lk.ids"]
bind = [{ exchange = "lk", routing_key = "id" }]
retry_delays = []
sensitive_fields = ["items[].pin"]
encrypt = true

[queues."lk.shapes"]
bind = [{ exchange = "lk", routing_key = "shape" }]
retry_delays = []
sensitive_fields = ["a[].b[].c", "secret", "items[].card"]
encrypt = true

[queues."lk.guard"]
bind = [{ exchange = "lk", routing_key = "guard" }]
retry_delays = []
sensitive_fields = ["tax_id"]
encrypt = true

[queues."lk.guard".lanes.slow]
header = { "x-lane" = "slow" }
"""


@pytest.fixture(scope="module")
def adv(vhost: str, tmp_path_factory: pytest.TempPathFactory) -> Setup:
    tmp = tmp_path_factory.mktemp("adv")
    topology = tmp / "adv.toml"
    topology.write_text(TOPOLOGY)
    broker.run(declare_topology(broker.settings_for(vhost), load_topology(topology)))
    ring_file = tmp / "ring.json"
    state = Setup(vhost, tmp, topology, ring_file, None)  # type: ignore[arg-type]
    made = state.run("keys", "generate", "--out", str(ring_file))
    assert made.returncode == 0, made.stderr
    state.ring = load_keyring_file(ring_file)
    return state


def depth(adv: Setup, queue: str) -> int:
    return broker.depths(adv.vhost, [queue])[queue] or 0


# --- 6: ids ----------------------------------------------------------------------------------
def test_ndjson_and_body_ids_do_not_confirm_any_guess(adv: Setup) -> None:
    pins = [f"{(i * 7919) % 10_000:04d}" for i in range(1, 11)]
    records = [{"body": {"n": i, "items": [{"pin": pin}]}} for i, pin in enumerate(pins)]
    stdin = "".join(json.dumps(r) + "\n" for r in records)
    args = ["publish", "lk", "id", "--ndjson", "--topology", str(adv.topology)]
    assert adv.run(*args, stdin=stdin).returncode == 0
    one = json.dumps({"n": 99, "items": [{"pin": "0042"}]})
    args = ["publish", "lk", "id", "--topology", str(adv.topology), "--body", one]
    assert adv.run(*args).returncode == 0
    got = broker.drain(adv.vhost, "lk.ids")
    assert len(got) == 11
    recovered = []
    for message in got:
        n = json.loads(message["body"])["n"]
        position = 1 if n == 99 else n + 1
        for guess in range(10_000):
            candidate = json.dumps({"n": n, "items": [{"pin": f"{guess:04d}"}]}).encode()
            if derived_message_id("lk", "id", position, candidate) == message["message_id"]:
                recovered.append(guess)
                break
    assert recovered == []
    assert all(is_envelope(json.loads(m["body"])["items"][0]["pin"]) for m in got)


def test_an_id_taken_from_a_sensitive_field_is_refused(adv: Setup) -> None:
    body = {"secret": "123456", "n": 1}
    for args, stdin in (
        (["--body", json.dumps(body), "--id-from", "secret"], None),
        (["--ndjson", "--id-from", "body.secret"], json.dumps({"body": body}) + "\n"),
        (["--id-from", "a"], json.dumps({"a": [{"b": "123456"}]}) + "\n"),  # not an id
    ):
        result = adv.run(
            "publish", "lk", "shape", "--topology", str(adv.topology), *args, stdin=stdin
        )
        assert result.returncode in (64, 65), result.stderr
        assert "123456" not in result.stderr
    assert depth(adv, "lk.shapes") == 0


# --- 7: key ring settings ----------------------------------------------------------------------
def test_a_bare_key_or_the_json_in_dotenv_is_never_printed(adv: Setup) -> None:
    key = json.loads(adv.ring_file.read_text())["keys"][0]["key"]
    ring_json = " ".join(adv.ring_file.read_text().split())  # one line, as pasted into .env
    cases = [
        (["config"], {"RMQKIT_KEYRING_FILE": key}, None),
        (["config", "--json"], {"RMQKIT_KEYRING": key}, None),
        (["keys", "show"], {"RMQKIT_KEYRING_FILE": adv.ring_file.read_text()}, None),
        (["config"], {"RMQKIT_KEYRING_FILE": ""}, f"RMQKIT_KEYRING_FILE='{ring_json}'\n"),
    ]
    materials = [k["key"] for k in json.loads(adv.ring_file.read_text())["keys"]]
    materials.append(json.loads(adv.ring_file.read_text())["index_key"]["key"])
    for args, env, dotenv in cases:
        cwd = adv.tmp / "dotenv"
        cwd.mkdir(exist_ok=True)
        (cwd / ".env").write_text(dotenv or "")
        full = broker.cli_env(adv.vhost) | env
        if dotenv is not None:
            full.pop("RMQKIT_KEYRING_FILE", None)
        result = subprocess.run(
            [sys.executable, "-m", "rmqkit", *args],
            capture_output=True,
            text=True,
            env=full | {"PYTHONPATH": str(ROOT)},
            cwd=cwd,
            timeout=60,
            check=False,
        )
        out = result.stdout + result.stderr
        assert result.returncode == 78, (args, out)
        for material in materials:
            assert material[:10] not in out, (args, out)
        assert "RMQKIT_KEYRING" in result.stderr


# --- 8: handler errors ---------------------------------------------------------------------------
ADV_MODES = ["url", "split", "base64", "chained"]


def _spellings(value: str) -> list[str]:
    """Forms of ``value`` a text could hold that do not contain TOKEN as such."""
    raw = value.encode()
    return [base64.b64encode(raw).decode()[:16], urllib.parse.quote(value)[:16]]


PARKINGS = ["lk.work.parking", "lk.typed.parking"]


def _parked(adv: Setup) -> list[int]:
    found = broker.depths(adv.vhost, PARKINGS)
    return [found[q] or 0 for q in PARKINGS]


@pytest.fixture(scope="module")
def adv_failed(adv: Setup) -> Iterator[tuple[dict[str, str], list[str]]]:
    """Per log format: the leak modes to lk.work (its handler fails each) and one message to
    lk.typed (whose handler's model rejects the value, quoting it), both consumers at once."""
    texts: dict[str, str] = {}
    values: list[str] = []
    shown: list[tuple[str, str]] = []
    for n, log_format in enumerate(["text", "json"]):
        start = _parked(adv)
        consumers = []
        for queue, key, handler, modes in (
            ("lk.work", "order", "leak", ADV_MODES),
            ("lk.typed", "typed", "typed", ["typed"]),
        ):
            batch = []
            for i, mode in enumerate(modes):
                value = planted(50 + n * 10 + i + (5 if handler == "typed" else 0))
                values.append(value)
                body = {"mode": mode, "customer": {"name": value}, "tax_id": "1"}
                batch.append({"message_id": f"{mode}-{log_format}", "body": body})
                shown.append((f"{queue}.parking", f"{mode}-{log_format}"))
            stdin = "".join(json.dumps(r) + "\n" for r in batch)
            args = ["publish", "lk", key, "--ndjson", "--topology", str(adv.topology)]
            assert adv.run(*args, stdin=stdin).returncode == 0
            name = f"{handler}-{log_format}"
            consumers.append(
                Consumer(adv, f"tests.leak_handlers:{handler}", log_format, name, queue)
            )
        target = [start[0] + len(ADV_MODES), start[1] + 1]
        try:
            assert wait_until(lambda t=target: all(map(int.__ge__, _parked(adv), t)), 40)
        finally:
            for consumer in consumers:
                texts[f"log {consumer.log_path.stem}"] = consumer.stop()
    for queue in PARKINGS:
        listed = adv.run("parking", "list", queue, "--json")
        assert listed.returncode == 0, listed.stderr
        texts[f"parking list --json {queue}"] = listed.stdout
    for queue, mid in shown[: len(ADV_MODES) + 1]:  # the headers do not depend on the format
        result = adv.run("parking", "show", queue, mid)
        texts[f"parking show {mid}"] = result.stdout + result.stderr
    yield texts, values


def test_no_encoded_or_split_value_survives(adv: Setup, adv_failed: Any) -> None:
    texts, values = adv_failed
    parked = [m for queue in PARKINGS for m in broker.drain(adv.vhost, queue)]
    reasons = {m["message_id"]: m["headers"]["rmqkit-park-reason"] for m in parked}
    assert reasons["typed-text"] == "undecodable" and reasons["url-json"] == "permanent"
    for message in parked:
        texts[f"headers {message['message_id']}"] = json.dumps(
            {k: str(v) for k, v in message["headers"].items()}, ensure_ascii=False
        )
    for place, text in texts.items():
        assert TOKEN not in text, place
        for value in values:
            for spelling in _spellings(value):
                assert spelling not in text, (place, spelling)
    digests = {
        m["message_id"]: str(m["headers"]["rmqkit-error-message"]).rsplit("digest ", 1)[-1]
        for m in parked
    }
    assert digests["url-text"] != digests["url-json"]  # different values, different digests
    assert digests["chained-text"] == digests["chained-json"]  # the same text: groupable


# --- 9: shapes -----------------------------------------------------------------------------------
V = planted(77)


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"a": [{"b": V}]}, "a[].b[].c"),  # a scalar where the inner list should be
        ({"a": [{"b": [{"c": 1}, {"c": 2}]}, {"b": {"c": V}}]}, "a[].b[].c"),  # an object
        ({"a": [{"b": [[{"c": V}]]}]}, "a[].b[].c"),  # a list in a list
        ({"a[].b[].c": V}, "a[].b[].c"),  # the pattern itself as a key
    ],
)
def test_nested_array_shapes_are_refused(adv: Setup, body: Any, path: str) -> None:
    args = ["publish", "lk", "shape", "--topology", str(adv.topology), "--body", json.dumps(body)]
    result = adv.run(*args)
    assert result.returncode == 65, result.stderr
    assert path in result.stderr and TOKEN not in result.stderr
    assert depth(adv, "lk.shapes") == 0


def test_a_marked_field_of_any_type_is_encrypted_whole(adv: Setup) -> None:
    bodies = [{"secret": None}, {"secret": 123456}, {"secret": {"name": V, "pin": 1}}]
    bodies.append({"secret": {"$rmqkit_enc": 1, "v": V}})  # user data shaped like ours
    bodies.append({"a": [{"b": [{"c": V}, {"c": None}]}, {"b": []}]})
    stdin = "".join(json.dumps(b) + "\n" for b in bodies)
    result = adv.run("publish", "lk", "shape", "--topology", str(adv.topology), stdin=stdin)
    assert result.returncode == 0, result.stderr
    got = [json.loads(m["body"]) for m in broker.drain(adv.vhost, "lk.shapes")]
    assert len(got) == len(bodies) and not any(TOKEN in json.dumps(b) for b in got)
    assert all(is_envelope(b["secret"]) and "v" not in b["secret"] for b in got[:4])
    assert "123456" not in json.dumps(got[1])
    assert all(is_envelope(c["c"]) for c in got[4]["a"][0]["b"])


def _forged(adv: Setup) -> dict[str, dict[str, Any]]:
    good = seal(adv.ring, "secret", V)
    ct = base64.b64decode(good["ct"])
    foreign = seal(generate_keyring(), "secret", V)
    return {
        "malformed kid": {**good, "kid": "k 1!"},
        "truncated tag": {**good, "ct": base64.b64encode(ct[:10]).decode()},
        "version true": {**good, "$rmqkit_enc": True},
        "extra key": {**good, "v": V},
        "unknown kid": foreign,
    }


def test_forged_envelopes_are_not_encrypted(adv: Setup, tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path}/app.db"
    rmqkit.outbox.init(dsn)
    conn = sqlite3.connect(tmp_path / "app.db")
    try:
        encryptor = Encryptor(keyring=adv.ring, topology=load_topology(adv.topology))
        forged = _forged(adv)
        for name, envelope in forged.items():
            body = {"secret": envelope}
            if name == "unknown kid":  # sealed-looking, yet it does not open under the ring
                with pytest.raises(DataError, match="secret"):
                    rmqkit.outbox.add(
                        conn, exchange="lk", routing_key="shape", body=body, encryptor=encryptor
                    )
                continue
            written = rmqkit.outbox.add(  # not sealed: encrypted as a value like any other
                conn, exchange="lk", routing_key="shape", body=body, encryptor=encryptor
            )
            row = conn.execute(
                "SELECT body FROM rmqkit_outbox WHERE message_id = ?", (written,)
            ).fetchone()
            assert TOKEN.encode() not in bytes(row[0]), name
        conn.execute("DELETE FROM rmqkit_outbox")
        # rows written without the encryptor: the relay's check keeps each forged one pending
        ids = {
            name: rmqkit.outbox.add(conn, exchange="lk", routing_key="shape", body={"secret": env})
            for name, env in forged.items()
            if name != "unknown kid"  # well formed: only a key ring could tell (documented)
        }
        conn.commit()
        options = RelayOptions(dsn=dsn, once=True, topology=str(adv.topology))
        report = broker.run(run_relay(broker.settings_for(adv.vhost), options))
        assert (report.published, report.left_pending) == (0, len(ids)), report.errors
        assert all("secret" in report.errors[mid] for mid in ids.values())
        assert depth(adv, "lk.shapes") == 0
        guard = Encryptor(keyring=adv.ring, topology=load_topology(adv.topology))
        unknown = json.dumps({"secret": forged["unknown kid"]}).encode()
        assert guard.plaintext("lk", "shape", unknown) is not None  # with the ring: refused
    finally:
        conn.close()


# --- 10: consumer without a key ring -------------------------------------------------------------
def test_a_lane_consumer_with_empty_key_ring_settings_refuses(adv: Setup) -> None:
    env = broker.cli_env(adv.vhost) | {"RMQKIT_KEYRING_FILE": "", "RMQKIT_KEYRING": ""}
    cmd = [sys.executable, "-m", "rmqkit", "consume", "tests.leak_handlers:leak"]
    cmd += ["--queue", "lk.guard.lane.slow", "--topology", str(adv.topology)]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
        pytest.fail("a lane consumer started without a key ring")
    assert proc.returncode == 78, err
    assert "RMQKIT_KEYRING_FILE" in err and "tax_id" in err


# --- 11: lone surrogates ---------------------------------------------------------------------
def test_lone_surrogates_in_any_sensitive_place_are_65(adv: Setup, tmp_path: Path) -> None:
    stdin = '{"items": [{"card": "ok"}, {"card": "x\\udc00y"}]}\n'
    result = adv.run("publish", "lk", "shape", "--topology", str(adv.topology), stdin=stdin)
    assert result.returncode == 65, result.stderr
    assert "items[].card" in result.stderr and ":1" in result.stderr
    body = '{"secret": {"first": "\\ud83d", "last": "x"}}'
    result = adv.run("publish", "lk", "shape", "--topology", str(adv.topology), "--body", body)
    assert result.returncode == 65, result.stderr
    assert "secret" in result.stderr and "--body 1" in result.stderr
    assert "Traceback" not in result.stderr
    assert depth(adv, "lk.shapes") == 0
    dsn = f"sqlite:///{tmp_path}/s.db"
    rmqkit.outbox.init(dsn)
    conn = sqlite3.connect(tmp_path / "s.db")
    try:
        encryptor = Encryptor(keyring=adv.ring, topology=load_topology(adv.topology))
        with pytest.raises(DataError, match="surrogate"):
            rmqkit.outbox.add(
                conn,
                exchange="lk",
                routing_key="shape",
                body=b'{"secret": "\\ud83d"}',
                encryptor=encryptor,
            )
        assert conn.execute("SELECT count(*) FROM rmqkit_outbox").fetchone()[0] == 0
    finally:
        conn.close()

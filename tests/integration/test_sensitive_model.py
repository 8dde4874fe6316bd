"""Fields marked ``rmqkit.Sensitive`` on a pydantic model, end to end (issue 16), on the real
broker and real SQLite / PostgreSQL: ``rmqkit.outbox.add(body=model, encryptor=)`` stores
ciphertext for the marked fields (the encryptor names no fields and has no topology), the relay
publishes it as is, and ``rmqkit consume`` with a handler taking that model hands it the values
decrypted — and warns at start about a marked field the queue's topology does not encrypt.
Without an encryptor a marked model body is refused before anything is written.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import rmqkit.outbox
from rmqkit.crypto import decrypt_fields, generate_keyring, is_envelope
from rmqkit.outbox import Encryptor, RelayOptions, run_relay
from rmqkit.topology import declare_topology, load_topology
from tests import broker
from tests.consumer_harness import ROOT, wait_until
from tests.flow_handlers import read_rows
from tests.integration.test_outbox import drop_schema, pg_schema_dsn
from tests.sensitive_handlers import TOPOLOGY, Customer, Person

pytestmark = pytest.mark.broker

SENTINEL = "SENTINEL-model-4e1b"
WORK = "people.work"


def person(i: int) -> Person:
    return Person(
        id=f"p-{i}",
        customer=Customer(name=f"{SENTINEL}-name-{i}", tier="gold"),
        tax_id=f"{SENTINEL}-tax-{i}",
    )


@pytest.fixture
def people(fresh_vhost: Callable[[], str], tmp_path: Path) -> tuple[str, Path]:
    vhost = fresh_vhost()
    path = tmp_path / "people.toml"
    path.write_text(TOPOLOGY)
    broker.run(declare_topology(broker.settings_for(vhost), load_topology(path)))
    return vhost, path


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Any]]:
    """(dsn, an open connection) with the outbox table created."""
    if request.param == "sqlite":
        dsn = f"sqlite:///{tmp_path}/app.db"
        rmqkit.outbox.init(dsn)
        conn: Any = sqlite3.connect(tmp_path / "app.db")
        yield dsn, conn
        conn.close()
        return
    schema, dsn = pg_schema_dsn("rmqkit_sensitive")
    try:
        rmqkit.outbox.init(dsn)
        with psycopg.connect(dsn) as conn:
            yield dsn, conn
    finally:
        drop_schema(schema)


def _relay(vhost: str, dsn: str) -> rmqkit.outbox.RelayReport:
    report: rmqkit.outbox.RelayReport = broker.run(
        run_relay(broker.settings_for(vhost), RelayOptions(dsn=dsn, once=True))
    )
    return report


def _count(conn: Any) -> int:
    count: int = conn.execute("SELECT count(*) FROM rmqkit_outbox").fetchone()[0]
    return count


def test_marked_model_rows_hold_ciphertext_and_a_bare_one_is_refused(
    people: tuple[str, Path], store: tuple[str, Any]
) -> None:
    vhost, _ = people
    dsn, conn = store
    ring = generate_keyring()
    # Without an encryptor: refused, naming the model and its marked fields; nothing written.
    with pytest.raises(rmqkit.ConfigError) as refused:
        rmqkit.outbox.add(conn, exchange="people", routing_key="person", body=person(0))
    assert "Person" in str(refused.value)
    assert "customer.name" in str(refused.value) and "tax_id" in str(refused.value)
    conn.commit()
    assert _count(conn) == 0
    # The encryptor names no field and has no topology: the model's marks alone decide.
    encryptor = Encryptor(keyring=ring)
    for i in range(5):
        rmqkit.outbox.add(
            conn, exchange="people", routing_key="person", body=person(i), encryptor=encryptor
        )
    conn.commit()
    stored = [bytes(row[0]) for row in conn.execute("SELECT body FROM rmqkit_outbox")]
    assert len(stored) == 5
    assert not any(SENTINEL.encode() in b for b in stored)
    report = _relay(vhost, dsn)
    assert (report.published, report.left_pending) == (5, 0), report.errors
    got = broker.drain(vhost, WORK)
    assert len(got) == 5 and not any(SENTINEL.encode() in m["body"] for m in got)
    for message in got:
        body = json.loads(message["body"])
        assert is_envelope(body["customer"]["name"]) and is_envelope(body["tax_id"])
        assert "bi" in body["tax_id"] and "bi" not in body["customer"]["name"]
        assert body["customer"]["tier"] == "gold" and body["id"].startswith("p-")
        i = int(body["id"].removeprefix("p-"))
        assert decrypt_fields(body, None, ring) == person(i).model_dump()


def test_consume_hands_the_model_decrypted_and_warns_about_an_unencrypted_mark(
    people: tuple[str, Path], tmp_path: Path
) -> None:
    vhost, path = people
    ring = generate_keyring()
    dsn = f"sqlite:///{tmp_path}/app.db"
    rmqkit.outbox.init(dsn)
    conn = sqlite3.connect(tmp_path / "app.db")
    encryptor = Encryptor(keyring=ring, topology=load_topology(path))
    for i in range(3):
        rmqkit.outbox.add(
            conn, exchange="people", routing_key="person", body=person(i), encryptor=encryptor
        )
    conn.commit()
    conn.close()
    assert _relay(vhost, dsn).published == 3

    out = tmp_path / "seen.jsonl"
    env = broker.cli_env(vhost)
    env["RMQKIT_TEST_OUT"] = str(out)
    env["RMQKIT_KEYRING"] = ring.to_json()
    log_path = tmp_path / "consume.log"
    cmd = [sys.executable, "-m", "rmqkit", "--verbose", "consume"]
    cmd += ["tests.sensitive_handlers:seen_person", "--queue", WORK, "--topology", str(path)]
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            assert wait_until(lambda: len(read_rows(out)) >= 3, 30), log_path.read_text()
            assert wait_until(lambda: broker.depths(vhost, [WORK])[WORK] == 0, 15)
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0
    output = log_path.read_text()

    seen = sorted(read_rows(out), key=lambda row: str(row["id"]))
    assert seen == [person(i).model_dump() for i in range(3)]
    # tax_id is marked on the model but not in the topology's sensitive_fields: one warning
    # naming it (customer.name is in both: no warning for it), and no value in the log.
    warned = [line for line in output.splitlines() if "rmqkit.Sensitive" in line]
    assert len(warned) == 1, output
    assert "tax_id" in warned[0] and "people.work" in warned[0] and "Person" in warned[0]
    assert "customer.name" not in warned[0]
    assert SENTINEL not in output
    assert broker.depths(vhost, [WORK, f"{WORK}.parking"]) == {WORK: 0, f"{WORK}.parking": 0}

"""`rmqkit consume` on bodies with encrypted fields (issue 16), on the real broker.

The handler receives the body with its fields decrypted (the key ring from RMQKIT_KEYRING,
loaded once by each worker); a message that cannot be decrypted — a tampered ciphertext, a key
id the ring does not have, a consumer started without a key ring — is parked at once with
reason ``undecryptable`` and the one-line reason, its body the ciphertext as received, and the
consumer goes on with the next message. Nothing decrypted reaches the log or a copy.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rmqkit import headers as h
from rmqkit.crypto import KeyRing, encrypt_fields, generate_keyring
from tests import broker
from tests.consumer_harness import JOBS, ROOT, wait_until
from tests.flow_handlers import read_rows

WORK, PARKING = "jobs.work", "jobs.work.parking"
PATHS = ["customer.name", "tax_id"]
SENTINEL = "SENTINEL-Zq81"


class Consume:
    """`rmqkit consume tests.flow_handlers:seen` on jobs.work with an environment of our own
    (the shared harness passes none): RMQKIT_KEYRING or nothing."""

    def __init__(self, vhost: str, out: Path, ring: KeyRing | None) -> None:
        env = broker.cli_env(vhost)
        env["RMQKIT_TEST_OUT"] = str(out)
        if ring is not None:
            env["RMQKIT_KEYRING"] = ring.to_json()
        cmd = [sys.executable, "-m", "rmqkit", "--verbose", "consume", "tests.flow_handlers:seen"]
        cmd += ["--queue", WORK, "--topology", JOBS]
        self.log_path = out.with_suffix(".log")
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT
        )

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        finally:
            self._log.close()

    def output(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()


@pytest.fixture
def consumers() -> Iterator[list[Consume]]:
    started: list[Consume] = []
    yield started
    for consumer in started:
        if consumer.proc.poll() is None:
            consumer.proc.kill()
            consumer.proc.wait(timeout=10)


def body(i: str, **extra: Any) -> dict[str, Any]:
    return {"id": i, "customer": {"name": f"{SENTINEL}-{i}", "tier": "gold"}, "tax_id": 7, **extra}


def sealed(ring: KeyRing, i: str, **extra: Any) -> bytes:
    out: bytes = encrypt_fields(json.dumps(body(i, **extra)).encode(), PATHS, ["tax_id"], ring)
    return out


def tampered(ring: KeyRing, i: str) -> bytes:
    parsed = json.loads(sealed(ring, i))
    ct = parsed["customer"]["name"]["ct"]
    parsed["customer"]["name"]["ct"] = ("B" if ct[0] != "B" else "C") + ct[1:]
    return json.dumps(parsed).encode()


def parked_by_id(vhost: str) -> dict[str, dict[str, Any]]:
    return {m["message_id"]: m for m in broker.drain(vhost, PARKING)}


def test_handler_gets_decrypted_fields_and_the_undecryptable_are_parked(
    jobs_vhost: str, tmp_path: Path, consumers: list[Consume]
) -> None:
    ring, other = generate_keyring(), generate_keyring()
    out = tmp_path / "seen.jsonl"
    messages = [
        ("good-1", sealed(ring, "good-1")),
        ("tampered", tampered(ring, "tampered")),
        ("unknown-kid", sealed(other, "unknown-kid")),
        ("permanent", sealed(ring, "permanent", permanent=True)),
        ("good-2", sealed(ring, "good-2")),
    ]
    published = dict(messages)
    consumers.append(Consume(jobs_vhost, out, ring))
    broker.publish_with_ids(jobs_vhost, "jobs", "job", messages)
    assert wait_until(lambda: len(read_rows(out)) >= 3, 30), consumers[0].output()
    assert wait_until(lambda: broker.depths(jobs_vhost, [PARKING])[PARKING] == 3, 15)
    assert broker.depths(jobs_vhost, [WORK])[WORK] == 0
    assert consumers[0].stop() == 0
    log = consumers[0].output()

    # the handler saw every good message decrypted, whole (nested field and index field too)
    seen = {row["id"]: row["body"] for row in read_rows(out)}
    assert set(seen) == {"good-1", "permanent", "good-2"}
    for i in ("good-1", "good-2"):
        assert seen[i] == body(i)
    assert read_rows(out)[0]["exchange"] == "jobs"

    parked = parked_by_id(jobs_vhost)
    assert set(parked) == {"tampered", "unknown-kid", "permanent"}
    for i, cause in (("tampered", "tampered"), ("unknown-kid", "unknown-key")):
        headers = parked[i]["headers"]
        assert headers[h.PARK_REASON] == "undecryptable"
        assert headers[h.ERROR_TYPE] == "rmqkit.Undecryptable"
        assert f"({cause})" in headers[h.ERROR_MESSAGE]
        assert "customer.name" in headers[h.ERROR_MESSAGE]
        assert headers[h.ATTEMPT] == 1  # parked at once, never retried
    # every copy keeps the ciphertext exactly as received, the handler's own park included
    for i, message in parked.items():
        assert message["body"] == published[i]
        assert SENTINEL.encode() not in message["body"]
    assert parked["permanent"]["headers"][h.PARK_REASON] == "permanent"
    # --verbose: debug lines included; no decrypted value anywhere in the log
    assert "parked in jobs.work.parking: undecryptable" in log
    assert SENTINEL not in log
    assert broker.depths(jobs_vhost, [WORK, PARKING]) == {WORK: 0, PARKING: 0}


def test_a_consumer_without_the_key_ring_parks_encrypted_messages_and_keeps_running(
    jobs_vhost: str, tmp_path: Path, consumers: list[Consume]
) -> None:
    ring = generate_keyring()
    out = tmp_path / "seen.jsonl"
    consumers.append(Consume(jobs_vhost, out, None))
    plain = json.dumps({"id": "plain-1", "customer": {"name": "not secret"}}).encode()
    broker.publish_with_ids(
        jobs_vhost, "jobs", "job", [("sealed-1", sealed(ring, "sealed-1")), ("plain-1", plain)]
    )
    assert wait_until(lambda: len(read_rows(out)) >= 1, 30), consumers[0].output()
    assert wait_until(lambda: broker.depths(jobs_vhost, [PARKING])[PARKING] == 1, 15)
    assert consumers[0].proc.poll() is None  # still running
    assert consumers[0].stop() == 0
    assert [row["id"] for row in read_rows(out)] == ["plain-1"]
    parked = parked_by_id(jobs_vhost)
    headers = parked["sealed-1"]["headers"]
    assert headers[h.PARK_REASON] == "undecryptable"
    assert "(no-keyring)" in headers[h.ERROR_MESSAGE]
    assert SENTINEL not in consumers[0].output()
    assert broker.depths(jobs_vhost, [WORK, PARKING]) == {WORK: 0, PARKING: 0}


def test_a_malformed_key_ring_stops_consume_at_start_with_one_line(
    jobs_vhost: str, tmp_path: Path
) -> None:
    env = broker.cli_env(jobs_vhost)
    env["RMQKIT_KEYRING"] = '{"format": "nope"}'
    result = subprocess.run(
        [sys.executable, "-m", "rmqkit", "consume", "tests.flow_handlers:seen", "--queue", WORK],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 78, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr

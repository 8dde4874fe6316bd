"""Key rotation end to end (issue 16 acceptance): messages encrypted under the old key are still
handled after `rmqkit keys rotate`, new ones use the new key id — through the real CLI
(`keys generate/rotate/show`, `publish --topology`, `consume`) and the real broker.

Before the consumer starts, the queue is read off and put back byte for byte (the ciphertext
as `publish` wrote it), to check which key id each message was sealed with.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import broker
from tests.consumer_harness import ROOT, wait_until
from tests.flow_handlers import read_rows

pytestmark = pytest.mark.broker

TOPOLOGY = """
[exchanges.people]
type = "direct"

[queues."people.work"]
bind = [{ exchange = "people", routing_key = "person" }]
retry_delays = ["1s"]
sensitive_fields = ["customer.name", "tax_id"]
blind_index = ["tax_id"]
encrypt = true
"""
WORK, PARKING = "people.work", "people.work.parking"


def _body(i: int) -> dict[str, Any]:
    return {"n": i, "customer": {"name": f"Person {i:03d}", "tier": "gold"}, "tax_id": 1000 + i}


def _cli(vhost: str, env: dict[str, str], *args: str, stdin: str | None = None) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "rmqkit", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env={**broker.cli_env(vhost), **env},
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, (args, result.stderr)
    return result.stdout


def _current_kid(vhost: str, env: dict[str, str], ring: Path) -> str:
    shown = json.loads(_cli(vhost, env, "keys", "show", str(ring), "--json"))
    current = shown.get("current") or next(k["id"] for k in shown["keys"] if k.get("current"))
    return str(current)


def _publish(vhost: str, env: dict[str, str], topology: Path, numbers: range) -> None:
    lines = "".join(json.dumps({"message_id": str(i), "body": _body(i)}) + "\n" for i in numbers)
    _cli(
        vhost, env, "publish", "people", "person", "--ndjson", "--topology", str(topology),
        stdin=lines,
    )  # fmt: skip


def test_old_messages_are_handled_after_rotation_and_new_ones_use_the_new_key(
    tmp_path: Path,
) -> None:
    vhost = broker.create_vhost("rotation")
    try:
        topology, ring = tmp_path / "people.toml", tmp_path / "ring.json"
        topology.write_text(TOPOLOGY)
        env = {"RMQKIT_KEYRING_FILE": str(ring)}
        _cli(vhost, env, "declare", str(topology))
        _cli(vhost, env, "keys", "generate", "--out", str(ring))
        old_kid = _current_kid(vhost, env, ring)
        _publish(vhost, env, topology, range(0, 5))
        _cli(vhost, env, "keys", "rotate", str(ring))
        new_kid = _current_kid(vhost, env, ring)
        assert new_kid != old_kid
        _publish(vhost, env, topology, range(5, 10))

        held = broker.drain(vhost, WORK)
        assert len(held) == 10
        for message in held:
            sealed = json.loads(message["body"])
            want = old_kid if int(message["message_id"]) < 5 else new_kid
            assert sealed["customer"]["name"]["kid"] == want, message["message_id"]
            assert sealed["tax_id"]["kid"] == want and "bi" in sealed["tax_id"]
            assert "Person" not in message["body"].decode()
        broker.publish_with_ids(
            vhost, "people", "person", [(m["message_id"], m["body"]) for m in held]
        )

        out = tmp_path / "seen.jsonl"
        log = (tmp_path / "consume.log").open("w")
        consumer = subprocess.Popen(
            [
                *(sys.executable, "-m", "rmqkit", "consume", "tests.flow_handlers:seen"),
                *("--queue", WORK, "--topology", str(topology)),
            ],
            cwd=ROOT,
            env={**broker.cli_env(vhost), **env, "RMQKIT_TEST_OUT": str(out)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            assert wait_until(lambda: len(read_rows(out)) >= 10, 60), (
                tmp_path / "consume.log"
            ).read_text()[-2000:]
        finally:
            consumer.send_signal(signal.SIGTERM)
            consumer.wait(timeout=60)
            log.close()
        seen = {int(row["id"]): row["body"] for row in read_rows(out)}
        assert seen == {i: _body(i) for i in range(10)}  # both key ids, each once, decrypted
        assert broker.depths(vhost, [WORK, PARKING]) == {WORK: 0, PARKING: 0}
    finally:
        broker.delete_vhost(vhost)

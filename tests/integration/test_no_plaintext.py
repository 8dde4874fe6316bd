"""Issue 16's acceptance test: a value planted in every sensitive field appears nowhere it does
not belong — on the real broker, through every command an operator runs.

A work queue with ``encrypt = true`` and three sensitive fields (one nested, one blind-indexed).
``rmqkit publish --topology`` encrypts N messages (RMQKIT_NO_PLAINTEXT_COUNT, default the
issue's 1,000: the ~20 command runs cost more than the messages) whose every sensitive field
holds the sentinel; ``rmqkit consume`` (debug logging, a metrics port) hands them to a handler
that records what it got and fails one in ten permanently and one in ten transiently (retried
through the wait tier, then parked ``exhausted``); two tampered messages are parked
``undecryptable``. Then parking list, show, stats, export, ``--match``, replay, status, doctor
and config run with the key ring at hand.

Every stdout and stderr, the consumer's log, its metrics/health pages, the export file and every
body and header the broker still holds are searched: the sentinel is only in the handler's own
record and in what ``--decrypt`` was asked to show.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from rmqkit.crypto import encrypt_fields, load_keyring_file
from tests import broker
from tests.consumer_harness import wait_until
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
COUNT = int(os.environ.get("RMQKIT_NO_PLAINTEXT_COUNT", "1000"))  # ~30 s on 4.3.6
SENTINEL = "SNTNL-q7Xw2"
WORK, PARKING = "np.work", "np.work.parking"
TOPOLOGY = """
[exchanges.np]
type = "direct"

[queues."np.work"]
bind = [{ exchange = "np", routing_key = "order" }]
retry_delays = ["300ms"]
max_attempts = 2
prefetch = 100
sensitive_fields = ["customer.name", "tax_id", "card.holder"]
blind_index = ["tax_id"]
encrypt = true

[queues."np.quote"]
bind = [{ exchange = "np", routing_key = "quote" }]
retry_delays = []
sensitive_fields = ["customer.name", "tax_id", "card.holder"]
blind_index = ["tax_id"]
encrypt = true
"""
FIELDS = ["customer.name", "tax_id", "card.holder"]
QUOTE_ARGS = ("--queue", "np.quote", "--topology")
RMQKIT = [sys.executable, "-m", "rmqkit", "--verbose"]  # --verbose: debug logging


def _kind(i: int) -> str:
    return {0: "permanent", 1: "transient"}.get(i % 10, "ok")


def _body(i: int) -> dict[str, Any]:
    return {
        "order_id": i,
        "kind": _kind(i),
        "customer": {"name": f"{SENTINEL} name {i}", "tier": "gold"},
        "tax_id": f"{SENTINEL}-tax-{i % 5}",
        "card": {"holder": f"{SENTINEL} holder {i}", "last4": "4242"},
    }


@dataclass
class Outputs:
    """Everything the run produced, by name: must not hold the sentinel."""

    texts: dict[str, str] = field(default_factory=dict)
    # What --decrypt was asked for, and the handler's own record: may (must) hold it.
    allowed: dict[str, str] = field(default_factory=dict)

    def add(self, name: str, result: subprocess.CompletedProcess[str]) -> None:
        self.texts[f"{name} (stdout)"] = result.stdout
        self.texts[f"{name} (stderr)"] = result.stderr


@dataclass
class Run:
    vhost: str
    tmp: Path
    env: dict[str, str]
    outputs: Outputs
    parked: dict[str, str]  # message_id → expected park reason
    tampered: list[str]

    def cli(self, name: str, *args: str, allowed: bool = False) -> subprocess.CompletedProcess[str]:
        result = broker.cli("--verbose", *args, vhost=self.vhost, env=self.env, timeout=180)
        if allowed:
            self.outputs.allowed[f"{name} (stdout)"] = result.stdout
            self.outputs.texts[f"{name} (stderr)"] = result.stderr
        else:
            self.outputs.add(name, result)
        return result


@pytest.fixture(scope="module")
def run(vhost: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    tmp = tmp_path_factory.mktemp("noplain")
    (tmp / "np.toml").write_text(TOPOLOGY)
    ring_file = tmp / "ring.json"
    env = {"RMQKIT_KEYRING_FILE": str(ring_file)}
    outputs = Outputs()
    state = Run(vhost, tmp, env, outputs, {}, [])
    generated = state.cli("keys generate", "keys", "generate", "--out", str(ring_file))
    assert generated.returncode == 0, generated.stderr
    declared = state.cli("declare", "declare", str(tmp / "np.toml"))
    assert declared.returncode == 0, declared.stderr

    # publish: N messages, every sensitive field holding the sentinel
    lines = [json.dumps({"message_id": f"np-{i}", "body": _body(i)}) for i in range(COUNT)]
    (tmp / "in.ndjson").write_text("\n".join(lines) + "\n")
    with (tmp / "in.ndjson").open() as stdin:
        published = subprocess.run(
            [*RMQKIT, "publish", "np", "order", "--ndjson", "--topology", str(tmp / "np.toml")],
            stdin=stdin,
            capture_output=True,
            text=True,
            env={**broker.cli_env(vhost), **env},
            timeout=300,
            check=False,
        )
    outputs.add("publish", published)
    assert published.returncode == 0, published.stderr
    # two whose ciphertext was changed on the way: parked undecryptable
    ring = load_keyring_file(ring_file)
    bad = []
    for i in (COUNT, COUNT + 1):
        data = json.loads(encrypt_fields(json.dumps(_body(i)).encode(), FIELDS, ["tax_id"], ring))
        ct = bytearray(base64.b64decode(data["card"]["holder"]["ct"]))
        ct[-1] ^= 1
        data["card"]["holder"]["ct"] = base64.b64encode(bytes(ct)).decode()
        bad.append((f"np-bad-{i}", json.dumps(data).encode()))
    broker.publish_with_ids(vhost, "np", "order", bad)
    state.tampered = [mid for mid, _ in bad]
    state.parked = {f"np-{i}": "permanent" for i in range(COUNT) if _kind(i) == "permanent"}
    state.parked |= {f"np-{i}": "exhausted" for i in range(COUNT) if _kind(i) == "transient"}
    state.parked |= dict.fromkeys(state.tampered, "undecryptable")

    # consume at debug level, with a metrics page, until everything is handled or parked
    port = free_port()
    seen = tmp / "handler.jsonl"
    log_path = tmp / "consume.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [
                *RMQKIT,
                "consume",
                "tests.no_plaintext_handlers:handle",
                *("--queue", WORK),
                *("--topology", str(tmp / "np.toml"), "--metrics-port", str(port)),
            ],
            cwd=ROOT,
            env={**broker.cli_env(vhost), **env, "RMQKIT_TEST_OUT": str(seen)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            done = wait_until(
                lambda: broker.depths(vhost, [PARKING])[PARKING] == len(state.parked), 240
            )
            assert done, log_path.read_text()[-3000:]
            for page in ("metrics", "healthz", "readyz"):
                response = httpx.get(f"http://127.0.0.1:{port}/{page}", timeout=10)
                outputs.texts[f"consumer /{page}"] = response.text
                if page == "metrics":
                    assert response.status_code == 200 and "rmqkit" in response.text
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    outputs.texts["consume log (debug)"] = log_path.read_text()
    assert " DEBUG rmqkit." in outputs.texts["consume log (debug)"]  # debug level it was
    outputs.allowed["handler's own record"] = seen.read_text()
    yield state


def _clean(outputs: dict[str, str]) -> list[str]:
    return [name for name, text in outputs.items() if SENTINEL in text]


def test_the_handler_got_the_values_and_the_broker_holds_none(run: Run) -> None:
    rows = [json.loads(line) for line in run.outputs.allowed["handler's own record"].splitlines()]
    handled = {row["id"] for row in rows}
    assert handled == {f"np-{i}" for i in range(COUNT)}  # the tampered two never reached it
    for row in rows:  # decrypted, every field, in the handler's input
        i = int(row["id"].removeprefix("np-"))
        assert row["body"] == _body(i)
    retried = [r for r in rows if r["body"]["kind"] == "transient" and r["attempt"] == 2]
    assert len(retried) == len([i for i in range(COUNT) if _kind(i) == "transient"])
    assert broker.depths(run.vhost, [WORK])[WORK] == 0


def test_operator_commands_never_show_the_sentinel(run: Run) -> None:
    some = sorted(run.parked)[:3] + run.tampered
    results = [
        run.cli("parking list", "parking", "list", PARKING),
        run.cli("parking list --json", "parking", "list", PARKING, "--json"),
        run.cli("parking stats", "parking", "stats", PARKING),
        run.cli("parking stats --json", "parking", "stats", PARKING, "--json"),
        run.cli("status", "status", "--topology", str(run.tmp / "np.toml")),
        run.cli("status --json", "status", "--json"),
        run.cli("doctor", "doctor", "--topology", str(run.tmp / "np.toml")),
        run.cli("doctor --json", "doctor", "--json"),
        run.cli("config", "config"),
        run.cli("config --json", "config", "--json"),
        run.cli("export (stdout)", "parking", "export", PARKING),
    ]
    for mid in some:
        results.append(run.cli(f"show {mid}", "parking", "show", PARKING, mid))
        results.append(run.cli(f"show {mid} --json", "parking", "show", PARKING, mid, "--json"))
    out = run.tmp / "parked.ndjson"
    results.append(run.cli("export -o", "parking", "export", PARKING, "-o", str(out)))
    for result in results:
        assert result.returncode in (0, 1, 2), result.stderr  # doctor/stats may warn
    run.outputs.texts["export file"] = out.read_text()

    listed = [json.loads(line) for line in results[1].stdout.splitlines()]
    assert {m["message_id"]: m["reason"] for m in listed} == run.parked
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == len(run.parked)
    assert all("$rmqkit_enc" in r["body_text"] for r in records)  # ciphertext as stored
    shown = json.loads(results[-2].stdout)  # show --json of a tampered one
    assert shown["body"]["card"]["holder"].startswith("[encrypted kid=")
    assert _clean(run.outputs.texts) == []


def test_match_finds_by_blind_index_and_prints_no_value(run: Run) -> None:
    wanted = f"{SENTINEL}-tax-1"  # the transient ones (i % 10 == 1), and a tampered one
    result = run.cli(
        "list --match", "parking", "list", PARKING, "--json", "--match", f"tax_id={wanted}"
    )
    assert result.returncode == 0, result.stderr
    ids = {json.loads(line)["message_id"] for line in result.stdout.splitlines()}
    expected = {m for m in run.parked if m.startswith("np-") and not m.startswith("np-bad")}
    expected = {m for m in expected if int(m.removeprefix("np-")) % 5 == 1}
    expected |= {m for m in run.tampered if int(m.rsplit("-", 1)[1]) % 5 == 1}
    assert ids == expected and ids
    assert _clean({"list --match": result.stdout + result.stderr}) == []


def test_decrypt_shows_the_values_only_when_asked(run: Run) -> None:
    mid = next(m for m, reason in run.parked.items() if reason == "permanent")
    shown = run.cli(
        f"show {mid} --decrypt", "parking", "show", PARKING, mid, "--decrypt", allowed=True
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["body"] == _body(int(mid.removeprefix("np-")))
    bad = run.cli(
        "show tampered --decrypt",
        "parking",
        "show",
        PARKING,
        run.tampered[0],
        "--decrypt",
        allowed=True,
    )
    body = json.loads(bad.stdout)["body"]
    assert body["card"]["holder"].startswith("[undecryptable") and SENTINEL in body["tax_id"]
    out = run.tmp / "plain.ndjson"
    exported = run.cli(
        "export --decrypt", "parking", "export", PARKING, "--decrypt", "-o", str(out), allowed=True
    )
    assert exported.returncode == 0 and "personal data" in exported.stderr
    assert SENTINEL in out.read_text()
    assert _clean(run.outputs.texts) == []


def test_replay_keeps_ciphertext_and_the_broker_never_held_plaintext(run: Run) -> None:
    """Last: replays the permanent ones into the work queue and drains every queue."""
    before = run.cli("export before replay", "parking", "export", PARKING)
    stored = {
        r["properties"]["message_id"]: base64.b64decode(r["body"])
        for r in map(json.loads, before.stdout.splitlines())
    }
    replayed = run.cli("replay", "parking", "replay", PARKING, "--reason", "permanent")
    assert replayed.returncode == 0, replayed.stderr
    permanent = {m for m, reason in run.parked.items() if reason == "permanent"}
    moved = broker.drain(run.vhost, WORK)
    assert {m["message_id"] for m in moved} == permanent
    for message in moved:  # byte for byte what was parked
        assert message["body"] == stored[message["message_id"]]
    left = broker.drain(run.vhost, PARKING)
    assert len(left) == len(run.parked) - len(permanent)
    for message in moved + left:
        assert b"$rmqkit_enc" in message["body"]
        text = message["body"].decode() + json.dumps(message["headers"], default=str)
        assert SENTINEL not in text, message["message_id"]
    assert _clean(run.outputs.texts) == []


def test_a_handler_error_quoting_a_decrypted_value_does_not_leak_it(run: Run) -> None:
    lines = [json.dumps({"message_id": f"q-{i}", "body": _body(i)}) for i in range(3)]
    published = subprocess.run(
        [*RMQKIT, "publish", "np", "quote", "--ndjson", "--topology", str(run.tmp / "np.toml")],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        env={**broker.cli_env(run.vhost), **run.env},
        timeout=120,
        check=False,
    )
    assert published.returncode == 0, published.stderr
    log_path = run.tmp / "quote.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [
                *RMQKIT,
                "consume",
                "tests.no_plaintext_handlers:quoting",
                *QUOTE_ARGS,
                str(run.tmp / "np.toml"),
            ],
            cwd=ROOT,
            env={**broker.cli_env(run.vhost), **run.env, "RMQKIT_TEST_OUT": str(run.tmp / "q")},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            parked = wait_until(
                lambda: broker.depths(run.vhost, ["np.quote.parking"])["np.quote.parking"] == 3,
                60,
            )
            assert parked, log_path.read_text()[-2000:]
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    listed = broker.cli("parking", "list", "np.quote.parking", "--json", vhost=run.vhost)
    assert listed.returncode == 0, listed.stderr
    leaks = _clean({"consume log": log_path.read_text(), "parking list": listed.stdout})
    assert leaks == []

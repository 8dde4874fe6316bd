"""CLI conventions (issue 14) against the real broker.

- ``--vhost NAME`` (before or after the command, as rabbitmqadmin v2 takes it) points both the
  AMQP connection and the management API at NAME, whatever vhost RMQKIT_URL names.
- A command that asks (``parking purge``) never asks where it cannot: ``--non-interactive``,
  RMQKIT_NON_INTERACTIVE=1, stdin not a terminal; it refuses (exit 64) and destroys nothing.

Every command runs in a subprocess from a neutral directory (PYTHONPATH kept): real exit codes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from rmqkit import headers as h
from rmqkit.settings import with_vhost
from rmqkit.topology import declare_topology, load_topology
from tests import broker
from tests.unit.test_cli_conventions import environment, start

ROOT = Path(__file__).resolve().parent.parent.parent
ORDERS = ROOT / "topologies" / "orders.toml"
WORK = "orders.work"
PARKING = "orders.work.parking"
PARKED = 3


def _parked_headers() -> dict[str, Any]:
    return {
        h.PARK_REASON: "permanent",
        h.ORIGIN_QUEUE: WORK,
        h.ORIGINAL_EXCHANGE: "",
        h.ORIGINAL_ROUTING_KEY: WORK,
        h.ERROR_TYPE: "rmqkit.Permanent",
        h.ERROR_MESSAGE: "no such customer",
        h.ATTEMPT: 1,
        h.LAST_FAILED_AT: h.format_timestamp(datetime.now(UTC)),
    }


@pytest.fixture(scope="module")
def target(vhost: str) -> str:
    """The vhost the commands are pointed at with --vhost: orders.toml declared, PARKED parked,
    and an archive queue beside the parking queue (what `archive = "30d"` declares)."""
    broker.run(declare_topology(broker.settings_for(vhost), load_topology(ORDERS)))
    archive = {"durable": True, "arguments": {"x-queue-type": "quorum"}}
    path = f"/queues/{broker.q(vhost)}/{broker.q(PARKING + '.archive')}"
    broker.api("PUT", path, json=archive).raise_for_status()
    _park(vhost, PARKED)
    return vhost


@pytest.fixture(scope="module")
def decoy() -> Any:
    """The vhost RMQKIT_URL names: exists, holds nothing."""
    name = broker.create_vhost("cli-decoy")
    yield name
    broker.delete_vhost(name)


def cli(
    *args: str, vhost: str, stdin: str | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """`rmqkit ARGS` with RMQKIT_URL on ``vhost`` of the broker under test."""
    url = with_vhost(broker.BASE_URL, vhost)
    process = start(
        list(args),
        environment(RMQKIT_URL=url, RMQKIT_MANAGEMENT_URL=broker.MGMT, **env),
        stdin=stdin,
    )
    out, err = process.communicate(stdin, timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def _queue_names(report: dict[str, Any]) -> set[str]:
    return {q["name"] for q in report["queues"]}


def test_vhost_after_the_command_reaches_the_management_api(target: str, decoy: str) -> None:
    shown = cli("status", "--vhost", target, "--json", vhost=decoy)
    assert shown.returncode == 0, shown.stderr
    assert {WORK, PARKING} <= _queue_names(json.loads(shown.stdout))
    plain = cli("status", "--json", vhost=decoy)  # without it: the URL's (empty) vhost
    assert plain.returncode == 0, plain.stderr
    assert WORK not in _queue_names(json.loads(plain.stdout))


def test_vhost_before_or_after_a_parking_command_reaches_amqp(target: str, decoy: str) -> None:
    after = cli("parking", "list", PARKING, "--json", "--vhost", target, vhost=decoy)
    before = cli("--vhost", target, "parking", "list", PARKING, "--json", vhost=decoy)
    for listed in (after, before):
        assert listed.returncode == 0, listed.stderr
        rows = [json.loads(line) for line in listed.stdout.splitlines()]
        assert len(rows) == PARKED and {r["reason"] for r in rows} == {"permanent"}
    assert broker.depths(target, [PARKING])[PARKING] == PARKED  # browsing took none
    missing = cli("parking", "list", PARKING, vhost=decoy)  # not in the URL's vhost
    assert missing.returncode != 0 and PARKING in missing.stderr


def _park(vhost: str, n: int) -> None:
    broker.publish_exact(
        vhost,
        "",
        [(PARKING, uuid.uuid4().hex, b'{"id": 1}', _parked_headers()) for _ in range(n)],
    )


def _on_a_terminal(decoy: str, *args: str, **env: str) -> tuple[int, str]:
    """`rmqkit ARGS` with stdin a terminal (a pty) on which "y" is already typed: only the
    non-interactive setting keeps a command from asking and going ahead."""
    master, slave = os.openpty()
    try:
        os.write(master, b"y\n")
        process = subprocess.Popen(
            [sys.executable, "-m", "rmqkit", *args],
            stdin=slave,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd="/",
            env=environment(
                RMQKIT_URL=with_vhost(broker.BASE_URL, decoy),
                RMQKIT_MANAGEMENT_URL=broker.MGMT,
                **env,
            ),
        )
        _, err = process.communicate(timeout=60)
    finally:
        os.close(slave)
        os.close(master)
    return process.returncode, err


def test_purge_never_asks_when_it_cannot_and_deletes_nothing(target: str, decoy: str) -> None:
    """Without --yes, where it cannot ask (stdin not a terminal; --non-interactive before or
    after the command; RMQKIT_NON_INTERACTIVE=1): exit 64, one line, the lane as it was."""
    piped = cli("parking", "purge", PARKING, "--vhost", target, vhost=decoy, stdin="y\n")
    assert piped.returncode == 64, piped.stderr
    assert piped.stderr.startswith(f"rmqkit: error: purge {PARKED} message(s) from {PARKING}")
    assert "refusing without --yes" in piped.stderr and len(piped.stderr.splitlines()) == 1
    purge = ("parking", "purge", PARKING, "--vhost", target)
    for args, env in [
        ((*purge, "--non-interactive"), {}),
        (("--non-interactive", *purge), {}),
        (purge, {"RMQKIT_NON_INTERACTIVE": "1"}),
    ]:
        code, err = _on_a_terminal(decoy, *args, **env)
        assert code == 64 and "refusing without --yes (--non-interactive)" in err, (args, err)
        assert len(err.splitlines()) == 1, err
    assert broker.depths(target, [PARKING])[PARKING] == PARKED
    # The same terminal, allowed to ask: it asks, reads the "y" and purges (then re-park).
    code, err = _on_a_terminal(decoy, *purge)
    assert code == 0 and f"Purge {PARKED} message(s)" in err, err
    assert broker.depths(target, [PARKING])[PARKING] == 0
    _park(target, PARKED)


def _editable(tmp: Path) -> Path:
    """orders.toml with editing allowed on orders.work (parking edit refuses it otherwise)."""
    text = ORDERS.read_text(encoding="utf-8").replace(
        '[queues."orders.work"]', '[queues."orders.work"]\nallow_edit = true', 1
    )
    path = tmp / "orders-editable.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _edited_body(tmp: Path) -> Path:
    path = tmp / "edited.json"
    path.write_text('{"id": 10, "edited": true}', encoding="utf-8")
    return path


def _json_commands(target: str, tmp: Path, message_id: str) -> dict[str, list[str]]:
    """Every command that has --json, with arguments that work in ``target``."""
    store = f"sqlite:///{tmp / 'dedupe.db'}"
    outbox = f"sqlite:///{tmp / 'outbox.db'}"
    return {
        "rmqkit config": ["config"],
        "rmqkit declare": ["declare", str(ORDERS)],
        "rmqkit plan": ["plan", str(ORDERS)],
        "rmqkit status": ["status", "--parking-age"],
        "rmqkit doctor": ["doctor", "--topology", str(ORDERS), "--growth-sample", "0"],
        "rmqkit publish": ["publish", "", WORK, "--body", '{"id": 9}'],
        "rmqkit parking list": ["parking", "list", PARKING],
        "rmqkit parking show": ["parking", "show", PARKING, message_id],
        "rmqkit parking stats": ["parking", "stats", PARKING, "--max-count", "1"],
        "rmqkit parking groups": ["parking", "groups", PARKING],
        "rmqkit parking archive": ["parking", "archive", PARKING, "--dry-run"],
        "rmqkit parking restore": ["parking", "restore", PARKING, "--dry-run"],
        "rmqkit parking edit": [
            "parking",
            "edit",
            PARKING,
            message_id,
            "--dry-run",
            "-t",
            str(_editable(tmp)),
            "--body-file",
            str(_edited_body(tmp)),
            "--audit-log",
            str(tmp / "edits.log"),
        ],
        "rmqkit parking replay": ["parking", "replay", PARKING, "--dry-run"],
        "rmqkit dedupe init": ["dedupe", "init", "--dsn", store],
        "rmqkit dedupe status": ["dedupe", "status", "--dsn", store],
        "rmqkit dedupe prune": ["dedupe", "prune", "--dsn", store, "--older-than", "1h"],
        "rmqkit outbox status": ["outbox", "status", "--dsn", outbox],
        "rmqkit outbox list": ["outbox", "list", "--dsn", outbox],
        "rmqkit keys show": ["keys", "show", str(tmp / "keyring.json")],
    }


def test_json_prints_only_json_on_stdout(target: str, decoy: str, tmp_path: Path) -> None:
    """Each command's --json output parses as JSON, all of stdout (NDJSON for `parking list`,
    one object a line); warnings and progress go to stderr."""
    from tests.unit.test_cli_conventions import every_command

    listed = cli("parking", "list", PARKING, "--json", "--vhost", target, vhost=decoy)
    message_id = json.loads(listed.stdout.splitlines()[0])["message_id"]
    commands = _json_commands(target, tmp_path, message_id)
    having_json = {
        path
        for path, command in every_command()
        if any("--json" in getattr(param, "opts", []) for param in command.params)
    }
    assert having_json == set(commands), having_json ^ set(commands)
    # dedupe status/prune and outbox status need their stores first.
    for store in (["dedupe", "init"], ["outbox", "init"]):
        dsn = commands[f"rmqkit {store[0]} {'status' if store[0] == 'outbox' else 'init'}"][-1]
        made = cli(*store, "--dsn", dsn, vhost=decoy)
        assert made.returncode == 0, made.stderr
    keys = cli("keys", "generate", "--out", commands["rmqkit keys show"][-1], vhost=decoy)
    assert keys.returncode == 0, keys.stderr
    env = environment(
        RMQKIT_URL=with_vhost(broker.BASE_URL, decoy), RMQKIT_MANAGEMENT_URL=broker.MGMT
    )

    # Side by side, except the parking commands: each browses the lane, and a message another
    # browse holds unacked is not there for `show` to find.
    def run(args: list[str]) -> subprocess.Popen[str]:
        return start([*args, "--json", "--vhost", target], env)

    together = {p: run(a) for p, a in commands.items() if not p.startswith("rmqkit parking")}
    done: dict[str, tuple[subprocess.Popen[str], str, str]] = {}
    for path, args in commands.items():
        if path.startswith("rmqkit parking"):
            process = run(args)
            done[path] = (process, *process.communicate(timeout=120))
    for path, process in together.items():
        done[path] = (process, *process.communicate(timeout=120))
    for path, (process, out, err) in done.items():
        # plan: 2 changes pending; checks: 1 warning, 2 critical (the stats limit is 1).
        assert process.returncode in (0, 1, 2), (path, process.returncode, err)
        try:
            if path == "rmqkit parking list":
                documents = [json.loads(line) for line in out.splitlines()]
                assert len(documents) == PARKED
            else:
                json.loads(out)
        except ValueError as exc:
            raise AssertionError(f"{path}: stdout is not JSON ({exc}): {out[:300]!r}") from None

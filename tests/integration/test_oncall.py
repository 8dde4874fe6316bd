"""What a trial as a new on-call user found in the parking commands (issue 14), on a real broker.

- Filters that match nothing say nothing: ``--reason exhaustd`` was accepted, ``--error-type
  MailboxFull`` did not match the stored ``shipping.errors.MailboxFull`` ("would replay 0 of 0",
  exit 0) and nothing said what the lane does hold.
- ``--redact`` masked body and header fields but not the same values quoted in the error
  message, the ``rmqkit-error-message`` header or the stored traceback; ``show`` had no
  ``--topology``, so the topology's ``sensitive_fields`` could not apply.
- An interrupted ``replay`` printed only "interrupted".

On the code before the fix (19871ec) every test here fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from rmqkit import headers as h
from rmqkit.topology import load_topology
from rmqkit.topology.apply import declare_topology
from tests import broker

WORK = "oc.work"
PARKING = "oc.work.parking"
SLOW = "oc.slow"
SLOW_PARKING = "oc.slow.parking"
CARD = "4111111111111111"
TOPOLOGY = f"""
[queues."{WORK}"]
sensitive_fields = ["card_number"]

[queues."{SLOW}"]
"""


@pytest.fixture(scope="module")
def topology_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("oncall") / "oncall.toml"
    path.write_text(TOPOLOGY, encoding="utf-8")
    return path


def _parked_headers(reason: str, error_type: str, message: str) -> dict[str, Any]:
    stamp = h.format_timestamp(datetime.now(UTC))
    headers: dict[str, Any] = {
        h.PARK_REASON: reason,
        h.ORIGIN_QUEUE: WORK,
        h.ORIGINAL_EXCHANGE: "",
        h.ORIGINAL_ROUTING_KEY: WORK,
        h.ERROR_TYPE: error_type,
        h.ERROR_MESSAGE: message,
        h.TRACEBACK: (
            "Traceback (most recent call last):\n"
            '  File "shipping/handlers.py", line 12, in handle\n'
            f"    charge(card_number={CARD!r})\n"
            f"{error_type}: {message}\n"
        ),
        h.ATTEMPT: 1,
        h.LAST_FAILED_AT: stamp,
    }
    return headers


@pytest.fixture(scope="module")
def lane(vhost: str, topology_file: Path) -> str:
    """oc.work.parking holding 2 MailboxFull (exhausted) and 1 KeyError (permanent)."""
    broker.run(declare_topology(broker.settings_for(vhost), load_topology(topology_file)))
    body = json.dumps({"order": 7, "card_number": CARD}).encode()
    broker.publish_exact(
        vhost,
        "",
        [
            (
                PARKING,
                uuid.uuid4().hex,
                body,
                _parked_headers(
                    "exhausted",
                    "shipping.errors.MailboxFull",
                    f"mailbox full for card_number={CARD}",
                ),
            )
            for _ in range(2)
        ]
        + [
            (
                PARKING,
                uuid.uuid4().hex,
                body,
                _parked_headers("permanent", "KeyError", f"no customer for card {CARD}"),
            )
        ],
    )
    return vhost


def test_an_unknown_reason_is_a_usage_error_naming_the_valid_ones(lane: str) -> None:
    result = broker.cli("parking", "list", PARKING, "--reason", "exhaustd", vhost=lane)
    assert result.returncode == 64, result.stderr
    assert "exhaustd" in result.stderr
    for valid in ("exhausted", "permanent", "undecodable", "delivery_limit"):
        assert valid in result.stderr
    assert broker.depths(lane, [PARKING]) == {PARKING: 3}  # nothing was touched


def test_a_bare_class_name_matches_the_stored_full_path(lane: str) -> None:
    result = broker.cli(
        "parking", "replay", PARKING, "--error-type", "MailboxFull", "--dry-run", vhost=lane
    )
    assert result.returncode == 0, result.stderr
    assert "would replay 2 of 2 selected" in result.stderr
    assert result.stdout.count("would replay") == 2
    listed = broker.cli_json_lines(
        "parking", "list", PARKING, "--json", "--error-type", "Mailbox*", vhost=lane
    )
    assert {m["error_type"] for m in listed} == {"shipping.errors.MailboxFull"}
    assert len(listed) == 2
    assert broker.depths(lane, [PARKING, WORK]) == {PARKING: 3, WORK: 0}  # a dry run


def test_filters_that_match_nothing_say_what_is_present(lane: str) -> None:
    result = broker.cli(
        "parking", "replay", PARKING, "--error-type", "Timeout", "--dry-run", vhost=lane
    )
    assert result.returncode == 0, result.stderr
    assert "no message in 'oc.work.parking' matched the filters" in result.stderr
    assert "exhausted, permanent" in result.stderr
    assert "KeyError, shipping.errors.MailboxFull" in result.stderr
    stats = broker.cli("parking", "stats", PARKING, "--reason", "undecodable", vhost=lane)
    assert "present: reasons exhausted, permanent" in stats.stderr, stats.stderr


def _no_card(text: str) -> None:
    assert CARD not in text, text


def test_redact_masks_the_error_message_and_the_stored_traceback(lane: str) -> None:
    listed = broker.cli("parking", "list", PARKING, "--json", "--redact", "card_number", vhost=lane)
    assert listed.returncode == 0, listed.stderr
    records = [json.loads(line) for line in listed.stdout.splitlines()]
    assert len(records) == 3
    _no_card(listed.stdout)
    assert all("***" in r["error_message"] for r in records)
    assert all("***" in r["headers"][h.TRACEBACK] for r in records)
    piped = broker.cli("parking", "list", PARKING, "--redact", "card_number", vhost=lane)
    assert piped.returncode == 0 and piped.stdout.count("\n") == 4, piped.stderr
    _no_card(piped.stdout)
    some = records[0]["message_id"]
    shown = broker.cli("parking", "show", PARKING, some, "--redact", "card_number", vhost=lane)
    assert shown.returncode == 0, shown.stderr
    _no_card(shown.stdout)
    # Masking for display only: the broker still holds the message as it was.
    assert broker.depths(lane, [PARKING]) == {PARKING: 3}


def test_show_takes_the_sensitive_fields_from_the_topology(lane: str, topology_file: Path) -> None:
    some = broker.cli_json_lines("parking", "list", PARKING, "--json", vhost=lane)[0]["message_id"]
    shown = broker.cli(
        "parking", "show", PARKING, some, "--topology", str(topology_file), vhost=lane
    )
    assert shown.returncode == 0, shown.stderr
    _no_card(shown.stdout)
    document = json.loads(shown.stdout)
    assert document["body"]["card_number"] == "***"
    wrong = broker.cli("parking", "show", SLOW, some, "--topology", str(topology_file), vhost=lane)
    assert wrong.returncode == 64 and "no work queue whose parking queue is" in wrong.stderr


def test_an_interrupted_replay_says_what_was_done_and_what_is_left(lane: str) -> None:
    total = 40
    broker.publish_exact(
        lane,
        "",
        [
            (
                SLOW_PARKING,
                uuid.uuid4().hex,
                b"{}",
                {h.PARK_REASON: "exhausted", h.ORIGIN_QUEUE: SLOW},
            )
            for _ in range(total)
        ],
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "rmqkit", "parking", "replay", SLOW_PARKING, "--rate", "5"],
        env=broker.cli_env(lane),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (broker.depths(lane, [SLOW])[SLOW] or 0) >= 5:
        time.sleep(0.2)
    os.kill(process.pid, signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    replayed = int(stderr.split("interrupted: replayed ")[1].split(" ")[0])
    counts = broker.depths(lane, [SLOW, SLOW_PARKING])
    assert 5 <= replayed < total, stderr
    assert counts[SLOW] == replayed, (counts, stderr)
    assert counts[SLOW_PARKING] == total - replayed, (counts, stderr)
    assert "not looked at stay parked" in stderr and "run the same command again" in stderr

"""`parking list` shows a body preview with `parking show`'s redaction, and `parking stats`
piped prints tab-separated lines as `list` does.

Adversarial: a body with an encrypted field, a field marked sensitive (--redact) and the same
secret quoted nowhere else; no output of `list` (table, TSV, NDJSON) may hold either plaintext.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rmqkit.crypto import encrypt_fields, load_keyring_file
from tests import broker

PARKING = "pv.work.parking"
TAX_ID = "98765432109"  # encrypted in the body
EMAIL = "ann.secret@example.com"  # plain, masked by --redact email


@pytest.fixture
def parked(fresh_vhost: Any, tmp_path: Path) -> tuple[str, dict[str, str]]:
    vhost = fresh_vhost()
    ring_file = tmp_path / "ring.json"
    made = broker.cli("keys", "generate", "--out", str(ring_file))
    assert made.returncode == 0, made.stderr
    ring = load_keyring_file(ring_file)
    body = json.dumps({"order": 7, "email": EMAIL, "tax_id": TAX_ID}).encode()
    sealed = encrypt_fields(body, ["tax_id"], [], ring)
    args = {"x-queue-type": "quorum", **broker.no_delivery_limit()}
    path = f"/queues/{broker.q(vhost)}/{PARKING}"
    broker.api("PUT", path, json={"durable": True, "arguments": args}).raise_for_status()
    broker.publish_exact(
        vhost,
        "",
        [
            (PARKING, "m-json", sealed, {}),
            (PARKING, "m-text", b"plain\ttext body", {}),
            (PARKING, "m-bin", bytes(range(256)) * 2, {}),
        ],
    )
    kid = ring.current_id
    return vhost, {"kid": kid}


def test_list_previews_bodies_redacted(parked: tuple[str, dict[str, str]]) -> None:
    vhost, ring = parked
    tsv = broker.cli("parking", "list", PARKING, "--redact", "email", vhost=vhost)
    assert tsv.returncode == 0, tsv.stderr
    header, *rows = tsv.stdout.splitlines()
    assert header.split("\t")[-1] == "body"
    by_id = {row.split("\t")[0]: row.split("\t")[-1] for row in rows}
    whole = f'{{"order":7,"email":"***","tax_id":"[encrypted kid={ring["kid"]}]"}}'
    assert by_id == {
        "m-json": whole if len(whole) <= 60 else whole[:59] + "…",
        "m-text": "plain text body",
        "m-bin": "<512 bytes binary>",
    }
    listed = broker.cli("parking", "list", PARKING, "--redact", "email", "--json", vhost=vhost)
    assert listed.returncode == 0, listed.stderr
    previews = {
        json.loads(line)["message_id"]: json.loads(line)["body_preview"]
        for line in listed.stdout.splitlines()
    }
    assert previews == by_id
    for output in (tsv, listed):
        assert TAX_ID not in output.stdout + output.stderr
        assert EMAIL not in output.stdout + output.stderr
    assert broker.depths(vhost, [PARKING]) == {PARKING: 3}  # listing took nothing


def test_stats_tsv_prints_tab_separated_lines(parked: tuple[str, dict[str, Any]]) -> None:
    vhost, _ = parked
    stats = broker.cli("parking", "stats", PARKING, "--tsv", vhost=vhost)
    assert stats.returncode == 0, stats.stderr
    lines = [line.split("\t") for line in stats.stdout.splitlines()]
    assert lines[0] == ["by", "key", "count"]
    assert all(len(line) == 3 for line in lines), stats.stdout
    first = {(by, key): count for by, key, count in lines[1:]}
    assert first[("matched", PARKING)] == "3" and first[("total", PARKING)] == "3"
    assert "╭" not in stats.stdout and "by reason" not in stats.stdout
    check = broker.cli("parking", "stats", PARKING, "--max-count", "10", "--tsv", vhost=vhost)
    assert check.stdout.splitlines()[0].startswith("PARKING OK: "), check.stdout
    assert check.stdout.splitlines()[1] == "by\tkey\tcount"
    piped = broker.cli("parking", "stats", PARKING, vhost=vhost)  # the summary, as before
    assert piped.stdout.splitlines()[0].startswith(f"{PARKING}: 3 message(s)"), piped.stdout
    assert broker.depths(vhost, [PARKING]) == {PARKING: 3}

"""Parking views of encrypted fields (issue 16, docs/encryption.md), on the real broker.

Messages whose bodies carry ``$rmqkit_enc`` envelopes (made with ``rmqkit.crypto.encrypt_fields``
under a key ring that is then rotated, so both key ids are parked) are published straight into
a parking queue with rmqkit's parking headers. Then: list/show/export never print the planted
plaintext; ``--decrypt`` does (a tampered field marked, the others still shown); ``--match``
finds exactly the matching ones across the rotation; replay keeps the bytes.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rmqkit import headers as h
from rmqkit.crypto import encrypt_fields, generate, load_keyring_file, rotate
from tests import broker

TOPOLOGY = '[queues."enc.work"]\nretry_delays = ["1s"]\n'
WORK = "enc.work"
PARKING = "enc.work.parking"
FIELDS = ["customer.name", "tax_id"]
INDEXED = ["tax_id"]
SENTINEL = "PLAINTEXT-SENTINEL-7f3a"


def _headers(index: int) -> dict[str, Any]:
    return {
        h.PARK_REASON: "permanent",
        h.ORIGIN_QUEUE: WORK,
        h.ATTEMPT: 1,
        h.ERROR_TYPE: "shop.errors.Refused",
        h.ERROR_MESSAGE: f"refused order {index}",
        h.FIRST_FAILED_AT: "2026-12-01T20:00:00Z",
        h.LAST_FAILED_AT: "2026-12-01T20:00:00Z",
    }


class Parked:
    """What the module parked: ids by key id and tax id, the bytes of each body."""

    def __init__(self, ring_file: Path) -> None:
        self.ring_file = ring_file
        self.bodies: dict[str, bytes] = {}
        self.kid: dict[str, str] = {}
        self.tax: dict[str, str] = {}
        self.tampered = "m-tampered"

    def env(self) -> dict[str, str]:
        return {"RMQKIT_KEYRING_FILE": str(self.ring_file)}


@pytest.fixture(scope="module")
def parked(vhost: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Parked]:
    tmp = tmp_path_factory.mktemp("enc")
    (tmp / "t.toml").write_text(TOPOLOGY)
    assert broker.cli("declare", str(tmp / "t.toml"), vhost=vhost).returncode == 0
    ring_file = tmp / "ring.json"
    generate(ring_file)
    population = Parked(ring_file)
    messages: list[tuple[str, bytes]] = []
    for generation in range(2):  # before and after a rotation: two key ids
        ring = load_keyring_file(ring_file)
        for i in range(6):
            mid = f"m-{generation}-{i}"
            tax = "TAX-A" if i % 2 == 0 else "TAX-B"
            plain = {
                "order_id": mid,
                "customer": {"name": f"{SENTINEL} {mid}", "tier": "gold"},
                "tax_id": tax,
            }
            body = encrypt_fields(json.dumps(plain).encode(), FIELDS, INDEXED, ring)
            assert SENTINEL.encode() not in body and b"$rmqkit_enc" in body
            population.bodies[mid], population.kid[mid], population.tax[mid] = (
                body,
                ring.current_id,
                tax,
            )
            messages.append((mid, body))
        if generation == 0:
            rotate(ring_file)
    # one more whose name was tampered with (its tax id still opens)
    ring = load_keyring_file(ring_file)
    plain = {"order_id": "t", "customer": {"name": f"{SENTINEL} t"}, "tax_id": "TAX-A"}
    data = json.loads(encrypt_fields(json.dumps(plain).encode(), FIELDS, INDEXED, ring))
    ct = bytearray(base64.b64decode(data["customer"]["name"]["ct"]))
    ct[0] ^= 1
    data["customer"]["name"]["ct"] = base64.b64encode(bytes(ct)).decode()
    body = json.dumps(data).encode()
    population.bodies[population.tampered] = body
    population.tax[population.tampered] = "TAX-A"
    population.kid[population.tampered] = ring.current_id
    messages.append((population.tampered, body))
    broker.publish_with_ids(vhost, "", PARKING, messages, headers=_headers)
    yield population


def _cli(vhost: str, *args: str, env: dict[str, str] | None = None) -> Any:
    return broker.cli(*args, vhost=vhost, env=env, timeout=120)


def test_views_redact_by_default(vhost: str, parked: Parked, tmp_path: Path) -> None:
    listed = _cli(vhost, "parking", "list", PARKING, "--json", env=parked.env())
    assert listed.returncode == 0, listed.stderr
    assert len(listed.stdout.splitlines()) == len(parked.bodies)
    piped = _cli(vhost, "parking", "list", PARKING)
    shown = _cli(vhost, "parking", "show", PARKING, "m-0-0", "--json", env=parked.env())
    later = _cli(vhost, "parking", "show", PARKING, "m-1-0")
    assert shown.returncode == 0 and later.returncode == 0, shown.stderr + later.stderr
    body = json.loads(shown.stdout)["body"]
    assert body["customer"] == {"name": f"[encrypted kid={parked.kid['m-0-0']}]", "tier": "gold"}
    assert body["tax_id"] == f"[encrypted kid={parked.kid['m-0-0']}]"
    assert json.loads(later.stdout)["body"]["tax_id"] == f"[encrypted kid={parked.kid['m-1-0']}]"
    assert parked.kid["m-0-0"] != parked.kid["m-1-0"]
    exported = _cli(vhost, "parking", "export", PARKING, "-o", str(tmp_path / "x.ndjson"))
    assert exported.returncode == 0, exported.stderr
    records = [json.loads(line) for line in (tmp_path / "x.ndjson").read_text().splitlines()]
    # the ciphertext as stored, byte for byte
    assert {r["properties"]["message_id"]: base64.b64decode(r["body"]) for r in records} == (
        parked.bodies
    )
    everything = [listed, piped, shown, later, exported]
    for result in everything:
        assert SENTINEL not in result.stdout + result.stderr
    assert SENTINEL not in (tmp_path / "x.ndjson").read_text()
    assert "personal data" not in exported.stderr
    assert broker.depths(vhost, [PARKING])[PARKING] == len(parked.bodies)


def test_decrypt_shows_the_values(vhost: str, parked: Parked, tmp_path: Path) -> None:
    old = _cli(vhost, "parking", "show", PARKING, "m-0-1", "--decrypt", env=parked.env())
    new = _cli(vhost, "parking", "show", PARKING, "m-1-1", "--decrypt", env=parked.env())
    assert old.returncode == 0 and new.returncode == 0, old.stderr + new.stderr
    assert json.loads(old.stdout)["body"]["customer"]["name"] == f"{SENTINEL} m-0-1"
    assert json.loads(new.stdout)["body"]["tax_id"] == "TAX-B"
    bad = _cli(vhost, "parking", "show", PARKING, parked.tampered, "--decrypt", env=parked.env())
    assert bad.returncode == 0, bad.stderr
    body = json.loads(bad.stdout)["body"]
    assert (
        body["customer"]["name"].startswith("[undecryptable kid=")
        and "tampered" in (body["customer"]["name"])
    )
    assert body["tax_id"] == "TAX-A"  # one bad field does not hide the rest
    out = tmp_path / "plain.ndjson"
    exported = _cli(
        vhost, "parking", "export", PARKING, "--decrypt", "-o", str(out), env=parked.env()
    )
    assert exported.returncode == 0, exported.stderr
    assert "personal data" in exported.stderr
    records = {
        r["properties"]["message_id"]: json.loads(r["body_text"])
        for r in map(json.loads, out.read_text().splitlines())
    }
    assert records["m-0-2"]["customer"]["name"] == f"{SENTINEL} m-0-2"
    assert records["m-1-5"]["tax_id"] == "TAX-B"
    assert broker.depths(vhost, [PARKING])[PARKING] == len(parked.bodies)


def test_decrypt_and_match_need_the_key_ring(vhost: str, parked: Parked, tmp_path: Path) -> None:
    for args in (
        ("parking", "show", PARKING, "m-0-0", "--decrypt"),
        ("parking", "export", PARKING, "--decrypt"),
        ("parking", "list", PARKING, "--match", "tax_id=TAX-A"),
    ):
        result = _cli(vhost, *args)
        assert result.returncode == 78, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and "RMQKIT_KEYRING" in result.stderr
        assert SENTINEL not in result.stdout
    removing = _cli(
        vhost,
        "parking",
        "export",
        PARKING,
        "--decrypt",
        "--remove",
        "-o",
        str(tmp_path / "r.ndjson"),
        env=parked.env(),
    )
    assert removing.returncode == 64 and not (tmp_path / "r.ndjson").exists()
    bad = _cli(vhost, "parking", "list", PARKING, "--match", "no-equals", env=parked.env())
    assert bad.returncode == 64 and len(bad.stderr.strip().splitlines()) == 1
    assert broker.depths(vhost, [PARKING])[PARKING] == len(parked.bodies)


def test_match_finds_by_blind_index_across_a_rotation(vhost: str, parked: Parked) -> None:
    result = _cli(
        vhost, "parking", "list", PARKING, "--json", "--match", "tax_id=TAX-A", env=parked.env()
    )
    assert result.returncode == 0, result.stderr
    ids = {json.loads(line)["message_id"] for line in result.stdout.splitlines()}
    expected = {m for m, tax in parked.tax.items() if tax == "TAX-A"}
    assert ids == expected
    assert {parked.kid[m] for m in ids} == set(parked.kid.values())  # both key ids
    both = _cli(
        vhost,
        "parking",
        "list",
        PARKING,
        "--json",
        "--match",
        "tax_id=TAX-B",
        "--match",
        "order_id=m-1-3",  # a plaintext field compares as it is
        env=parked.env(),
    )
    assert [json.loads(line)["message_id"] for line in both.stdout.splitlines()] == ["m-1-3"]
    # customer.name is encrypted without a blind index: never matches, nothing decrypted
    name = _cli(
        vhost,
        "parking",
        "list",
        PARKING,
        "--json",
        "--match",
        f"customer.name={SENTINEL} m-0-0",
        env=parked.env(),
    )
    assert name.returncode == 0 and name.stdout == ""
    assert SENTINEL not in result.stdout + both.stdout + result.stderr


def test_replay_keeps_the_ciphertext(vhost: str, parked: Parked) -> None:
    """Last: it empties the parking queue of the matches (TAX-B ones) into the work queue."""
    replayed = _cli(
        vhost, "parking", "replay", PARKING, "--match", "tax_id=TAX-B", env=parked.env()
    )
    assert replayed.returncode == 0, replayed.stderr
    moved = broker.drain(vhost, WORK)
    expected = {m for m, tax in parked.tax.items() if tax == "TAX-B"}
    assert {m["message_id"] for m in moved} == expected
    for message in moved:
        assert message["body"] == parked.bodies[message["message_id"]]  # byte-identical
    assert SENTINEL not in replayed.stdout + replayed.stderr
    assert broker.depths(vhost, [PARKING])[PARKING] == len(parked.bodies) - len(expected)

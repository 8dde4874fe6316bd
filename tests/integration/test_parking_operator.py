"""Operator commands do what they said, and only that (issue 9, findings 3, 8 and 9).

Old code (7cb9a46) on these tests: the interactive purge asked about 1,000 and purged 1,500;
an import whose line 4 has `delivery_mode: 7` published 3 records and exited 3 with no line
number, and a rerun published them again; `parking stats --max-count 100` said "0 message(s)"
and exited 0 while 500 parked messages were held unacked by another client.
"""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmqkit.settings import with_vhost
from tests import broker

pytestmark = pytest.mark.semantics("4.3")

TOPOLOGY = '[queues."op.work"]\nretry_delays = ["1s"]\n'
PARKING = "op.work.parking"
BOUNDED = "op.bounded"


@pytest.fixture(scope="module")
def declared(vhost: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("topology") / "op.toml"
    path.write_text(TOPOLOGY)
    assert broker.cli("declare", str(path), vhost=vhost).returncode == 0
    arguments = {"x-max-length": 10, "x-overflow": "reject-publish"}
    broker.api(
        "PUT",
        f"/queues/{broker.q(vhost)}/{BOUNDED}",
        json={"durable": True, "arguments": arguments},
    ).raise_for_status()
    return vhost


@pytest.fixture
def v(declared: str) -> Iterator[str]:
    broker.drain(declared, PARKING)
    broker.drain(declared, BOUNDED)
    yield declared
    broker.drain(declared, PARKING)
    broker.drain(declared, BOUNDED)


def _park(vhost: str, prefix: str, count: int) -> list[str]:
    ids = [f"{prefix}-{i}" for i in range(count)]
    broker.publish_with_ids(vhost, "", PARKING, [(i, b'{"n": 1}') for i in ids])
    return ids


def _depth(vhost: str, queue: str = PARKING) -> int:
    depth = broker.depths(vhost, [queue])[queue]
    assert depth is not None
    return depth


def _env(vhost: str) -> dict[str, str]:
    env = broker.cli_env(vhost)
    return env


# --- finding 3: purge ---------------------------------------------------------------------


def test_interactive_purge_removes_only_what_it_asked_about(v: str) -> None:
    counted = _park(v, "old", 1000)
    master, slave = pty.openpty()  # purge asks only on a terminal
    proc = subprocess.Popen(
        [sys.executable, "-m", "rmqkit", "parking", "purge", PARKING],
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(v),
    )
    os.close(slave)
    try:
        prompt = b""
        deadline = time.monotonic() + 60
        while b"Purge" not in prompt and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stderr], [], [], 1)
            if ready:
                assert proc.stderr is not None
                prompt += os.read(proc.stderr.fileno(), 4096)
        assert b"Purge 1000 message(s)" in prompt, prompt
        later = _park(v, "new", 500)  # parked while the operator reads the question
        os.write(master, b"y\n")
        out, err = proc.communicate(timeout=120)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "purged 1000 message(s)" in out.decode()
    assert _depth(v) == 500
    assert sorted(m["message_id"] for m in broker.drain(v, PARKING)) == sorted(later)
    assert counted  # (all of them gone: the drain above found only the later ones)


def test_purge_limit_and_ids_from_a_list_output(v: str, tmp_path: Path) -> None:
    ids = _park(v, "p", 30)
    limited = broker.cli("parking", "purge", PARKING, "--limit", "5", "--yes", vhost=v)
    assert limited.returncode == 0 and "purged 5 message(s)" in limited.stdout, limited.stderr
    assert _depth(v) == 25
    listing = broker.cli("parking", "list", PARKING, "--json", "--grep", "n", vhost=v)
    lines = listing.stdout.splitlines()
    chosen = tmp_path / "chosen.ndjson"
    chosen.write_text("\n".join(lines[:7]) + "\n")
    by_file = broker.cli("parking", "purge", PARKING, "--ids-from", str(chosen), "-y", vhost=v)
    assert by_file.returncode == 0 and "purged 7 message(s)" in by_file.stdout, by_file.stderr
    plain = tmp_path / "ids.txt"
    plain.write_text("".join(json.loads(line)["message_id"] + "\n" for line in lines[7:10]))
    by_ids = broker.cli("parking", "purge", PARKING, "--ids-from", str(plain), "-y", vhost=v)
    assert by_ids.returncode == 0 and "purged 3 message(s)" in by_ids.stdout
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    refused = broker.cli("parking", "purge", PARKING, "--ids-from", str(empty), "-y", vhost=v)
    assert refused.returncode == 65  # an empty id set must not mean "everything"
    left = {m["message_id"] for m in broker.drain(v, PARKING)}
    gone = {json.loads(line)["message_id"] for line in lines[:10]}
    assert len(left) == 15 and left.isdisjoint(gone) and left < set(ids)


# --- finding 8: import --------------------------------------------------------------------


def _export_file(vhost: str, path: Path, count: int, prefix: str) -> list[str]:
    ids = _park(vhost, prefix, count)
    moved = broker.cli("parking", "export", PARKING, "--remove", "-o", str(path), vhost=vhost)
    assert moved.returncode == 0, moved.stderr
    return ids


def _edit_line(path: Path, number: int, **properties: object) -> None:
    lines = path.read_text().splitlines()
    record = json.loads(lines[number - 1])
    record["properties"].update(properties)
    lines[number - 1] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    ("field", "value"),
    [("delivery_mode", 7), ("expiration", "soon"), ("expiration", "-1"), ("user_id", "bob")],
)
def test_import_checks_property_values_before_publishing(
    v: str, tmp_path: Path, field: str, value: object
) -> None:
    path = tmp_path / "moved.ndjson"
    _export_file(v, path, 21, "bad")
    _edit_line(path, 4, **{field: value})
    result = broker.cli("parking", "import", str(path), BOUNDED, vhost=v)
    assert result.returncode == 65, result.stderr
    assert f"{path}:4" in result.stderr and field in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert _depth(v, BOUNDED) == 0  # nothing published
    assert not list(tmp_path.glob("*.imported-*"))  # nor a journal started


def test_partial_import_resumes_without_duplicates(v: str, tmp_path: Path) -> None:
    """15 records into a queue bounded at 10 (reject-publish): 10 confirmed, exit 3. After
    the queue is emptied, --resume publishes the other 5 and none of the first 10 again."""
    path = tmp_path / "moved.ndjson"
    ids = _export_file(v, path, 15, "imp")
    first = broker.cli("parking", "import", str(path), BOUNDED, vhost=v)
    assert first.returncode == 3, first.stderr
    assert "imported 10 of 15" in first.stderr and "--resume" in first.stderr
    got = [m["message_id"] for m in broker.drain(v, BOUNDED)]
    assert len(got) == 10
    rerun = broker.cli("parking", "import", str(path), BOUNDED, vhost=v)
    assert rerun.returncode == 64 and "--resume" in rerun.stderr and "--again" in rerun.stderr
    assert _depth(v, BOUNDED) == 0  # a plain rerun publishes nothing
    resumed = broker.cli("parking", "import", str(path), BOUNDED, "--resume", vhost=v)
    assert resumed.returncode == 0, resumed.stderr
    assert "imported 5 of 15" in resumed.stderr and "10 imported before" in resumed.stderr
    got += [m["message_id"] for m in broker.drain(v, BOUNDED)]
    assert sorted(got) == sorted(ids)  # every record once
    done = broker.cli("parking", "import", str(path), BOUNDED, "--resume", vhost=v)
    assert done.returncode == 0 and "imported 0 of 15" in done.stderr
    assert _depth(v, BOUNDED) == 0


# --- finding 9: stats ---------------------------------------------------------------------

HOLDER = """
import asyncio, sys, aiormq
async def main():
    conn = await aiormq.connect(sys.argv[1])
    channel = await conn.channel()
    got = []
    async def on_message(message):
        got.append(message)
        if len(got) == int(sys.argv[3]):
            print("holding", flush=True)
    await channel.basic_qos(prefetch_count=0)
    await channel.basic_consume(sys.argv[2], on_message, no_ack=False)
    await asyncio.sleep(3600)
asyncio.run(main())
"""


def test_stats_counts_messages_another_client_holds(v: str) -> None:
    _park(v, "held", 500)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, with_vhost(broker.BASE_URL, v), PARKING, "500"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        assert broker.wait_for(
            lambda: (broker.mgmt_queue(v, PARKING) or {}).get("messages_unacknowledged") == 500,
            timeout_s=30,
        )
        check = broker.cli("parking", "stats", PARKING, "--max-count", "100", vhost=v)
        assert check.returncode == 2, check.stdout + check.stderr  # CRITICAL, not OK
        assert "PARKING CRITICAL" in check.stdout and "500" in check.stdout
        below = broker.cli("parking", "stats", PARKING, "--max-count", "1000", "--json", vhost=v)
        report = json.loads(below.stdout)
        assert report["held_by_others"] == 500 and report["other_consumers"] == 1
        assert below.returncode == 1  # a lane it cannot see into is never "OK"
    finally:
        holder.kill()
        holder.wait()
    assert broker.wait_for(lambda: _depth(v) == 500, timeout_s=30)
    quiet = broker.cli("parking", "stats", PARKING, "--max-count", "1000", vhost=v)
    assert quiet.returncode == 0 and "PARKING OK" in quiet.stdout

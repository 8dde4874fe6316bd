"""Commands that write files never lose a message or an earlier file (issue 9, findings 1-2).

Every command that writes a file is run here with the file size limited (RLIMIT_FSIZE in the
CLI subprocess: the kernel refuses to grow a file past it, as a full disk would): `parking
export` (with and without --remove, to a new file and with --append), topology `export -o`,
and `parking import`'s journal. Each must stop with exit 74 and one line naming the file, and
leave every message in the queue or, complete and durable, in the file.

On the old code (7cb9a46): the FSIZE export --remove exits 1 with a traceback and the file's
complete lines and the queue do not add up; a second `export -o` of the same file truncates it
(the first export's 40 moved messages gone); an export with a mistyped queue empties it too.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import broker

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = '[queues."fs.work"]\nretry_delays = ["1s"]\n'
PARKING = "fs.work.parking"


def cli_limited(
    *args: str,
    vhost: str | None,
    max_file_bytes: int | None = None,
    timeout: float = 120,
    stdout_to: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """`rmqkit ARGS` in a subprocess whose files cannot grow past ``max_file_bytes``
    (``stdout_to``: its stdout redirected to that file, as `> FILE` would)."""
    env = broker.cli_env(vhost)

    def limit() -> None:
        if max_file_bytes is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes, max_file_bytes))

    if stdout_to is None:
        return subprocess.run(
            [sys.executable, "-m", "rmqkit", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            check=False,
            preexec_fn=limit,
            cwd=ROOT,
        )
    with stdout_to.open("w") as sink:
        return subprocess.run(
            [sys.executable, "-m", "rmqkit", *args],
            stdout=sink,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            timeout=timeout,
            check=False,
            preexec_fn=limit,
            cwd=ROOT,
        )


@pytest.fixture(scope="module")
def declared(vhost: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("topology") / "fs.toml"
    path.write_text(TOPOLOGY)
    assert broker.cli("declare", str(path), vhost=vhost).returncode == 0
    return vhost


def _purge(vhost: str) -> None:
    """Empty the parking queue at once (a drain takes one basic.get per message: 12-19 s for
    the 3,000 a test leaves behind, on a loaded machine)."""
    contents = f"/queues/{broker.q(vhost)}/{broker.q(PARKING)}/contents"
    broker.api("DELETE", contents).raise_for_status()
    assert _depth(vhost) == 0


@pytest.fixture
def parked(declared: str) -> Callable[[int, str], list[str]]:
    """Park N messages with ids PREFIX-i (the parking queue is emptied first and after)."""
    _purge(declared)

    def park(count: int, prefix: str) -> list[str]:
        ids = [f"{prefix}-{i}" for i in range(count)]
        payload = b"x" * 200
        broker.publish_with_ids(declared, "", PARKING, [(i, payload) for i in ids])
        return ids

    yield park
    _purge(declared)


def _depth(vhost: str) -> int:
    depth = broker.depths(vhost, [PARKING])[PARKING]
    assert depth is not None
    return depth


def _file_ids(path: Path) -> list[str]:
    """message_ids of the complete lines of an export file (each line must parse)."""
    text = path.read_text(encoding="utf-8")
    assert text == "" or text.endswith("\n"), "the file ends with an incomplete line"
    return [json.loads(line)["properties"]["message_id"] for line in text.splitlines()]


def _queue_ids(vhost: str) -> list[str]:
    return [m["message_id"] for m in broker.drain(vhost, PARKING)]


def test_export_remove_on_a_full_disk_loses_nothing(
    declared: str, parked: Callable[[int, str], list[str]], tmp_path: Path
) -> None:
    """Finding 1: 3,000 parked, the file can hold about half. Every message ends in exactly
    one place: a complete line in the file (and removed) or still parked."""
    v = declared
    ids = parked(3000, "full")
    out = tmp_path / "moved.ndjson"
    result = cli_limited(
        "parking", "export", PARKING, "--remove", "-o", str(out), vhost=v, max_file_bytes=1_000_000
    )
    assert result.returncode == 74, result.stderr
    assert "Traceback" not in result.stderr
    error = result.stderr.strip().splitlines()[-1]
    assert str(out) in error and "stays parked" in error, error
    in_file = _file_ids(out)
    depth = _depth(v)
    assert 0 < len(in_file) < 3000
    assert f"{len(in_file)} message(s) were exported and removed" in error
    assert len(in_file) + depth == 3000  # the queue and the file add up
    in_queue = _queue_ids(v)
    assert sorted(in_file + in_queue) == sorted(ids)  # each exactly once, none lost


def test_export_without_remove_on_a_full_disk_leaves_no_file(
    declared: str, parked: Callable[[int, str], list[str]], tmp_path: Path
) -> None:
    v = declared
    parked(3000, "keep")
    out = tmp_path / "copy.ndjson"
    result = cli_limited(
        "parking", "export", PARKING, "-o", str(out), vhost=v, max_file_bytes=1_000_000
    )
    assert result.returncode == 74 and "Traceback" not in result.stderr, result.stderr
    assert not out.exists()  # never a half export under the name asked for
    assert [p.name for p in tmp_path.iterdir()] == []  # nor a temporary file left behind
    assert _depth(v) == 3000


@pytest.mark.parametrize("command", [("export",), ("list", "--json")])
def test_stdout_redirected_to_a_full_disk_is_exit_74(
    declared: str, parked: Callable[[int, str], list[str]], tmp_path: Path, command: tuple[str, ...]
) -> None:
    v = declared
    parked(3000, "stdout")
    result = cli_limited(
        "parking",
        command[0],
        PARKING,
        *command[1:],
        vhost=v,
        max_file_bytes=500_000,
        stdout_to=tmp_path / "out",
    )
    assert result.returncode == 74, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "File too large" in result.stderr
    assert _depth(v) == 3000


def test_export_append_on_a_full_disk_keeps_the_earlier_lines(
    declared: str, parked: Callable[[int, str], list[str]], tmp_path: Path
) -> None:
    v = declared
    first = parked(20, "early")
    out = tmp_path / "moved.ndjson"
    moved = broker.cli("parking", "export", PARKING, "--remove", "-o", str(out), vhost=v)
    assert moved.returncode == 0, moved.stderr
    before = out.read_bytes()
    later = parked(3000, "late")
    result = cli_limited(
        "parking",
        "export",
        PARKING,
        "--remove",
        "--append",
        "-o",
        str(out),
        vhost=v,
        max_file_bytes=len(before) + 300_000,
    )
    assert result.returncode == 74, result.stderr
    assert out.read_bytes().startswith(before)
    in_file = _file_ids(out)
    assert in_file[:20] == first
    assert sorted(in_file[20:] + _queue_ids(v)) == sorted(later)


def test_a_second_export_never_empties_the_first(
    declared: str, parked: Callable[[int, str], list[str]], tmp_path: Path
) -> None:
    """Finding 2: an existing file is refused (exit 64, nothing done); --append adds, --force
    replaces; a failing export (mistyped queue, exit 65) leaves it as it was."""
    v = declared
    first = parked(40, "first")
    out = tmp_path / "moved.ndjson"
    assert (
        broker.cli("parking", "export", PARKING, "--remove", "-o", str(out), vhost=v).returncode
        == 0
    )
    assert _file_ids(out) == first and _depth(v) == 0
    second = parked(10, "second")
    again = broker.cli("parking", "export", PARKING, "--remove", "-o", str(out), vhost=v)
    assert again.returncode == 64 and "--force" in again.stderr and "--append" in again.stderr
    assert _file_ids(out) == first and _depth(v) == 10  # nothing removed, file intact
    typo = broker.cli("parking", "export", "fs.work.parkin", "--force", "-o", str(out), vhost=v)
    assert typo.returncode == 65, typo.stderr
    assert _file_ids(out) == first
    appended = broker.cli(
        "parking", "export", PARKING, "--remove", "--append", "-o", str(out), vhost=v
    )
    assert appended.returncode == 0, appended.stderr
    assert _file_ids(out) == first + second and _depth(v) == 0
    third = parked(5, "third")
    replaced = broker.cli("parking", "export", PARKING, "--force", "-o", str(out), vhost=v)
    assert replaced.returncode == 0, replaced.stderr
    assert _file_ids(out) == third and _depth(v) == 5
    both = broker.cli("parking", "export", PARKING, "--force", "--append", "-o", str(out), vhost=v)
    assert both.returncode == 64
    assert sorted(p.name for p in tmp_path.iterdir()) == ["moved.ndjson"]  # no temp files


def test_topology_export_refuses_to_overwrite_and_survives_a_full_disk(
    declared: str, tmp_path: Path
) -> None:
    v = declared
    out = tmp_path / "definitions.json"
    out.write_text("earlier\n")
    topology = str(ROOT / "topologies" / "orders.toml")
    args = ("export", topology, "--broker-version", "3.10.8", "-o", str(out))
    refused = broker.cli(*args, vhost=v)
    assert refused.returncode == 64 and "--force" in refused.stderr
    assert out.read_text() == "earlier\n"
    full = cli_limited(*args, "--force", vhost=v, max_file_bytes=100)
    assert full.returncode == 74 and str(out) in full.stderr, full.stderr
    assert out.read_text() == "earlier\n"  # the old file survives a failed replacement
    done = broker.cli(*args, "--force", vhost=v)
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["queues"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["definitions.json"]


def test_import_journal_on_a_full_disk_stops_and_resumes_without_loss(
    declared: str, parked: Callable[[int, str], list[str]], tmp_path: Path
) -> None:
    """The import's journal is a file too: when it cannot grow, the import stops (exit 74)
    with counts, and --resume later publishes every record that was not confirmed."""
    v = declared
    ids = parked(300, "imp")
    out = tmp_path / "moved.ndjson"
    assert (
        broker.cli("parking", "export", PARKING, "--remove", "-o", str(out), vhost=v).returncode
        == 0
    )
    result = cli_limited(
        "parking", "import", str(out), PARKING, vhost=v, max_file_bytes=150 + 65 * 100
    )
    assert result.returncode == 74 and "journal" in result.stderr, result.stderr
    first = _depth(v)
    assert 0 < first < 300
    rest = broker.cli("parking", "import", str(out), PARKING, "--resume", vhost=v)
    assert rest.returncode == 0, rest.stderr
    got = _queue_ids(v)
    assert set(got) == set(ids)  # nothing lost
    # Duplicates only for what was confirmed but not journaled when the disk filled.
    assert (
        len(got) == 300
    )  # and no duplicates: a record is published only once its line is reserved

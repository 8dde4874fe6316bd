"""`rmqkit publish`: confirmed, mandatory, persistent, stable ids; unroutable and busy."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from rmqkit.topology import declare_topology, load_topology
from tests import broker

ROOT = Path(__file__).resolve().parents[2]
BOUNDED = (
    '[exchanges.jobs]\ntype = "direct"\n[queues."jobs.work"]\n'
    'bind = [{ exchange = "jobs", routing_key = "job" }]\nmax_length = 10\n'
)


def _publish(vhost: str, stdin: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = broker.cli_env(vhost)
    return subprocess.run(
        [sys.executable, "-m", "rmqkit", "publish", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
        check=False,
    )


def _declare(vhost: str, tmp_path: Path, text: str) -> None:
    """What `rmqkit declare` does, in-process: setup here, and a CLI start costs 1-2 s."""
    path = tmp_path / "t.toml"
    path.write_text(text)
    broker.run(declare_topology(broker.settings_for(vhost), load_topology(path)))


def test_lines_from_stdin_are_confirmed_with_stable_ids(
    fresh_vhost: Callable[[], str], tmp_path: Path
) -> None:
    vhost = fresh_vhost()
    _declare(vhost, tmp_path, BOUNDED.replace("max_length = 10", "max_length = 100000"))
    result = _publish(vhost, "".join(f"body {i}\n" for i in range(500)), "jobs", "job", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "published": 500,
        "confirmed": 500,
        "returned": 0,
        "nacked": 0,
        "retried": 0,
    }
    messages = broker.drain(vhost, "jobs.work")
    assert sorted(m["body"] for m in messages) == sorted(f"body {i}".encode() for i in range(500))
    assert len({m["message_id"] for m in messages}) == 500


def test_ndjson_carries_headers_properties_and_ids(
    fresh_vhost: Callable[[], str], tmp_path: Path
) -> None:
    vhost = fresh_vhost()
    _declare(vhost, tmp_path, BOUNDED)
    lines = [
        {
            "body": "plain",
            "message_id": "m-1",
            "headers": {"tenant": "t1"},
            "properties": {"content_type": "text/plain", "correlation_id": "c-1"},
        },
        {"body": {"order": 7}, "message_id": "m-2"},
        {"body_b64": "AP8=", "message_id": "m-3"},
    ]
    stdin = "".join(json.dumps(line) + "\n" for line in lines)
    result = _publish(vhost, stdin, "jobs", "job", "--ndjson", "--header", "source=test")
    assert result.returncode == 0, result.stderr
    got = {m["message_id"]: m for m in broker.drain(vhost, "jobs.work")}
    assert got["m-1"]["body"] == b"plain"
    # x-delivery-count: 0 is there on 3.10/3.11 only (omitted at 0 from 3.12)
    assert {k: v for k, v in got["m-1"]["headers"].items() if k != "x-delivery-count"} == {
        "tenant": "t1",
        "source": "test",
    }
    assert got["m-2"]["body"] == b'{"order": 7}' and got["m-3"]["body"] == b"\x00\xff"
    bad = _publish(vhost, '{"body": "x"}\n{"nope": 1}\n', "jobs", "job", "--ndjson")
    assert bad.returncode == 65 and "<stdin>:2" in bad.stderr
    assert broker.depths(vhost, ["jobs.work"])["jobs.work"] == 0  # nothing from a bad file


def test_unroutable_messages_exit_65_with_the_count(
    fresh_vhost: Callable[[], str], tmp_path: Path
) -> None:
    vhost = fresh_vhost()
    _declare(vhost, tmp_path, BOUNDED)
    result = _publish(vhost, "a\nb\nc\n", "jobs", "no.such.key")
    assert result.returncode == 65
    assert "returned 3" in result.stderr and "3 message(s) were unroutable" in result.stderr


def test_a_full_bounded_queue_is_reported_busy_and_loses_no_confirmed_message(
    fresh_vhost: Callable[[], str], tmp_path: Path
) -> None:
    vhost = fresh_vhost()
    _declare(vhost, tmp_path, BOUNDED)
    # A quorum queue tells its publishers it is full asynchronously, so a burst can overshoot
    # the bound (a 300-message burst written at once was seen all confirmed into a queue of 10);
    # a queue already over its bound refuses for certain. What must hold: the broker refuses the
    # rest, the command says busy (69), and the queue holds exactly the messages reported
    # confirmed.
    confirmed = 0
    for _ in range(3):
        result = _publish(vhost, "".join(f"{i}\n" for i in range(300)), "jobs", "job", "--json")
        report = json.loads(result.stdout)
        confirmed += report["confirmed"]
        if result.returncode != 0:
            break
    assert result.returncode == 69, result.stderr
    assert report["nacked"] > 0 and report["confirmed"] + report["nacked"] == 300
    assert "broker busy" in result.stderr and "--retry-busy" in result.stderr
    queued = broker.drain(vhost, "jobs.work")
    assert len(queued) == confirmed  # exactly the confirmed ones

    # With --retry-busy and a consumer draining the queue, everything gets through. The queue
    # is put over its bound first (a burst may overshoot, see above), and the drainer starts
    # late, so some attempts are refused for certain and retried.
    _publish(vhost, "".join(f"{i}\n" for i in range(300)), "jobs", "job")
    stop = threading.Event()

    def drain_slowly() -> None:
        # Start a second after the command has connected, not after it was started: under load
        # its start-up alone can outlast a fixed wait, and the queue would be drained before its
        # first publish (nothing refused, nothing retried; seen once on a loaded 4.3 node).
        listed = f"/vhosts/{broker.q(vhost)}/connections"
        while not stop.is_set() and not broker.api("GET", listed).json():
            stop.wait(0.1)
        stop.wait(1.0)
        while not stop.is_set():
            broker.drain(vhost, "jobs.work")
            time.sleep(0.2)

    drainer = threading.Thread(target=drain_slowly)
    drainer.start()
    try:
        result = _publish(
            vhost, "".join(f"{i}\n" for i in range(300)), "jobs", "job", "--retry-busy", "--json"
        )
    finally:
        stop.set()
        drainer.join()
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["confirmed"] == 300 and report["retried"] > 0


def test_unknown_exchange_and_usage(fresh_vhost: Callable[[], str]) -> None:
    vhost = fresh_vhost()
    missing = _publish(vhost, "x\n", "ghost", "k")
    assert missing.returncode == 65 and "ghost" in missing.stderr
    assert (
        broker.cli("publish", "ghost", "k", "--message-id", "a", vhost=vhost).returncode == 64
    )  # usage (a27b3f1)


# --- finding 7 of issue 9: ids that a rerun repeats -------------------------------------------
# On the code of 7cb9a46 every run generated fresh uuid4 ids: the two runs below share no id, and
# after a lost connection the advised rerun ("duplicates carry the same message_id") produced
# duplicates with new ids (distinct ids = lines + confirmed ones of the first run).

UNBOUNDED = BOUNDED.replace("max_length = 10", "max_length = 100000")


def _ids_in_order(vhost: str) -> list[tuple[bytes, str]]:
    return [(m["body"], m["message_id"]) for m in broker.drain(vhost, "jobs.work")]


def test_the_same_input_published_again_gets_the_same_ids(
    fresh_vhost: Callable[[], str], tmp_path: Path
) -> None:
    vhost = fresh_vhost()
    _declare(vhost, tmp_path, UNBOUNDED)
    stdin = "same\nother\n\nsame\n" + "".join(f"line {i}\n" for i in range(200))
    assert _publish(vhost, stdin, "jobs", "job").returncode == 0
    first = _ids_in_order(vhost)
    assert _publish(vhost, stdin, "jobs", "job").returncode == 0
    second = _ids_in_order(vhost)
    assert first == second and len(first) == 203
    # identical bodies at different positions (lines 1 and 4) are different messages
    assert first[0][0] == first[2][0] == b"same" and first[0][1] != first[2][1]
    assert len({message_id for _, message_id in first}) == 203

    # --random-ids: the old behaviour, asked for
    assert _publish(vhost, stdin, "jobs", "job", "--random-ids").returncode == 0
    assert not {i for _, i in _ids_in_order(vhost)} & {i for _, i in first}

    # --body is positional too; the same bodies again give the same ids
    for _ in range(2):
        result = broker.cli("publish", "jobs", "job", "--body", "x", "--body", "x", vhost=vhost)
        assert result.returncode == 0, result.stderr
    bodies = _ids_in_order(vhost)
    assert [i for _, i in bodies[:2]] == [i for _, i in bodies[2:]] and bodies[0] != bodies[1]


def test_id_from_a_field_of_the_record(fresh_vhost: Callable[[], str], tmp_path: Path) -> None:
    vhost = fresh_vhost()
    _declare(vhost, tmp_path, UNBOUNDED)
    records = [
        {"body": {"order_id": "o-1", "n": 1}},
        {"body": {"order_id": 2, "n": 2}},
        {"body": {"order_id": "o-3"}, "message_id": "explicit"},  # an explicit id wins
    ]
    stdin = "".join(json.dumps(r) + "\n" for r in records)
    result = _publish(vhost, stdin, "jobs", "job", "--ndjson", "--id-from", "body.order_id")
    assert result.returncode == 0, result.stderr
    assert [i for _, i in _ids_in_order(vhost)] == ["o-1", "2", "explicit"]

    lines = '{"order_id": "a"}\n{"order_id": "b"}\n'
    assert _publish(vhost, lines, "jobs", "job", "--id-from", "order_id").returncode == 0
    assert [i for _, i in _ids_in_order(vhost)] == ["a", "b"]

    # a line without the field: exit 65 naming the line, nothing published
    bad = _publish(vhost, lines + '{"other": 1}\n', "jobs", "job", "--id-from", "order_id")
    assert bad.returncode == 65 and "<stdin>:3" in bad.stderr and "order_id" in bad.stderr
    bad = _publish(vhost, lines + "not json\n", "jobs", "job", "--id-from", "order_id")
    assert bad.returncode == 65 and "<stdin>:3" in bad.stderr
    assert broker.depths(vhost, ["jobs.work"])["jobs.work"] == 0
    usage = _publish(vhost, lines, "jobs", "job", "--id-from", "order_id", "--random-ids")
    assert usage.returncode == 64  # a usage error (a27b3f1)


def _connections(vhost: str) -> list[str]:
    response = broker.api("GET", f"/vhosts/{broker.q(vhost)}/connections")
    return [c["name"] for c in response.json()] if response.status_code == 200 else []


def test_after_a_lost_connection_the_advised_rerun_repeats_the_same_ids(
    fresh_vhost: Callable[[], str], tmp_path: Path
) -> None:
    vhost = fresh_vhost()
    _declare(vhost, tmp_path, UNBOUNDED)
    lines = [f"line {i}\n" for i in range(3000)]
    env = broker.cli_env(vhost)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rmqkit", "publish", "jobs", "job", "--window", "50", "--json"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert proc.stdin is not None
    try:
        proc.stdin.write("".join(lines[:2000]))
        proc.stdin.flush()
        assert broker.wait_for(lambda: broker.depths(vhost, ["jobs.work"])["jobs.work"] >= 1900)
        names = broker.wait_for(lambda: _connections(vhost))
        assert len(names) == 1, names
        broker.api("DELETE", f"/connections/{broker.q(names[0])}").raise_for_status()
        time.sleep(0.5)
        proc.stdin.write("".join(lines[2000:]))
        proc.stdin.close()
        proc.wait(timeout=60)
        assert proc.stderr is not None
        stderr = proc.stderr.read()
    finally:
        proc.kill()
    assert proc.returncode not in (0, 1), stderr  # a mapped error, not a traceback
    first_run = broker.depths(vhost, ["jobs.work"])["jobs.work"]
    assert first_run is not None and 1900 <= first_run < 3000

    rerun = _publish(vhost, "".join(lines), "jobs", "job")
    assert rerun.returncode == 0, rerun.stderr
    held = _ids_in_order(vhost)
    assert len(held) == first_run + 3000
    # what the advice promised: the duplicates carry the ids of the first run's copies
    by_id: dict[str, set[bytes]] = {}
    for body_, message_id in held:
        by_id.setdefault(message_id, set()).add(body_)
    assert len(by_id) == 3000
    assert all(len(bodies) == 1 for bodies in by_id.values())
    # ... which is what the error said to do and would happen
    assert "run the same command with the same input again" in stderr, stderr
    assert "same message_id again" in stderr

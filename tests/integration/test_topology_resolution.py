"""`rmqkit consume` without --topology finds the file that declares its queue (RMQKIT_TOPOLOGY,
rmqkit.toml, topologies/*.toml) and runs on its attempts and permanent errors; a queue declared by
rmqkit with no file to be found is refused (78) instead of run on silent defaults."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmqkit.headers import ATTEMPT, ERROR_TYPE, PARK_REASON
from rmqkit.topology import declare_topology, parse_topology
from tests import broker
from tests.handlers import body

ROOT = Path(__file__).resolve().parents[2]


def topology_text(name: str) -> str:
    """A work queue with 3 attempts and KeyError permanent (the built-in defaults: 5, none)."""
    return f"""
[exchanges.{name}]
type = "direct"

[queues."{name}.work"]
bind = [{{ exchange = "{name}", routing_key = "job" }}]
retry_delays = ["1s"]
max_attempts = 3
permanent_errors = ["KeyError"]
"""


def declare(vhost: str, name: str) -> None:
    text = topology_text(name)
    broker.run(declare_topology(broker.settings_for(vhost), parse_topology(text, name)))


class Consume:
    """`rmqkit consume tests.handlers:handle` started from ``cwd`` (not the repository)."""

    def __init__(self, vhost: str, cwd: Path, queue: str, *args: str, **env: str) -> None:
        full = broker.cli_env(vhost)
        full["PYTHONPATH"] = os.pathsep.join([str(ROOT), full.get("PYTHONPATH", "")])
        full["RMQKIT_TEST_LEDGER"] = str(cwd / "ledger.db")
        full.update(env)
        self.log = cwd / "consume.log"
        self._out = self.log.open("w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rmqkit",
                "consume",
                "tests.handlers:handle",
                "-q",
                queue,
                *args,
            ],
            cwd=cwd,
            env=full,
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        return self.log.read_text()

    def wait_started(self) -> str:
        broker.wait_for(lambda: "topology:" in self.output() or self.proc.poll() is not None)
        return self.output()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        finally:
            self._out.close()


@pytest.fixture
def started() -> Iterator[list[Consume]]:
    procs: list[Consume] = []
    yield procs
    for one in procs:
        if one.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                one.proc.kill()
            one.proc.wait(timeout=10)


def parked(vhost: str, queue: str, count: int) -> list[dict[str, object]]:
    broker.wait_for(lambda: broker.depths(vhost, [queue])[queue] == count, timeout_s=30)
    return broker.drain(vhost, queue)


def run_and_check(vhost: str, name: str, cwd: Path, started: list[Consume], **env: str) -> str:
    """Publish a permanent and a transient failure; both parked as the file says."""
    consumer = Consume(vhost, cwd, f"{name}.work", **env)
    started.append(consumer)
    log = consumer.wait_started()
    perm, trans = uuid.uuid4().hex, uuid.uuid4().hex
    broker.publish_with_ids(
        vhost,
        name,
        "job",
        [(perm, body(id=perm, **{"raise": "KeyError"})), (trans, body(id=trans, fail=99))],
    )
    got = {m["message_id"]: m["headers"] for m in parked(vhost, f"{name}.work.parking", 2)}
    assert consumer.stop() == 0, consumer.output()
    assert got[perm][PARK_REASON] == "permanent" and got[perm][ATTEMPT] == 1
    assert "KeyError" in str(got[perm][ERROR_TYPE])
    # exhausted at the file's 3 attempts, not the default 5
    assert got[trans][PARK_REASON] == "exhausted" and got[trans][ATTEMPT] == 3
    return log


def test_topologies_dir_is_found_and_its_settings_used(
    vhost: str, tmp_path: Path, started: list[Consume]
) -> None:
    declare(vhost, "found")
    (tmp_path / "topologies").mkdir()
    (tmp_path / "topologies" / "found.toml").write_text(topology_text("found"))
    (tmp_path / "topologies" / "other.toml").write_text(topology_text("other"))
    log = run_and_check(vhost, "found", tmp_path, started)
    assert "topology: topologies/found.toml (found via topologies/found.toml)" in log, log
    assert "queue found.work: max_attempts=3, retry 1s, permanent: KeyError" in log, log


def test_rmqkit_topology_env_and_project_file(
    vhost: str, tmp_path: Path, started: list[Consume]
) -> None:
    declare(vhost, "viaenv")
    elsewhere = tmp_path / "conf" / "t.toml"
    elsewhere.parent.mkdir()
    elsewhere.write_text(topology_text("viaenv"))
    app = tmp_path / "app"
    app.mkdir()
    log = run_and_check(vhost, "viaenv", app, started, RMQKIT_TOPOLOGY=str(elsewhere))
    assert f"topology: {elsewhere} (found via RMQKIT_TOPOLOGY)" in log, log

    declare(vhost, "viaproj")
    proj = tmp_path / "proj"
    (proj / "deploy").mkdir(parents=True)
    (proj / "deploy" / "q.toml").write_text(topology_text("viaproj"))
    (proj / "rmqkit.toml").write_text('topologies = ["deploy/q.toml"]\n')
    log = run_and_check(vhost, "viaproj", proj, started)
    assert "(found via rmqkit.toml)" in log, log


def test_wired_queue_without_a_file_is_refused(vhost: str, tmp_path: Path) -> None:
    declare(vhost, "nofile")
    out = broker.cli("consume", "tests.handlers:handle", "-q", "nofile.work", vhost=vhost)
    # the repository's own topologies/ do not declare nofile.work either
    assert out.returncode == 78, out.stderr
    line = out.stderr.strip()
    assert "\n" not in line, line
    assert "--topology" in line and "--no-topology" in line and "RMQKIT_TOPOLOGY" in line, line
    assert "nofile.work.parking" in line, line


def test_no_topology_runs_on_defaults_and_says_so(
    vhost: str, tmp_path: Path, started: list[Consume]
) -> None:
    declare(vhost, "deflt")
    consumer = Consume(vhost, tmp_path, "deflt.work", "--no-topology", "--log-format", "json")
    started.append(consumer)
    first = json.loads(consumer.wait_started().splitlines()[0])  # one JSON object a line
    log = first["msg"]
    assert first["level"] == "INFO" and "topology: none (--no-topology)" in log, log
    assert "built-in defaults" in log and "max_attempts=5" in log and "permanent: none" in log
    time.sleep(0.1)
    assert consumer.stop() == 0, consumer.output()


def test_plain_queue_without_wiring_is_not_refused_for_want_of_a_file(vhost: str) -> None:
    """A queue rmqkit did not declare is not mistaken for one whose file is missing (it is
    refused for having no parking queue, which names rmqkit declare)."""
    broker.run(_plain(vhost, "plain.work"))
    out = broker.cli("consume", "tests.handlers:handle", "-q", "plain.work", vhost=vhost)
    assert out.returncode == 78, out.stderr
    assert "no parking queue" in out.stderr and "none was found" not in out.stderr


async def _plain(vhost: str, name: str) -> None:
    import aio_pika

    conn = await aio_pika.connect(broker.with_vhost(broker.BASE_URL, vhost))
    try:
        channel = await conn.channel()
        await channel.declare_queue(name, durable=True)
    finally:
        await conn.close()

"""An aiormq outside the declared range cannot lose parked messages: the replay refuses to start.

aiormq 7.2.0 binds its channel reader's frame handlers when the channel opens, so the
instance override ConfirmedPublisher installs for basic.return is never called there, and a
returned copy without a message_id was settled by the broker's ack that follows: counted
replayed, its original acked. The scenario of issue 10: 40 parked messages without a
message_id, replayed to a queue that does not exist.

aiormq 7.2.0 is forced into its own venv (.venv-aiormq720, git-ignored, built once from
constraints/aiormq-7.2.0.txt and reused), which holds the client libraries only: rmqkit runs from
this source tree (PYTHONPATH), so pip never sees rmqkit's own requirements, as for a user who
installed an older aio-pika/aiormq after rmqkit.

On the old code (7cb9a46) with the forced versions: exit 0, "replayed 40 of 40 selected;
returned 0", the parking queue empty — all 40 lost. Now: exit 78, one line naming the
versions, and the 40 parked messages never delivered (nothing touched).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import aiormq
import pytest
from packaging.requirements import Requirement
from pamqp import commands as spec

from rmqkit.settings import with_vhost
from tests import broker

pytestmark = [pytest.mark.broker, pytest.mark.semantics("4.3")]

ROOT = Path(__file__).resolve().parents[2]
FORCED = ROOT / "constraints" / "aiormq-7.2.0.txt"
VENV = Path(os.environ.get("RMQKIT_AIORMQ720_VENV", ROOT / ".venv-aiormq720"))
PARKING = "dc.work.parking"
GONE = "dc.gone"  # the origin queue the parked messages name: it does not exist
COUNT = 40


def _client_only_requirements() -> list[str]:
    """rmqkit's runtime dependencies by name only: the versions come from the constraints."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return sorted(Requirement(line).name for line in project["dependencies"])


def _forced_python() -> Path:
    """The venv with aiormq 7.2.0 forced in, built on first use and reused while unchanged.

    Under a lock: CI runs this module in two pytest runs at once (3.10 and 4.3 lanes, and
    scripts/test-lowest), and a second `venv --clear` would empty the venv under the first."""
    names = _client_only_requirements()
    want = hashlib.sha256(FORCED.read_bytes() + " ".join(names).encode()).hexdigest()
    python = VENV / "bin" / "python"
    stamp = VENV / "rmqkit-forced.sha256"
    # Outside the venv (which --clear empties) and the checkout (nothing left behind in git).
    key = hashlib.sha256(str(VENV.resolve()).encode()).hexdigest()[:12]
    with (Path(tempfile.gettempdir()) / f"rmqkit-forced-venv-{key}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (python.exists() and stamp.exists() and stamp.read_text().strip() == want):
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
            subprocess.run(
                [str(python), "-m", "pip", "install", "--quiet", "-c", str(FORCED), *names],
                check=True,
                timeout=600,
            )
            stamp.write_text(want + "\n")
    return python


@pytest.fixture(scope="module")
def forced_python() -> Path:
    python = _forced_python()
    versions = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('aiormq'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert versions == "7.2.0"
    return python


async def _declare_and_park(vhost: str) -> None:
    conn = await aiormq.connect(with_vhost(broker.BASE_URL, vhost))
    channel = await conn.channel()
    await channel.queue_delete(PARKING)
    # No delivery limit, as rmqkit declares a parking queue (4.x gives quorum queues 20).
    arguments = {"x-queue-type": "quorum", **broker.no_delivery_limit()}
    await channel.queue_declare(PARKING, durable=True, arguments=arguments)
    await conn.close()


def _park(vhost: str) -> None:
    broker.run(_declare_and_park(vhost))
    broker.publish_exact(
        vhost,
        "",
        [
            (
                PARKING,
                None,  # no message_id: aiormq cannot match its return
                f"m{i}".encode(),
                {"rmqkit-origin-queue": GONE, "rmqkit-reason": "permanent"},
            )
            for i in range(COUNT)
        ],
    )


async def _take_all(vhost: str) -> list[tuple[bytes, bool, str | None]]:
    """(body, redelivered, message_id) of every message in parking (taken: the end of a test)."""
    conn = await aiormq.connect(with_vhost(broker.BASE_URL, vhost))
    out: list[tuple[bytes, bool, str | None]] = []
    try:
        channel = await conn.channel()
        while True:
            got = await channel.basic_get(PARKING, no_ack=True)
            if isinstance(got.delivery, spec.Basic.GetEmpty):
                return out
            assert isinstance(got.delivery, spec.Basic.GetOk)
            redelivered = bool(got.delivery.redelivered)
            out.append((got.body, redelivered, got.header.properties.message_id))
    finally:
        await conn.close()


def _replay(python: Path, vhost: str) -> subprocess.CompletedProcess[str]:
    env = broker.cli_env(vhost)
    env["PYTHONPATH"] = str(ROOT)  # this tree's rmqkit, whatever the venv holds
    return subprocess.run(
        [str(python), "-m", "rmqkit", "parking", "replay", PARKING],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def _parked_after(vhost: str) -> list[tuple[bytes, bool, str | None]]:
    # Quorum queues apply returns asynchronously: wait until all 40 are ready again (or not).
    broker.wait_for(lambda: broker.depths(vhost, [PARKING])[PARKING] == COUNT, timeout_s=10)
    taken: list[tuple[bytes, bool, str | None]] = broker.run(_take_all(vhost))
    return taken


def test_replay_with_aiormq_720_refuses_and_touches_nothing(
    vhost: str, forced_python: Path
) -> None:
    _park(vhost)
    result = _replay(forced_python, vhost)
    assert result.returncode != 0, (
        f"exit 0 on aiormq 7.2.0: {result.stdout!r} {result.stderr!r}; "
        f"parking now holds {broker.depths(vhost, [PARKING])[PARKING]} of {COUNT}"
    )
    parked = _parked_after(vhost)
    assert sorted(body for body, _, _ in parked) == sorted(f"m{i}".encode() for i in range(COUNT))
    assert all(message_id is None for _, _, message_id in parked)
    assert GONE not in broker.queue_names(vhost)
    if result.returncode == 78:  # refused before anything was taken from parking
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("rmqkit: error: "), result.stderr
        assert "aiormq 7.2.0" in lines[0] and "'aiormq>=7.2.1,<7.3'" in lines[0]
        assert "aio-pika 10.1.1" in lines[0] and "pamqp 4.0.1" in lines[0]
        assert result.stdout == ""
        assert not any(redelivered for _, redelivered, _ in parked), "a message was delivered"
    else:  # or, acceptable too: it ran and reported every copy returned
        assert result.returncode == 3, (result.returncode, result.stdout, result.stderr)
        assert f"returned {COUNT}" in result.stdout + result.stderr


def test_replay_on_the_supported_versions_reports_every_copy_returned(vhost: str) -> None:
    """The same scenario in the project's venv: it runs, and all 40 come back (exit 3)."""
    _park(vhost)
    result = _replay(Path(sys.executable), vhost)
    assert result.returncode == 3, (result.stdout, result.stderr)
    assert f"returned {COUNT}" in result.stdout + result.stderr, (result.stdout, result.stderr)
    parked = _parked_after(vhost)
    assert sorted(body for body, _, _ in parked) == sorted(f"m{i}".encode() for i in range(COUNT))


def test_the_forced_venv_really_is_outside_the_declared_range(forced_python: Path) -> None:
    """The check above is only meaningful if 7.2.0 is what pyproject.toml excludes."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (aiormq_req,) = [r for r in map(Requirement, project["dependencies"]) if r.name == "aiormq"]
    assert not aiormq_req.specifier.contains("7.2.0")
    assert aiormq_req.specifier.contains(importlib.metadata.version("aiormq"))

"""`rmqkit init` scaffolds a project that works end to end: declared, published to, consumed by
`rmqkit consume` started in it (which finds its topology), and its generated test passes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from rmqkit.headers import ATTEMPT, PARK_REASON
from tests import broker

FILES = ["topologies/shop.toml", "shop_handlers.py", "test_shop_handlers.py", "README.shop.md"]


def init(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rmqkit", "init", "--name", "shop", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_init_refuses_to_overwrite_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "shop_handlers.py").write_text("# mine\n")
    out = init(tmp_path)
    assert out.returncode == 64, out.stderr
    assert "shop_handlers.py" in out.stderr and "nothing was written" in out.stderr
    assert (tmp_path / "shop_handlers.py").read_text() == "# mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shop_handlers.py"]


def test_the_scaffold_works_end_to_end(vhost: str, tmp_path: Path) -> None:
    out = init(tmp_path)
    assert out.returncode == 0, out.stderr
    assert all((tmp_path / f).is_file() for f in FILES), out.stdout
    declared = broker.cli("declare", str(tmp_path / "topologies" / "shop.toml"), vhost=vhost)
    assert declared.returncode == 0, declared.stderr

    env = broker.cli_env(vhost)
    log = tmp_path / "consume.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rmqkit", "consume", "shop_handlers:handle", "-q", "shop.work"],
            cwd=tmp_path,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
        try:
            broker.wait_for(lambda: "topology:" in log.read_text() or proc.poll() is not None)
            started = log.read_text()
            assert "topologies/shop.toml (found via topologies/shop.toml)" in started, started
            good = json.dumps({"id": 1, "amount_cents": 1250, "customer": "ada"})
            declined = json.dumps({"id": 2, "amount_cents": 0, "customer": "bob"})
            for body, mid in ((good, "o-1"), (declined, "o-2")):
                sent = broker.cli(
                    "publish", "shop", "shop.new", "--body", body, "--message-id", mid, vhost=vhost
                )
                assert sent.returncode == 0, sent.stderr
            names = ["shop.work", "shop.work.parking"]
            broker.wait_for(
                lambda: broker.depths(vhost, names) == {"shop.work": 0, "shop.work.parking": 1},
                timeout_s=30,
            )
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0, log.read_text()
    (parked,) = broker.drain(vhost, "shop.work.parking")
    assert parked["message_id"] == "o-2"
    assert parked["headers"][PARK_REASON] == "permanent" and parked["headers"][ATTEMPT] == 1

    env = {k: v for k, v in os.environ.items() if not k.startswith("RMQKIT_")}
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert "4 passed" in tests.stdout, tests.stdout

"""`rmqkit doctor --dedupe DSN [--replay-horizon D]` (issue 13): the idempotent-consumer store's
retention window against the longest retry path plus the declared parking replay horizon.

Real broker (a fresh vhost with topologies/orders.toml declared: tiers 1s, 5s, 30s, 2m and
max_attempts 5, so the longest retry path is 4 retries in the 2m tier = 8m) and real stores
(a SQLite file, a PostgreSQL schema of its own) whose window is set, and read back, through
rmqkit.idempotency's public API. The CLI runs in-process through its own entry point.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rmqkit.cli.main import main
from rmqkit.idempotency import dedupe_status, init_store
from rmqkit.settings import with_vhost
from rmqkit.topology import declare_topology, load_topology
from tests import broker
from tests.dedupe_harness import BACKENDS, store_dsn

pytestmark = pytest.mark.broker
ROOT = Path(__file__).resolve().parents[2]
ORDERS = str(ROOT / "topologies" / "orders.toml")
CHECK = "dedupe-window-short"

Doctor = Callable[..., tuple[int, dict[str, Any], str]]


@pytest.fixture
def doctor(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Doctor:
    """`rmqkit doctor --growth-sample 0 ARGS` against ``vhost``: exit code, the --json report
    (empty when it printed none) and stderr."""
    for key in [k for k in os.environ if k.startswith("RMQKIT_")]:
        monkeypatch.delenv(key)
    monkeypatch.chdir(ROOT / "tests")  # no stray .env

    def run(vhost: str, *args: str) -> tuple[int, dict[str, Any], str]:
        capsys.readouterr()
        url = with_vhost(broker.BASE_URL, vhost)
        argv = ["--url", url, "--management-url", broker.MGMT, "doctor", "--growth-sample", "0"]
        code = main([*argv, *args])
        out, err = capsys.readouterr()
        return code, (json.loads(out) if out.strip() else {}), err

    return run


@pytest.fixture
def orders_vhost(fresh_vhost: Callable[[], str]) -> str:
    vhost = fresh_vhost()
    broker.run(declare_topology(broker.settings_for(vhost), load_topology(ORDERS)))
    return vhost


def check_status(report: dict[str, Any]) -> str | None:
    return next((c["status"] for c in report["checks"] if c["id"] == CHECK), None)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_window_shorter_than_retries_plus_replay_horizon_warns(
    backend: str, tmp_path: Path, orders_vhost: str, doctor: Doctor
) -> None:
    with store_dsn(backend, tmp_path) as dsn:
        init_store(dsn, window_s=3600)
        assert dedupe_status(dsn).window_s == 3600  # what the store holds
        args = ("--topology", ORDERS, "--dedupe", dsn, "--replay-horizon", "2h", "--json")
        code, report, _ = doctor(orders_vhost, *args)
        (finding,) = report["findings"]  # the declared topology is clean otherwise
        assert (code, finding["check"], finding["severity"]) == (1, CHECK, "warning")
        assert (finding["kind"], finding["object"]) == ("store", dedupe_status(dsn).dsn)
        evidence = finding["evidence"]
        assert "retention window 1h is shorter than the longest retry path 8m" in evidence
        assert "work queue orders.work: 4 retries (max_attempts 5 in the topology)" in evidence
        assert "parking replay horizon 2h (--replay-horizon) = 128m" in evidence
        assert "--window 1d" in finding["fix"]
        assert check_status(report) == "warning"

        # The operator records a longer window: the store holds it and doctor is satisfied.
        init_store(dsn, window_s=86400)
        assert dedupe_status(dsn).window_s == 86400
        code, report, _ = doctor(orders_vhost, *args)
        assert (code, report["findings"], check_status(report)) == (0, [], "ok")


def test_without_a_topology_the_tiers_come_from_the_broker(
    tmp_path: Path, orders_vhost: str, doctor: Doctor
) -> None:
    with store_dsn("sqlite", tmp_path) as dsn:
        init_store(dsn, window_s=300)
        code, report, _ = doctor(orders_vhost, "--dedupe", dsn, "--json")
    (finding,) = report["findings"]
    assert (code, finding["check"], finding["object"]) == (1, CHECK, dedupe_status(dsn).dsn)
    evidence = finding["evidence"]
    assert "retention window 5m is shorter than the longest retry path 8m" in evidence
    assert "max_attempts 5, the consumer default" in evidence
    assert "no parking replay horizon (--replay-horizon not given: counted as 0) = 8m" in evidence


def test_the_check_runs_only_with_a_store(
    tmp_path: Path, orders_vhost: str, doctor: Doctor
) -> None:
    code, report, _ = doctor(orders_vhost, "--json")
    assert (code, check_status(report)) == (0, None)  # a plain run reports as before
    code, _, err = doctor(orders_vhost, "--replay-horizon", "2h")
    assert (code, err.strip()) == (64, "rmqkit: error: --replay-horizon goes with --dedupe DSN")
    code, _, err = doctor(orders_vhost, "--dedupe", "sqlite:///x.db", "--replay-horizon", "2x")
    assert code == 64 and err.startswith("rmqkit: error: --replay-horizon: bad duration '2x'")


def test_a_store_never_initialised_is_exit_78(
    tmp_path: Path, orders_vhost: str, doctor: Doctor
) -> None:
    dsn = f"sqlite:///{tmp_path / 'empty.db'}"
    code, report, err = doctor(orders_vhost, "--dedupe", dsn, "--json")
    assert (code, report) == (78, {})
    assert err.count("\n") == 1 and "rmqkit dedupe init" in err, err

"""Retry defaults (issue 15): a work queue whose file leaves out `retry_delays` retries through
the default ladder (1s, 10s, 1m, 5m) instead of parking on its first transient failure; an
explicit `retry_delays = []` still means no retries."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tests import broker
from tests.consumer_harness import ConsumerProcess, effects, events, wait_until

DEFAULTS = """
[exchanges.dflt]
type = "direct"

[queues."dflt.work"]
bind = [{ exchange = "dflt", routing_key = "job" }]
jitter_slots = 1
"""
NO_RETRIES = DEFAULTS.replace("jitter_slots = 1", "jitter_slots = 1\nretry_delays = []")


def _declare(vhost: str, path: Path, text: str) -> None:
    path.write_text(text)
    result = broker.cli("declare", str(path), vhost=vhost)
    assert result.returncode == 0, result.stdout + result.stderr


def test_default_ladder_is_declared_stated_and_retried_through(
    tmp_path: Path, fresh_vhost: Callable[[], str]
) -> None:
    vhost = fresh_vhost()
    path = tmp_path / "dflt.toml"
    _declare(vhost, path, DEFAULTS)
    waits = {n for n in broker.queue_names(vhost) if n.startswith("dflt.work.wait.")}
    assert waits == {f"dflt.work.wait.{d}" for d in ("1s", "10s", "1m", "5m")}

    plan = broker.cli("plan", str(path), vhost=vhost)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "dflt.work: retries 1s, 10s, 1m, 5m (the default ladder), max_attempts 5" in plan.stdout
    data = json.loads(broker.cli("plan", str(path), "--json", vhost=vhost).stdout)
    assert data["work_queues"][0]["default_retries"] is True

    # A message that fails once comes back through the 1 s tier and succeeds; nothing parks.
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(vhost, ledger, queue="dflt.work", topology=str(path))
    try:
        broker.publish_with_ids(vhost, "dflt", "job", [("once", b'{"id": "once", "fail": 1}')])
        assert wait_until(lambda: effects(ledger)["once"] == 1, timeout_s=30), consumer.output()
    finally:
        assert consumer.stop() == 0, consumer.output()
    attempts = sorted(a for mid, a, kind, _ in events(ledger) if kind == "attempt")
    assert attempts == [1, 2]
    assert broker.depths(vhost, ["dflt.work", "dflt.work.parking"]) == {
        "dflt.work": 0,
        "dflt.work.parking": 0,
    }


def test_explicit_empty_retry_delays_means_no_retries(
    tmp_path: Path, fresh_vhost: Callable[[], str]
) -> None:
    vhost = fresh_vhost()
    path = tmp_path / "none.toml"
    _declare(vhost, path, NO_RETRIES)
    assert broker.queue_names(vhost) == {"dflt.work", "dflt.work.parking"}
    plan = broker.cli("plan", str(path), vhost=vhost)
    assert "dflt.work: no retries (retry_delays = [])" in plan.stdout, plan.stdout

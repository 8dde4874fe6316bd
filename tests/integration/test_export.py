"""`rmqkit export` → `rabbitmqctl import_definitions` yields what `rmqkit declare` yields."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests import broker

pytestmark = [
    pytest.mark.semantics("4.3"),
    pytest.mark.skipif(
        not broker.RABBITMQCTL and shutil.which("rabbitmqctl") is None,
        reason="needs rabbitmqctl for the node under test (RMQKIT_TEST_RABBITMQCTL)",
    ),
]


def _snapshot(vhost: str) -> dict[str, Any]:
    v = broker.q(vhost)
    queues = sorted(
        (
            x["name"],
            x["type"],
            x["durable"],
            x["auto_delete"],
            json.dumps(x["arguments"], sort_keys=True),
        )
        for x in broker.api("GET", f"/queues/{v}").json()
    )
    exchanges = sorted(
        (
            x["name"],
            x["type"],
            x["durable"],
            x["auto_delete"],
            x["internal"],
            json.dumps(x["arguments"], sort_keys=True),
        )
        for x in broker.api("GET", f"/exchanges/{v}").json()
        if x["name"] and not x["name"].startswith("amq.")
    )
    bindings = sorted(
        (x["source"], x["destination"], x["destination_type"], x["routing_key"])
        for x in broker.api("GET", f"/bindings/{v}").json()
        if x["source"]
    )
    policies = sorted(
        (
            x["name"],
            x["pattern"],
            x["apply-to"],
            x["priority"],
            json.dumps(x["definition"], sort_keys=True),
        )
        for x in broker.api("GET", f"/policies/{v}").json()
    )
    return {"queues": queues, "exchanges": exchanges, "bindings": bindings, "policies": policies}


@pytest.mark.parametrize("via", ["policy", "arguments"])
def test_export_imports_to_the_same_objects_as_declare(
    fresh_vhost: Callable[[], str], tmp_path: Path, via: str
) -> None:
    declared, imported = fresh_vhost(), fresh_vhost()
    assert (
        broker.cli("declare", "topologies/orders.toml", "--via", via, vhost=declared).returncode
        == 0
    )

    out = tmp_path / "defs.json"
    result = broker.cli(
        "export", "topologies/orders.toml", "--via", via, "--output", str(out), vhost=imported
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(out.read_text())
    assert {q["vhost"] for q in document["queues"]} == {imported}

    # The node (user rabbitmq) reads the file itself: pytest's tmp dirs are 0700, so copy it
    # somewhere world-readable (3.10's "-" for stdin fails argument validation); for a 4.x node
    # under chroot, scripts/broker-ctl copies it into the root.
    with tempfile.NamedTemporaryFile("w", suffix=".json", dir="/tmp", delete=False) as copy:
        copy.write(out.read_text())
    os.chmod(copy.name, 0o644)
    try:
        imported_run = broker.rabbitmqctl("import_definitions", copy.name, timeout=120)
    finally:
        os.unlink(copy.name)
    assert imported_run.returncode == 0, imported_run.stdout + imported_run.stderr
    # The import is asynchronous ("can take some time"): poll until it has landed.
    expected = _snapshot(declared)
    broker.wait_for(lambda: _snapshot(imported) == expected, timeout_s=30)
    assert _snapshot(imported) == expected
    assert len(_snapshot(imported)["queues"]) == 22
    # And rmqkit agrees that the imported vhost is in sync with the file.
    plan = broker.cli("plan", "topologies/orders.toml", "--via", via, vhost=imported)
    assert plan.returncode == 0, plan.stdout + plan.stderr


def test_export_to_stdout_asks_the_broker_version(vhost: str) -> None:
    result = broker.cli("export", "topologies/orders.toml", vhost=vhost)
    assert result.returncode == 0
    major, minor = broker.version()
    assert json.loads(result.stdout)["rabbit_version"].startswith(f"{major}.{minor}.")
    offline = broker.cli(
        "export",
        "topologies/orders.toml",
        "--broker-version",
        "4.1",
        env={"RMQKIT_URL": "amqp://guest:guest@127.0.0.1:5999/"},
    )
    parking = next(
        q
        for q in json.loads(offline.stdout)["policies"]
        if q["name"] == "rmqkit.orders.work.parking"
    )
    assert parking["definition"]["delivery-limit"] == -1

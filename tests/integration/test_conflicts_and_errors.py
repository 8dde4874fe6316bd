"""Conflicts, bad input and broker failures: clear one-line errors and documented exit codes."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import broker

pytestmark = pytest.mark.semantics("4.3")


def _objects(vhost: str) -> tuple[set[str], list[object], set[str]]:
    queues = broker.queue_names(vhost)
    policies = broker.api("GET", f"/policies/{broker.q(vhost)}").json()
    exchanges = {e["name"] for e in broker.api("GET", f"/exchanges/{broker.q(vhost)}").json()}
    return queues, policies, exchanges


def _declare_raw(vhost: str, name: str, arguments: dict[str, object]) -> None:
    body = {"durable": True, "auto_delete": False, "arguments": arguments}
    broker.api("PUT", f"/queues/{broker.q(vhost)}/{broker.q(name)}", json=body).raise_for_status()


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({}, "exists as a classic queue"),
        (
            {"x-queue-type": "quorum", "x-dead-letter-exchange": "elsewhere"},
            "dead-letter-exchange would be 'elsewhere'",
        ),
    ],
    ids=["classic", "dlx-argument"],
)
def test_conflicting_queue_stops_declare_before_any_change(
    fresh_vhost: Callable[[], str], arguments: dict[str, object], expected: str
) -> None:
    vhost = fresh_vhost()
    _declare_raw(vhost, "orders.work", arguments)
    before = _objects(vhost)

    plan = broker.cli("plan", "topologies/orders.toml", vhost=vhost)
    assert plan.returncode == 65, plan.stdout + plan.stderr
    assert expected in plan.stdout and "fix:" in plan.stdout

    declare = broker.cli("declare", "topologies/orders.toml", vhost=vhost)
    assert declare.returncode == 65
    lines = declare.stderr.strip().splitlines()
    assert len(lines) == 1, declare.stderr
    assert lines[0].startswith("rmqkit: error: topologies/orders.toml: queue 'orders.work'")
    assert expected in lines[0] and "fix:" in lines[0] and "nothing was changed" in lines[0]
    assert _objects(vhost) == before  # no queue, policy or exchange was created


def test_a_shadowing_policy_is_named_with_the_fix(fresh_vhost: Callable[[], str]) -> None:
    vhost = fresh_vhost()
    policy = {
        "pattern": "^orders",
        "definition": {"max-length": 5},
        "priority": 99,
        "apply-to": "queues",
    }
    broker.api("PUT", f"/policies/{broker.q(vhost)}/ops-cap", json=policy).raise_for_status()
    plan = broker.cli("plan", "topologies/orders.toml", "--json", vhost=vhost)
    assert plan.returncode == 65
    conflicts = [c for c in json.loads(plan.stdout)["changes"] if c["action"] == "conflict"]
    assert len(conflicts) == 22
    assert "'ops-cap' (priority 99)" in conflicts[0]["detail"]
    assert "policy_priority" in conflicts[0]["fix"]
    assert broker.cli("declare", "topologies/orders.toml", vhost=vhost).returncode == 65
    assert broker.queue_names(vhost) == set()


def test_arguments_mode_conflict_is_the_broker_406(fresh_vhost: Callable[[], str]) -> None:
    vhost = fresh_vhost()
    assert (
        broker.cli(
            "declare", "topologies/orders.toml", "--via", "arguments", vhost=vhost
        ).returncode
        == 0
    )
    changed = Path("topologies/orders.toml").read_text().replace("= 10 ", "= 11 ")
    Path(vhost + ".toml").write_text(changed)
    try:
        result = broker.cli("plan", vhost + ".toml", "--via", "arguments", vhost=vhost)
        assert result.returncode == 65
        assert "x-delivery-limit is 10 on the broker, 11 in the file" in result.stdout
        assert "406" in result.stdout
    finally:
        Path(vhost + ".toml").unlink()


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('[queues."orders.work"\n', "bad.toml:1: malformed TOML"),
        (
            '[queues."orders.work"]\nretry_delay = ["1s"]\n',
            'bad.toml:2: queues."orders.work".retry_delay: unknown key',
        ),
        (
            '[queues.w]\nretry_delays = ["5 parsecs"]\n',
            "bad.toml:2: queues.w.retry_delays[0]: bad duration '5 parsecs'",
        ),
        (
            '[queues.w]\nbind = [{ exchange = "ghost" }]\n',
            "bad.toml:2: queues.w.bind[0].exchange: binds to exchange 'ghost'",
        ),
    ],
    ids=["malformed", "unknown-key", "bad-duration", "undeclared-exchange"],
)
def test_bad_topology_files_exit_65_naming_file_and_key(
    tmp_path: Path, text: str, needle: str
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    for command in ("plan", "declare", "export"):
        result = (
            broker.cli(command, str(bad), "--broker-version", "3.10")
            if command == "export"
            else broker.cli(command, str(bad))
        )
        assert result.returncode == 65, (command, result.stderr)
        line = result.stderr.strip()
        assert "\n" not in line and needle in line and str(tmp_path) in line, line


@pytest.mark.timing
def test_broker_down_exits_69_fast_with_the_password_masked() -> None:
    started = time.monotonic()
    result = broker.cli(
        "declare",
        "topologies/orders.toml",
        env={"RMQKIT_URL": "amqp://guest:TopSecret@127.0.0.1:5999/"},
    )
    assert result.returncode == 69
    assert time.monotonic() - started < 10
    assert "TopSecret" not in result.stderr + result.stdout
    assert "amqp://guest:***@127.0.0.1:5999/" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_wrong_password_exits_77(vhost: str) -> None:
    url = broker.BASE_URL.replace("guest:guest", "guest:wrong").rstrip("/") + "/" + broker.q(vhost)
    result = broker.cli("plan", "topologies/orders.toml", env={"RMQKIT_URL": url})
    assert result.returncode == 77
    assert "refused the login" in result.stderr and "wrong" not in result.stderr


def test_unknown_vhost_exits_77_with_the_fix() -> None:
    result = broker.cli("plan", "topologies/orders.toml", vhost="no-such-vhost-here")
    assert result.returncode == 77
    assert "no-such-vhost-here" in result.stderr


def test_bad_url_is_a_configuration_error_78() -> None:
    result = broker.cli("config", env={"RMQKIT_URL": "http://nope"})
    assert result.returncode == 78
    assert result.stderr.startswith("rmqkit: error: RMQKIT_URL")


def test_config_masks_secrets() -> None:
    # No broker is reached: host "h", no port (the management URL is derived: 15672).
    result = broker.cli("--url", "amqp://bob:hunter2@h/v", "config", "--json")
    assert result.returncode == 0
    shown = json.loads(result.stdout)
    assert "hunter2" not in result.stdout
    assert shown["url"] == "amqp://bob:***@h/v"
    assert shown["management_url"] == "http://bob:***@h:15672"


def test_usage_errors_exit_64_and_version_prints() -> None:
    assert broker.cli("plan", "--no-such-flag").returncode == 64
    assert broker.cli("declare", "x.toml", "--via", "nope").returncode == 64
    version = broker.cli("--version")
    assert version.returncode == 0 and version.stdout.startswith("rmqkit ")

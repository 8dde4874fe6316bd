"""`rmqkit declare` against the real broker: objects, wiring, idempotence, changes in place."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import broker

pytestmark = pytest.mark.semantics("4.0")

WORK = "orders.work"
PARKING = "orders.work.parking"
WAIT_1S = "orders.work.wait.1s"


def _effective(vhost: str, name: str) -> dict[str, object]:
    def ready() -> dict[str, object] | None:
        queue = broker.mgmt_queue(vhost, name)
        if queue and queue.get("policy") == f"rmqkit.{name}":
            return dict(queue.get("effective_policy_definition") or {})
        return None

    found = broker.wait_for(ready)
    assert found is not None, f"policy never took effect on {name}"
    return found


@pytest.fixture(scope="module")
def declared(vhost: str) -> str:
    result = broker.cli("declare", "topologies/orders.toml", vhost=vhost)
    assert result.returncode == 0, result.stderr
    return vhost


def test_declare_creates_every_object_with_its_settings(declared: str) -> None:
    vhost = declared
    names = broker.queue_names(vhost)
    waits = sorted(n for n in names if n.startswith("orders.work.wait."))
    # 4 tiers x 5 jitter slots; each tier's full-delay queue keeps the plain name.
    assert len(waits) == 20
    for tier in ("1s", "5s", "30s", "2m"):
        assert f"orders.work.wait.{tier}" in names
    assert {WORK, PARKING} <= names

    for name in names:
        queue = broker.mgmt_queue(vhost, name)
        assert queue is not None
        assert queue["type"] == "quorum" and queue["durable"] is True
        assert queue["arguments"] == {"x-queue-type": "quorum"}

    assert _effective(vhost, WORK) == {
        "dead-letter-exchange": "",
        "dead-letter-routing-key": PARKING,
        "dead-letter-strategy": "at-least-once",
        "overflow": "reject-publish",
        "delivery-limit": 10,
        "max-length": 100000,
    }
    assert _effective(vhost, WAIT_1S) == {
        "message-ttl": 1000,
        "dead-letter-exchange": "",
        "dead-letter-routing-key": WORK,
        "dead-letter-strategy": "at-least-once",
        "overflow": "reject-publish",
    }
    slot = _effective(vhost, "orders.work.wait.1s.slot-500ms")
    assert slot["message-ttl"] == 500 and slot["dead-letter-routing-key"] == WORK
    parking = _effective(vhost, PARKING)
    assert "message-ttl" not in parking
    # Version difference: a parking queue must have no delivery limit (browsing returns
    # messages). 3.x has none by default and rejects -1; 4.0+ defaults to 20, so rmqkit says -1.
    assert parking.get("delivery-limit") == (-1 if broker.version() >= (4, 0) else None)
    assert "dead-letter-exchange" not in parking

    exchange = broker.api("GET", f"/exchanges/{broker.q(vhost)}/orders").json()
    assert exchange["type"] == "topic" and exchange["durable"] is True
    bindings = broker.api("GET", f"/bindings/{broker.q(vhost)}").json()
    ours = [(b["source"], b["destination"], b["routing_key"]) for b in bindings if b["source"]]
    assert ours == [("orders", WORK, "order.*")]


@pytest.mark.timing
def test_messages_flow_through_the_wiring(declared: str) -> None:
    vhost = declared
    all_queues = broker.queue_names(vhost)
    broker.publish(vhost, "orders", "order.created", [b'{"id": 1}'])
    counts = broker.depths(vhost, all_queues)
    assert counts[WORK] == 1 and sum(v or 0 for v in counts.values()) == 1

    # Rejected without requeue → dead-lettered (at-least-once) into parking.
    assert broker.reject_one(vhost, WORK)
    assert broker.wait_for(lambda: broker.depths(vhost, [PARKING])[PARKING] == 1)
    counts = broker.depths(vhost, all_queues)
    assert counts[PARKING] == 1 and sum(v or 0 for v in counts.values()) == 1

    # A copy in the 1 s wait queue comes back to the work queue, and to no other queue.
    started = time.monotonic()
    broker.publish(vhost, "", WAIT_1S, [b'{"id": 2}'])
    assert broker.wait_for(lambda: broker.depths(vhost, [WORK])[WORK] == 1, interval_s=0.05)
    elapsed = time.monotonic() - started
    assert 0.8 <= elapsed <= 3.0, elapsed
    counts = broker.depths(vhost, all_queues)
    assert counts[WORK] == 1 and counts[PARKING] == 1
    assert sum(v or 0 for v in counts.values()) == 2


def test_second_declare_is_a_noop_and_plan_is_in_sync(declared: str) -> None:
    again = broker.cli("declare", "topologies/orders.toml", vhost=declared)
    assert again.returncode == 0, again.stderr
    assert "No changes" in again.stdout
    plan = broker.cli("plan", "topologies/orders.toml", "--json", vhost=declared)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    summary = json.loads(plan.stdout)["summary"]
    assert summary["create"] == summary["change"] == summary["conflict"] == 0
    assert summary["in-sync"] == 46


def test_plan_on_an_empty_vhost_reports_pending_with_exit_2(
    fresh_vhost: Callable[[], str],
) -> None:
    vhost = fresh_vhost()
    plan = broker.cli("plan", "topologies/orders.toml", "--json", vhost=vhost)
    assert plan.returncode == 2, plan.stderr
    data = json.loads(plan.stdout)
    assert data["summary"]["create"] == 46
    dry = broker.cli("declare", "topologies/orders.toml", "--dry-run", vhost=vhost)
    assert dry.returncode == 0 and "Would apply" in dry.stdout
    assert broker.queue_names(vhost) == set()
    assert broker.api("GET", f"/policies/{broker.q(vhost)}").json() == []


def test_changing_delay_limit_and_length_applies_in_place(
    fresh_vhost: Callable[[], str], orders_file: Path, tmp_path: Path
) -> None:
    vhost = fresh_vhost()
    assert broker.cli("declare", str(orders_file), vhost=vhost).returncode == 0
    broker.publish(vhost, "orders", "order.created", [b"a", b"b", b"c"])
    broker.publish(vhost, "", "orders.work.wait.2m", [b"waiting"])

    changed = orders_file.read_text().replace('"2m"]', '"3m"]')
    changed = changed.replace("delivery_limit = 10", "delivery_limit = 12")
    changed = changed.replace("max_length = 100000", "max_length = 50000")
    edited = tmp_path / "orders.toml"
    edited.write_text(changed)

    plan = broker.cli("plan", str(edited), "--json", vhost=vhost)
    assert plan.returncode == 2, plan.stderr
    actions = {(c["kind"], c["name"]): c["action"] for c in json.loads(plan.stdout)["changes"]}
    assert actions[("policy", "rmqkit.orders.work")] == "change"
    assert actions[("queue", "orders.work.wait.3m")] == "create"
    assert actions[("queue", "orders.work.wait.2m")] == "orphan"

    result = broker.cli("declare", str(edited), vhost=vhost)
    assert result.returncode == 0, result.stderr
    assert "orders.work.wait.2m" in result.stderr  # the orphan is pointed out

    # Not deleted and recreated: the messages are still there; the new settings are in force.
    assert broker.depths(vhost, [WORK])[WORK] == 3
    assert broker.wait_for(
        lambda: (
            _effective(vhost, WORK).get("delivery-limit") == 12
            and _effective(vhost, WORK).get("max-length") == 50000
        )
    )
    assert _effective(vhost, "orders.work.wait.3m")["message-ttl"] == 180000
    # The old tier's queue is left in place with its message, still wired back to work.
    assert broker.depths(vhost, ["orders.work.wait.2m"])["orders.work.wait.2m"] == 1
    assert _effective(vhost, "orders.work.wait.2m")["dead-letter-routing-key"] == WORK
    again = broker.cli("declare", str(edited), vhost=vhost)
    assert again.returncode == 0 and "No changes" in again.stdout


def test_via_arguments_puts_settings_in_x_arguments(fresh_vhost: Callable[[], str]) -> None:
    vhost = fresh_vhost()
    result = broker.cli("declare", "topologies/orders.toml", "--via", "arguments", vhost=vhost)
    assert result.returncode == 0, result.stderr
    work = broker.mgmt_queue(vhost, WORK)
    assert work is not None
    assert work["arguments"] == {
        "x-queue-type": "quorum",
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": PARKING,
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
        "x-delivery-limit": 10,
        "x-max-length": 100000,
    }
    assert broker.api("GET", f"/policies/{broker.q(vhost)}").json() == []
    again = broker.cli("declare", "topologies/orders.toml", "--via", "arguments", vhost=vhost)
    assert again.returncode == 0 and "No changes" in again.stdout
    # The wiring works the same way.
    broker.publish(vhost, "orders", "order.created", [b"x"])
    assert broker.reject_one(vhost, WORK)
    assert broker.wait_for(lambda: broker.depths(vhost, [PARKING])[PARKING] == 1)

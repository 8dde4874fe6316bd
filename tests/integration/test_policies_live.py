"""The policy resolver (``rmqkit.broker.policies``) against what the broker itself reports.

Each row declares a queue with x-arguments, a user policy and an operator policy (each matching
only that queue), then compares the resolver's answer, worked out from the management API's
lists as doctor and plan do, with the broker's ``effective_policy_definition`` (its merge of
policy and operator policy) and, on 4.x, with the ``delivery_limit`` the queue reports (the limit
it enforces: ``unlimited`` for none). Rows run on the versions whose broker accepts them (3.x
rejects -1 in a policy, overflow in an operator policy and consumer-timeout in any policy).

Old code (7cb9a46): this module cannot import ``rmqkit.broker.policies``; the rows whose rules
the old code got wrong are in tests/unit (test_plan.py, test_doctor_checks.py), and
``test_an_operator_delivery_limit_on_a_parking_queue_is_refused`` runs on old code too (the
old browse check ignored operator policies and browsed the queue: exit 0, not 65).
"""

from __future__ import annotations

from typing import Any

import pytest

from rmqkit.broker.amqp import parse_version
from rmqkit.broker.policies import resolve_queue
from tests import broker

pytestmark = pytest.mark.semantics("4.0")

# id, minimum (major, minor), queue type, arguments, policy, operator policy
ROWS: list[tuple[str, tuple[int, int], str, dict[str, Any], dict[str, Any], dict[str, Any]]] = [
    ("ttl-lowest", (3, 10), "quorum", {"x-message-ttl": 1000}, {"message-ttl": 500},
     {"message-ttl": 300}),
    ("length-argument", (3, 10), "classic", {"x-max-length": 5}, {"max-length": 10},
     {"max-length": 20}),
    ("limit-lowest", (3, 10), "quorum", {"x-delivery-limit": 7}, {"delivery-limit": 4},
     {"delivery-limit": 6}),
    ("dlx-argument", (3, 10), "quorum", {"x-dead-letter-exchange": "a"},
     {"dead-letter-exchange": "b", "dead-letter-routing-key": "k"}, {}),
    ("overflow-quorum", (3, 10), "quorum", {"x-overflow": "reject-publish"},
     {"overflow": "drop-head"}, {}),
    ("overflow-classic", (3, 10), "classic", {"x-overflow": "reject-publish"},
     {"overflow": "drop-head"}, {}),
    ("no-limit", (3, 10), "quorum", {}, {}, {}),
    ("arg-minus-one", (4, 0), "quorum", {"x-delivery-limit": -1}, {"delivery-limit": 5}, {}),
    ("policy-minus-one", (4, 0), "quorum", {}, {"delivery-limit": -1}, {"delivery-limit": 5}),
    ("operator-minus-one", (4, 0), "quorum", {}, {"delivery-limit": 5}, {"delivery-limit": -1}),
    ("arg-beats-minus-one", (4, 0), "quorum", {"x-delivery-limit": 3}, {"delivery-limit": -1},
     {"delivery-limit": 5}),
    ("only-minus-one", (4, 0), "quorum", {}, {"delivery-limit": -1}, {}),
    ("operator-overflow", (4, 0), "quorum", {"x-overflow": "reject-publish"},
     {"overflow": "drop-head"}, {"overflow": "reject-publish"}),
]  # fmt: skip


def _put_policy(kind: str, vhost: str, name: str, queue: str, definition: dict[str, Any]) -> None:
    body = {
        "pattern": f"^{queue.replace('.', '[.]')}$",
        "definition": definition,
        "priority": 5,
        "apply-to": "queues",
    }
    broker.api("PUT", f"/{kind}/{broker.q(vhost)}/{broker.q(name)}", json=body).raise_for_status()


def _lists(vhost: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    v = broker.q(vhost)
    return (
        broker.api("GET", f"/policies/{v}").json(),
        broker.api("GET", f"/operator-policies/{v}").json(),
    )


def _version() -> tuple[int, int, int]:
    return parse_version(str(broker.api("GET", "/overview").json()["rabbitmq_version"]))


@pytest.mark.parametrize(
    ("minimum", "qtype", "arguments", "policy", "operator"),
    [row[1:] for row in ROWS],
    ids=[row[0] for row in ROWS],
)
def test_resolver_matches_the_broker(
    vhost: str,
    request: pytest.FixtureRequest,
    minimum: tuple[int, int],
    qtype: str,
    arguments: dict[str, Any],
    policy: dict[str, Any],
    operator: dict[str, Any],
) -> None:
    if broker.version() < minimum:
        pytest.skip(f"the broker rejects this row before {minimum[0]}.{minimum[1]}")
    name = "q." + request.node.callspec.id
    if policy:
        _put_policy("policies", vhost, "p." + name, name, policy)
    if operator:
        _put_policy("operator-policies", vhost, "op." + name, name, operator)
    body = {"durable": True, "arguments": {"x-queue-type": qtype, **arguments}}
    path = f"/queues/{broker.q(vhost)}/{broker.q(name)}"
    broker.api("PUT", path, json=body).raise_for_status()
    v4 = broker.version() >= (4, 0)

    def reported() -> dict[str, Any] | None:
        # Wait until the queue shows its policies (and, on 4.x quorum, its enforced limit).
        found = broker.mgmt_queue(vhost, name)
        if found is None or ((policy or operator) and not found.get("effective_policy_definition")):
            return None
        if v4 and qtype == "quorum" and found.get("delivery_limit") is None:
            return None
        return found

    raw = broker.wait_for(reported, timeout_s=30)
    assert raw is not None, "the management API never showed the queue with its policies"
    policies, operators = _lists(vhost)
    found = resolve_queue(raw, policies, operators, _version())
    # The broker's merge of policy and operator policy, for keys no argument sets.
    merged = raw.get("effective_policy_definition") or {}
    for key, value in merged.items():
        if "x-" + key not in arguments:
            assert found.settings.get(key) == value, (key, found.settings, merged)
    if v4 and qtype == "quorum":
        limit = raw["delivery_limit"]
        assert found.delivery_limit == (None if limit == "unlimited" else limit), raw
    if qtype == "quorum" and "overflow" in policy and "x-overflow" in arguments:
        assert found.settings["overflow"] == merged["overflow"]  # the policy wins on quorum
    if qtype == "classic" and "x-overflow" in arguments:
        assert found.settings["overflow"] == arguments["x-overflow"]


def test_the_message_ttl_in_effect_is_applied(vhost: str) -> None:
    """Argument 60 s, policy 60 s, operator policy 300 ms: the resolver says 300 ms (the
    operator's) and the broker drops the message that soon (a classic queue expires it by
    timer; passive-declare counts are immediate)."""
    name = "ttl.behaviour"
    _put_policy("policies", vhost, "p." + name, name, {"message-ttl": 60_000})
    _put_policy("operator-policies", vhost, "op." + name, name, {"message-ttl": 300})
    body = {"durable": True, "arguments": {"x-queue-type": "classic", "x-message-ttl": 60_000}}
    broker.api("PUT", f"/queues/{broker.q(vhost)}/{name}", json=body).raise_for_status()
    raw = broker.wait_for(
        lambda: (q := broker.mgmt_queue(vhost, name)) and q.get("operator_policy") and q,
        timeout_s=30,
    )
    assert raw
    policies, operators = _lists(vhost)
    found = resolve_queue(raw, policies, operators, _version())
    assert found.settings["message-ttl"] == 300
    assert found.sources["message-ttl"] == f"operator policy 'op.{name}'"
    broker.publish(vhost, "", name, [b"x"])
    # Gone within 1.5 s (polled: no need to wait the whole of it), not the 60 s of the others.
    assert broker.wait_for(
        lambda: broker.depths(vhost, [name])[name] == 0, timeout_s=1.5, interval_s=0.1
    )


def test_an_operator_delivery_limit_on_a_parking_queue_is_refused(vhost: str) -> None:
    """A parking queue whose only limit comes from an operator policy: browsing it spends
    attempts, so every parking command refuses it (exit 65) and the message stays. The old
    check read only the argument and the user policy and browsed it."""
    name = "capped.parking"
    _put_policy("operator-policies", vhost, "op." + name, name, {"delivery-limit": 5})
    body = {"durable": True, "arguments": {"x-queue-type": "quorum", **broker.no_delivery_limit()}}
    broker.api("PUT", f"/queues/{broker.q(vhost)}/{name}", json=body).raise_for_status()
    broker.publish(vhost, "", name, [b"x"])
    result = broker.cli("parking", "list", name, vhost=vhost)
    assert result.returncode == 65, result.stderr
    line = result.stderr.strip()
    assert "delivery limit of 5" in line and f"operator policy 'op.{name}'" in line, line
    assert broker.depths(vhost, [name])[name] == 1

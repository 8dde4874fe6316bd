"""Fix hints that are right (issue 14's trial): a hint is pasted at 3 a.m. as it is printed.

- A work queue named as a parking queue got a `rabbitmqctl set_policy` for it (its delivery
  limit), with no ``-p VHOST``, a regex that matched nothing (``\\\\.``), and a policy that would
  replace rmqkit's own (dead-letter wiring gone): now "this is a work queue, did you mean
  X.parking?".
- A parking queue with a delivery limit from a user policy: the hint names the vhost, matches
  exactly the queue, keeps what the policy in effect sets, and works when run as printed.
- `plan`'s orphan hints name the vhost.

On the code before the fix (19871ec) every test here fails.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from rmqkit.topology import load_topology
from rmqkit.topology.apply import declare_topology
from tests import broker

pytestmark = pytest.mark.semantics("4.3")

TOPOLOGY = """
[queues."hw.work"]
retry_delays = ["1s", "5s"]
"""


@pytest.fixture(scope="module")
def declared(vhost: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    path = tmp_path_factory.mktemp("hints") / "hints.toml"
    path.write_text(TOPOLOGY, encoding="utf-8")
    broker.run(declare_topology(broker.settings_for(vhost), load_topology(path)))
    return vhost, path


def test_a_work_queue_named_as_a_parking_queue_asks_did_you_mean(
    declared: tuple[str, Path],
) -> None:
    vhost, _ = declared
    broker.publish(vhost, "", "hw.work", [b"waiting for its consumer"])
    for command in ("list", "stats"):
        result = broker.cli("parking", command, "hw.work", vhost=vhost)
        assert result.returncode == 65, result.stderr
        assert "'hw.work' is a work queue" in result.stderr
        assert "did you mean 'hw.work.parking'?" in result.stderr
        assert "set_policy" not in result.stderr
    assert broker.depths(vhost, ["hw.work"]) == {"hw.work": 1}


def test_the_delivery_limit_hint_is_vhost_aware_exact_and_keeps_the_policy(vhost: str) -> None:
    name = "team.hint.parking"
    policy = {
        "pattern": r"^team\.",
        "definition": {"delivery-limit": 3, "max-length": 1000},
        "priority": 5,
        "apply-to": "queues",
    }
    broker.api("PUT", f"/policies/{broker.q(vhost)}/team", json=policy).raise_for_status()
    body = {"durable": True, "arguments": {"x-queue-type": "quorum", **broker.no_delivery_limit()}}
    broker.api("PUT", f"/queues/{broker.q(vhost)}/{name}", json=body).raise_for_status()
    broker.publish(vhost, "", name, [b"parked"])
    refused = broker.cli("parking", "list", name, vhost=vhost)
    assert refused.returncode == 65, refused.stderr
    # A user policy is in effect: `rmqkit declare` is no fix for it, so it is not offered.
    assert "rmqkit declare" not in refused.stderr, refused.stderr
    lead = "fix: policy 'team' (priority 5), not rmqkit's, is in effect: rabbitmqctl "
    assert lead in refused.stderr, refused.stderr
    assert refused.stderr.rstrip().endswith(CHANGE_IT.format(name="team")), refused.stderr
    args = pasted_policy(refused.stderr, lead)
    assert args[:3] == ["set_policy", "-p", vhost], args
    assert args[4] == r"^team\.hint\.parking$" and not args[3].startswith("rmqkit.")
    assert json.loads(args[5])["max-length"] == 1000
    applied = broker.rabbitmqctl(*args)  # as printed
    assert applied.returncode == 0, applied.stderr

    def effective() -> dict[str, object] | None:
        queue = broker.mgmt_queue(vhost, name) or {}
        found = queue.get("effective_policy_definition") or {}
        return found if found.get("max-length") == 1000 and queue.get("policy") == args[3] else None

    assert broker.wait_for(effective), broker.mgmt_queue(vhost, name)
    listed = broker.cli("parking", "list", name, "--json", vhost=vhost)
    assert listed.returncode == 0, listed.stderr
    assert len(listed.stdout.splitlines()) == 1
    assert broker.depths(vhost, [name]) == {name: 1}


CHANGE_IT = (
    "(keeps what policy '{name}' sets), or change policy '{name}' itself to leave this queue "
    "out (its pattern) or set no delivery-limit (rabbitmqctl set_policy, or the management "
    "UI's Admin > Policies)"
)


def pasted_policy(stderr: str, lead: str) -> list[str]:
    """The `rabbitmqctl set_policy …` arguments the hint after ``lead`` prints."""
    return ["set_policy", *shlex.split(stderr.split(lead, 1)[1].split(" (keeps", 1)[0])[1:]]


def test_a_policy_outranking_rmqkits_gets_no_declare_hint(vhost: str, tmp_path: Path) -> None:
    """The limit comes from a user policy above rmqkit's own parking policy: the hint said
    "`rmqkit declare` your topology file", and declare then refused (exit 65). Now it names
    both policies and offers what works, and what it prints does work."""
    path = tmp_path / "outranked.toml"
    path.write_text('[queues."ranked.work"]\nretry_delays = ["1s"]\n', encoding="utf-8")
    declared = broker.cli("declare", str(path), vhost=vhost)
    assert declared.returncode == 0, declared.stderr
    policy = {
        "pattern": r"^ranked\.work\.parking$",
        "definition": {"delivery-limit": 2, "max-length": 500},
        "priority": 50,
        "apply-to": "queues",
    }
    broker.api("PUT", f"/policies/{broker.q(vhost)}/ops-cap", json=policy).raise_for_status()
    broker.publish(vhost, "", "ranked.work.parking", [b"parked"])
    name = "ranked.work.parking"

    def refused_now() -> subprocess.CompletedProcess[str] | None:
        done = broker.cli("parking", "list", name, vhost=vhost)
        return done if done.returncode == 65 and "ops-cap" in done.stderr else None

    refused = broker.wait_for(refused_now)
    assert refused, "the policy never took effect"
    lead = (
        "fix: policy 'ops-cap' (priority 50) outranks rmqkit's 'rmqkit.ranked.work.parking' "
        "(priority 10), so `rmqkit declare` refuses this queue (exit 65): rabbitmqctl "
    )
    assert lead in refused.stderr, refused.stderr
    assert "`rmqkit declare` the topology" not in refused.stderr
    assert refused.stderr.rstrip().endswith(CHANGE_IT.format(name="ops-cap")), refused.stderr
    # What the hint says of declare is so.
    again = broker.cli("declare", str(path), vhost=vhost)
    assert again.returncode == 65, (again.returncode, again.stdout, again.stderr)
    args = pasted_policy(refused.stderr, lead)
    assert args[3:5] == ["no-delivery-limit.ranked.work.parking", r"^ranked\.work\.parking$"]
    assert args[-1] == "51"
    applied = broker.rabbitmqctl(*args)
    assert applied.returncode == 0, applied.stderr

    def listed() -> subprocess.CompletedProcess[str] | None:
        done = broker.cli("parking", "list", name, "--json", vhost=vhost)
        return done if done.returncode == 0 else None

    shown = broker.wait_for(listed)
    assert shown and len(shown.stdout.splitlines()) == 1, shown
    assert broker.depths(vhost, [name]) == {name: 1}


def test_plan_orphan_hints_name_the_vhost(declared: tuple[str, Path], tmp_path: Path) -> None:
    vhost, _ = declared
    smaller = tmp_path / "smaller.toml"
    smaller.write_text('[queues."hw.work"]\nretry_delays = ["1s"]\n', encoding="utf-8")
    result = broker.cli("plan", str(smaller), vhost=vhost)
    assert f"rabbitmqctl delete_queue -p {vhost} hw.work.wait.5s" in result.stdout, result.stdout
    assert f"rabbitmqctl clear_policy -p {vhost} rmqkit.hw.work.wait.5s" in result.stdout

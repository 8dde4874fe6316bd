"""`rmqkit status` with flow control (issue 15), on the real broker: delayed messages are their
own state (a shared delay ladder in total, a work queue's own ladder in its group), the rungs
are not unknown queues, and lane ("W.lane.x") and partition ("W.pI") queues are grouped under
their work queue.

The queues are made the way the topology names them (lanes and partitions dead-letter into the
parent's parking queue) through the management API, and the ladders with ``rmqkit.delay``, so
the test does not depend on how a topology file is expanded.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from rmqkit.broker.session import session
from rmqkit.delay import Ladder, declare_ladder
from tests import broker

SHARED = Ladder(prefix="rmqkit.delay", unit_ms=1000, bits=8)  # 1 s units, up to 255 s
OWN = Ladder(prefix="sf.work.delay", unit_ms=1000, bits=8)  # sf.work's own ladder
WORK_QUEUES = {
    "sf.work": "sf.work.parking",
    "sf.work.lane.large": "sf.work.parking",
    "sf.part.p0": "sf.part.parking",
    "sf.part.p1": "sf.part.parking",
}


def _queue(vhost: str, name: str, arguments: dict[str, Any]) -> None:
    broker.api(
        "PUT",
        f"/queues/{broker.q(vhost)}/{name}",
        json={"durable": True, "arguments": {"x-queue-type": "quorum", **arguments}},
    ).raise_for_status()


@pytest.fixture(scope="module")
def flow(vhost: str) -> str:
    for parking in set(WORK_QUEUES.values()):
        _queue(vhost, parking, {})
    for name, parking in WORK_QUEUES.items():
        dlx = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": parking}
        _queue(vhost, name, dlx)
        _queue(vhost, f"{name}.wait.1s", {"x-message-ttl": 1000, **_back(name)})

    async def ladders() -> None:
        async with session(broker.settings_for(vhost)) as s:
            await declare_ladder(s, SHARED, targets=[("", "sf.part.p0")])
            await declare_ladder(s, OWN, targets=[("", "sf.work")])

    broker.run(ladders())
    shared = SHARED.plan(200_000, "", "sf.part.p0")
    own = OWN.plan(150_000, "", "sf.work")
    broker.publish(vhost, shared.exchange, shared.routing_key, [b"{}"] * 3, shared.headers)
    broker.publish(vhost, own.exchange, own.routing_key, [b"{}"] * 2, own.headers)
    broker.publish(vhost, "", "sf.work.lane.large", [b"{}"] * 4)
    broker.publish(vhost, "", "sf.part.p1", [b"{}"] * 1)
    return vhost


def _back(work: str) -> dict[str, Any]:
    return {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": work}


def _status(vhost: str) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        result = broker.cli("status", "--json", vhost=vhost)
        assert result.returncode == 0, result.stderr
        data: dict[str, Any] = json.loads(result.stdout)
        # management statistics lag by up to ~5 s
        return data if data["delayed"]["total"] == 5 and _group(data, "sf.work")["ready"] else None

    return broker.wait_for(ready, timeout_s=30, interval_s=1)


def _group(data: dict[str, Any], work: str) -> dict[str, Any]:
    return next(g for g in data["groups"] if g["work"] == work)


def test_delayed_messages_are_their_own_state(flow: str) -> None:
    data = _status(flow)
    delayed = data["delayed"]
    assert delayed["waiting"] == 5 and delayed["stuck"] == 0
    ladders = {ladder["ladder"]: ladder for ladder in delayed["ladders"]}
    assert ladders[SHARED.base]["for"] is None and ladders[SHARED.base]["waiting"] == 3
    assert ladders[OWN.base]["for"] == "sf.work" and ladders[OWN.base]["waiting"] == 2
    # 200 s = 128+64+8: the three messages wait in the top rung first
    assert ladders[SHARED.base]["rungs"][SHARED.queue_name(7)]["waiting"] == 3
    assert _group(data, "sf.work")["delayed"] == 2
    assert _group(data, "sf.part")["delayed"] is None
    rungs = set(SHARED.queue_names) | set(OWN.queue_names)
    roles = {q["name"]: (q["role"], q["owner"]) for q in data["queues"]}
    assert {roles[r][0] for r in rungs} == {"delay"}
    assert {roles[r][1] for r in OWN.queue_names} == {"sf.work"}
    assert {roles[r][1] for r in SHARED.queue_names} == {SHARED.base}
    # no rung is taken for a work, wait or unrelated queue, and no group is a rung's
    assert not [g["work"] for g in data["groups"] if g["work"] in rungs]
    assert [n for n, (role, _) in roles.items() if role == "other"] == []


def test_lanes_and_partitions_are_grouped_under_their_work_queue(flow: str) -> None:
    data = _status(flow)
    assert sorted(g["work"] for g in data["groups"]) == ["sf.part", "sf.work"]
    work = _group(data, "sf.work")
    assert work["work_queues"] == ["sf.work", "sf.work.lane.large"]
    assert work["ready"] == 4 and work["parking"] == ["sf.work.parking"]
    assert work["wait_queues"] == 2
    part = _group(data, "sf.part")
    assert part["work_queues"] == ["sf.part.p0", "sf.part.p1"]
    assert part["ready"] == 1 and part["parking"] == ["sf.part.parking"]
    owners = {q["name"]: q["owner"] for q in data["queues"]}
    assert owners["sf.work.lane.large.wait.1s"] == "sf.work"
    assert owners["sf.part.p1.wait.1s"] == "sf.part"


def test_piped_status_shows_a_delayed_row_per_ladder(flow: str) -> None:
    _status(flow)  # the statistics have caught up
    result = broker.cli("status", vhost=flow)
    assert result.returncode == 0, result.stderr
    rows = [line.split("\t") for line in result.stdout.splitlines()[1:]]
    delayed = {row[0]: row for row in rows if row[1] == "delayed"}
    assert delayed[f"{SHARED.base} (8 rungs)"][2] == "3"
    assert delayed[f"{OWN.base} (8 rungs)"][2] == "2"
    names = {row[0] for row in rows}
    assert not names & (set(SHARED.queue_names) | set(OWN.queue_names))  # collapsed
    assert "sf.work.lane.large" in names and "sf.part.p0" in names

"""Failure groups on the real broker: messages parked by the embedded consumer with three
distinct failures (each raised with other ids and amounts) make exactly three groups, counted
by message id; `--group` with `--since` replays exactly that group's messages parked in the
window; a replayed message that fails again is shown as "failed again after replay"."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aio_pika
import pytest

import rmqkit
from rmqkit.settings import Settings
from rmqkit.topology import declare_topology, load_topology
from tests import broker

pytestmark = pytest.mark.semantics("4.3")

TOPOLOGY = """
[exchanges."grp"]
type = "direct"

[queues."grp.work"]
bind = [{ exchange = "grp", routing_key = "job" }]
retry_delays = []
max_attempts = 1
"""
WORK, PARKING = "grp.work", "grp.work.parking"


def charge(job: dict[str, Any]) -> None:
    raise rmqkit.Permanent(f"card declined for order {job['n']}: amount {job['amount']}")


def lookup(job: dict[str, Any]) -> None:
    raise KeyError(f"sku-{job['n']}")


def refund(job: dict[str, Any]) -> None:
    raise ValueError(f"refund of {job['amount']} exceeds {job['n']} for '{job['who']}'")


STEPS = {"charge": charge, "lookup": lookup, "refund": refund}


async def handle(message: rmqkit.Message) -> None:
    job = message.json()
    STEPS[job["step"]](job)


def _publish(vhost: str, jobs: list[dict[str, Any]]) -> dict[str, str]:
    """Publish ``jobs``; their message ids → step."""
    messages = [(uuid.uuid4().hex, json.dumps(job).encode()) for job in jobs]
    broker.publish_with_ids(vhost, "grp", "job", messages)
    return {mid: job["step"] for (mid, _), job in zip(messages, jobs, strict=True)}


def _jobs(count: int, start: int = 0) -> list[dict[str, Any]]:
    steps = list(STEPS)
    return [
        {"step": steps[i % 3], "n": start + i, "amount": f"{(i * 37) % 1000}.{i % 100:02d}",
         "who": f"customer {i}"}
        for i in range(count)
    ]  # fmt: skip


async def _consume_until_parked(settings: Settings, spec: Path, total: int, vhost: str) -> None:
    """Run the embedded consumer until the parking queue holds ``total`` messages."""
    consumer = rmqkit.Consumer(handle, queue=WORK, topology=spec, settings=settings)
    await consumer.start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            depth = (await asyncio.to_thread(broker.depths, vhost, [PARKING]))[PARKING]
            if depth == total:
                return
            await asyncio.sleep(0.2)
        raise AssertionError(f"{PARKING} never held {total} messages")
    finally:
        await consumer.stop(grace_s=5)


def _cli_json(vhost: str, *args: str) -> Any:
    result = broker.cli(*args, vhost=vhost, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def _ids(vhost: str, *filters: str) -> set[str]:
    rows = broker.cli_json_lines("parking", "list", PARKING, "--json", *filters, vhost=vhost)
    return {str(row["message_id"]) for row in rows}


@pytest.mark.parametrize("count", [300, pytest.param(3000, marks=pytest.mark.slow)])
def test_three_failures_make_three_groups_and_a_group_replays_within_a_window(
    vhost: str, tmp_path: Path, count: int
) -> None:
    spec = tmp_path / "grp.toml"
    spec.write_text(TOPOLOGY, encoding="utf-8")
    settings = broker.settings_for(vhost)
    broker.run(declare_topology(settings, load_topology(spec)))
    broker.api("DELETE", f"/queues/{broker.q(vhost)}/{broker.q(PARKING)}/contents")

    first = _publish(vhost, _jobs(count - 30))
    broker.run(_consume_until_parked(settings, spec, count - 30, vhost))
    time.sleep(0.05)
    window = datetime.now(UTC).isoformat()
    time.sleep(0.05)
    second = _publish(vhost, _jobs(30, start=count))
    broker.run(_consume_until_parked(settings, spec, count, vhost))
    step_of = {**first, **second}

    report = _cli_json(vhost, "parking", "groups", PARKING, "--json")
    assert report["matched"] == count
    groups = report["groups"]
    assert len(groups) == 3, [(g["group"], g["count"], g["pattern"]) for g in groups]
    by_frame = {g["frame"]: g for g in groups}
    assert set(by_frame) == {
        "test_parking_groups.py:charge",
        "test_parking_groups.py:lookup",
        "test_parking_groups.py:refund",
    }
    assert by_frame["test_parking_groups.py:charge"]["reason"] == "permanent"
    assert by_frame["test_parking_groups.py:refund"]["reason"] == "exhausted"
    assert by_frame["test_parking_groups.py:refund"]["pattern"] == (
        "refund of <n> exceeds <n> for <str>"
    )
    # counted by message id: each group holds exactly the messages of its step
    for frame, group in by_frame.items():
        step = frame.rsplit(":", 1)[1]
        members = _ids(vhost, "--group", group["group"][:6])
        assert members == {m for m, s in step_of.items() if s == step}
        assert group["count"] == len(members)

    # one group, parked in the window only: exactly those move, the rest stay parked
    refunds = by_frame["test_parking_groups.py:refund"]["group"]
    wanted = {m for m, s in second.items() if s == "refund"}
    assert _ids(vhost, "--group", refunds, "--since", window) == wanted
    replayed = broker.cli(
        "parking", "replay", PARKING, "--group", refunds, "--since", window, vhost=vhost
    )
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    held = broker.depths(vhost, [WORK, PARKING])
    assert held == {WORK: len(wanted), PARKING: count - len(wanted)}, held

    # the fix did not work: they fail again, and the group says so
    broker.run(_consume_until_parked(settings, spec, count, vhost))
    again = _cli_json(vhost, "parking", "groups", PARKING, "--json", "--group", refunds)
    [group] = again["groups"]
    assert group["failed_after_replay"] == len(wanted)
    every_refund = {m for m, s in step_of.items() if s == "refund"}
    assert group["count"] == len(every_refund)

    # --max-replays 1: the ones replayed once already are held back, the others go
    held = _cli_json(
        vhost, "parking", "replay", PARKING, "--group", refunds, "--max-replays", "1", "--json"
    )
    assert (held["replayed"], held["held_back"]) == (len(every_refund - wanted), len(wanted))
    moved = {str(m["message_id"]) for m in broker.drain(vhost, WORK)}
    assert moved == every_refund - wanted
    assert _ids(vhost, "--group", refunds) == wanted
    broker.api("DELETE", f"/queues/{broker.q(vhost)}/{broker.q(PARKING)}/contents")


async def _arrivals(vhost: str, queue: str, count: int) -> list[float]:
    """The monotonic times at which ``count`` messages arrive in ``queue`` (consumed, acked)."""
    conn = await aio_pika.connect(broker.with_vhost(broker.BASE_URL, vhost))
    seen: list[float] = []
    try:
        channel = await conn.channel()
        await channel.set_qos(prefetch_count=100)
        source = await channel.get_queue(queue, ensure=False)
        async with source.iterator() as messages:
            async for message in messages:
                seen.append(time.monotonic())
                await message.ack()
                if len(seen) == count:
                    break
    finally:
        await conn.close()
    return seen


def _park_direct(vhost: str, count: int) -> list[str]:
    """``count`` messages in the parking queue as the consumer parks them (one failure)."""
    now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    headers = {
        "rmqkit-park-reason": "exhausted",
        "rmqkit-error-type": "ValueError",
        "rmqkit-error-message": "refund of 1 exceeds 2",
        "rmqkit-origin-queue": WORK,
        "rmqkit-last-failed-at": now,
        "rmqkit-attempt": 1,
    }
    messages = [(uuid.uuid4().hex, b"{}") for _ in range(count)]
    broker.publish_with_ids(vhost, "", PARKING, messages, headers=lambda _: headers)
    return [m for m, _ in messages]


@pytest.mark.timing
def test_a_group_replays_at_the_rate_asked_and_in_waves(vhost: str, tmp_path: Path) -> None:
    """--rate 20: the copies arrive at 20/s (within 20%); --batch 10 --pause 1s: four waves
    of ten, a pause of at least a second between them."""
    spec = tmp_path / "grp.toml"
    spec.write_text(TOPOLOGY, encoding="utf-8")
    broker.run(declare_topology(broker.settings_for(vhost), load_topology(spec)))
    broker.api("DELETE", f"/queues/{broker.q(vhost)}/{broker.q(PARKING)}/contents")
    broker.api("DELETE", f"/queues/{broker.q(vhost)}/{broker.q(WORK)}/contents")

    ids = _park_direct(vhost, 41)

    async def replay_and_watch(*args: str) -> list[float]:
        watch = asyncio.create_task(_arrivals(vhost, WORK, len(ids)))
        done = await asyncio.to_thread(
            broker.cli, "parking", "replay", PARKING, *args, vhost=vhost, timeout=120
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return await asyncio.wait_for(watch, 60)

    times = broker.run(replay_and_watch("--rate", "20"))
    rate = (len(times) - 1) / (times[-1] - times[0])
    assert 16 <= rate <= 24, rate

    ids = _park_direct(vhost, 40)
    times = broker.run(replay_and_watch("--batch", "10", "--pause", "1s"))
    gaps = sorted((b - a for a, b in itertools.pairwise(times)), reverse=True)
    assert min(gaps[:3]) >= 0.95, gaps[:4]  # the three pauses between four waves
    assert gaps[3] < 0.5, gaps[:4]  # and none within a wave

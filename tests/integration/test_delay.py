"""Delayed delivery through the delay ladder on the real broker (issue 15, seed 002).

The acceptance run is the issue's "1,000 messages with random delays from 1 s to 10 min" scaled
by 1/100: a ladder of 10 ms units, delays of 10 ms … 6 s. Every message is counted by id, its
arrival time recorded, and its error (arrival - publish - delay) must be ≥ 0 (never early) and
within the documented bound (docs/delay.md): less than one unit of rounding plus the broker's
latency, for which the test allows ``LATENCY_MS``. Measured on the shared 2-core test machine
(load average ~4): 3.10.8 max 34-270 ms over 1,000 delays per run (one run of nine went
over 510 ms, hence 1 s), 4.3.6 max 32-161 ms over 300.

Also pinned here, because docs/delay.md builds on them: a quorum rung keeps a due message that
cannot leave (no exit binding) while a classic rung drops it; a message re-delayed with the
x-death of its first trip is dropped by 3.10's dead-letter cycle detection unless that x-death is
stripped (``Ladder.plan`` does); what ``status`` counts while messages wait.

The module takes ~25 s: the acceptance run ~8 s, the 4.3 run ~4 s, the status test ~9 s (the
management API's statistics lag).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import statistics
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from rmqkit.broker.codec import Properties
from rmqkit.broker.session import Session, session
from rmqkit.consumer.attempts import attempt_number
from rmqkit.delay import Ladder, declare_ladder, declare_target, delayed_counts, delivered_route
from rmqkit.errors import DataError
from rmqkit.settings import Settings, load_settings, with_vhost
from tests import broker

pytestmark = pytest.mark.semantics("4.3")

UNIT_MS = 10
LATENCY_MS = 1000  # the broker's hop latency and this process's own, see above
EXCHANGE, WORK, KEY = "orders", "orders.work", "order.created"


@dataclass
class Arrival:
    at: float
    exchange: str
    routing_key: str
    properties: Properties


async def _target(s: Session) -> None:
    """A topic exchange and a quorum work queue bound by pattern: a delayed message must reach
    it by its own routing key, as if published there when due."""
    await s.declare(
        [{"exchange": EXCHANGE, "exchange_type": "topic", "durable": True}],
        [{"queue": WORK, "durable": True, "arguments": {"x-queue-type": "quorum"}}],
        [{"queue": WORK, "exchange": EXCHANGE, "routing_key": "order.#", "label": "work"}],
    )


class Inbox:
    """Deliveries of one queue by message id, consumed and acked as they come."""

    def __init__(self) -> None:
        self.arrivals: dict[str, list[Arrival]] = {}
        self._changed = asyncio.Event()

    async def consume(self, s: Session, queue: str) -> None:
        channel = await s.channel()
        await channel.qos(500)

        async def on_delivery(delivery: Any) -> None:
            props = delivery.header.properties
            self.arrivals.setdefault(props.message_id, []).append(
                Arrival(
                    time.monotonic(),
                    delivery.delivery.exchange,
                    delivery.delivery.routing_key,
                    props,
                )
            )
            self._changed.set()
            await channel.ack(delivery.delivery.delivery_tag)

        await channel.consume(queue, on_delivery)

    async def wait(self, done: Callable[[], bool], timeout_s: float) -> None:
        """Until ``done()`` or ``timeout_s`` (the caller asserts on what arrived)."""
        deadline = time.monotonic() + timeout_s
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)


async def _publish(
    s: Session, ladder: Ladder, delays: Mapping[str, int], *, exchange: str = EXCHANGE
) -> dict[str, float]:
    """Publish one message per id, delayed as asked, paced in batches (a producer, not a
    flood); returns when each was handed to the client (the clock its error is measured on)."""
    channel = await s.channel(confirms=True)
    sent: dict[str, float] = {}
    pending = []
    for i, (message_id, delay) in enumerate(delays.items()):
        plan = ladder.plan(delay, exchange, KEY, {"app-header": f"v-{message_id}"})
        props = Properties(
            message_id=message_id,
            correlation_id=f"c-{message_id}",
            content_type="application/json",
            delivery_mode=2,
            headers=plan.headers,
        )
        sent[message_id] = time.monotonic()
        pending.append(
            await channel.publisher.publish(
                b'{"n": %d}' % i,
                exchange=plan.exchange,
                routing_key=plan.routing_key,
                properties=props,
            )
        )
        if i % 50 == 49:
            await asyncio.sleep(0.05)
    outcomes = await asyncio.gather(*pending)
    assert {o.name for o in outcomes} == {"CONFIRMED"}
    return sent


def _check_trail(ladder: Ladder, headers: Mapping[str, Any]) -> None:
    """The rungs x-death recorded are the set bits of the delay, each entered from the exchange
    of the next higher one (the entry exchange for the highest); the newest is the lowest bit.
    Beyond the newest entry, 3.10.8 does not keep x-death in time order (seen), so the trail is
    checked by its exchanges, not by position."""
    rungs = ladder.route(headers)
    deaths = headers["x-death"]
    came_from = {rung: ladder.entry for rung in rungs[:1]}
    for higher, lower in itertools.pairwise(rungs):
        came_from[lower] = ladder.after(int(higher.rsplit(".", 1)[1][:2]))
    assert {d["queue"]: d["exchange"] for d in deaths} == came_from
    assert {d["reason"] for d in deaths} == {"expired"} and {d["count"] for d in deaths} == {1}
    assert deaths[0]["queue"] == rungs[-1] and headers["x-first-death-queue"] == rungs[0]


async def _acceptance(settings: Settings, count: int, max_delay_ms: int) -> dict[str, Any]:
    ladder = Ladder.for_max_delay(max_delay_ms, prefix="acc", unit_ms=UNIT_MS)
    rng = random.Random(15)
    delays = {
        f"m-{i:04d}-{uuid.uuid4().hex[:6]}": rng.randint(UNIT_MS, max_delay_ms)
        for i in range(count)
    }
    inbox = Inbox()
    arrivals = inbox.arrivals
    async with session(settings) as s:
        await _target(s)
        await declare_ladder(s, ladder, targets=[(EXCHANGE, "")])
        await declare_ladder(s, ladder, targets=[(EXCHANGE, "")])  # idempotent
        await inbox.consume(s, WORK)
        sent = await _publish(s, ladder, delays)
        await inbox.wait(lambda: len(arrivals) >= count, max_delay_ms / 1000 + 10)
        await asyncio.sleep(0.3)  # a duplicate would come now
        left = await delayed_counts(s, ladder)
        work_ready = (await s.queue_depth(WORK)).ready
    assert sorted(arrivals) == sorted(delays), "lost or unknown ids"
    assert [i for i, a in arrivals.items() if len(a) > 1] == [], "duplicates"
    assert sum(left.values()) == 0 and work_ready == 0
    errors = []
    for message_id, [arrival] in arrivals.items():
        error = (arrival.at - sent[message_id]) * 1000 - delays[message_id]
        errors.append((error, message_id))
        props = arrival.properties
        headers: dict[str, Any] = dict(props.headers or {})
        assert props.correlation_id == f"c-{message_id}"
        assert props.content_type == "application/json" and props.delivery_mode == 2
        assert headers["app-header"] == f"v-{message_id}"
        assert props.expiration is None
        assert arrival.routing_key == KEY
        assert arrival.exchange.startswith("acc.10ms.after-")  # the broker names the last hop
        assert delivered_route(arrival.exchange, arrival.routing_key, headers) == (
            EXCHANGE,
            KEY,
        )
        assert attempt_number(headers, WORK, wait_queues=[f"{WORK}.wait.1s"]) == 1
        _check_trail(ladder, headers)
    errors.sort()
    low, high = errors[0], errors[-1]
    summary = {
        "min_ms": round(low[0], 1),
        "median_ms": round(statistics.median(e for e, _ in errors), 1),
        "p99_ms": round(errors[int(len(errors) * 0.99) - 1][0], 1),
        "max_ms": round(high[0], 1),
    }
    print(f"delay error over {count} messages: {summary}")
    assert low[0] >= 0, f"{low[1]} arrived {-low[0]:.1f} ms early ({summary})"
    assert high[0] < UNIT_MS + LATENCY_MS, f"{high[1]} arrived {high[0]:.0f} ms late ({summary})"
    return summary


def test_1000_random_delays_each_arrive_never_early_within_the_bound_none_lost(vhost: str) -> None:
    broker.run(_acceptance(broker.settings_for(vhost), 1000, 6000))


NODE_43_AMQP, NODE_43_MGMT = "amqp://guest:guest@127.0.0.1:5743/", "http://127.0.0.1:15743"


def test_on_the_43_node_too() -> None:
    """The same run, smaller, on RabbitMQ 4.3 (scripts/broker-up --version 4.3), if it is up."""
    if broker.BASE_URL.rstrip("/") == NODE_43_AMQP.rstrip("/"):
        pytest.skip("the suite already runs on the 4.3 node")
    try:
        overview = httpx.get(NODE_43_MGMT + "/api/overview", auth=broker.AUTH, timeout=2)
        overview.raise_for_status()
    except httpx.HTTPError as exc:
        pytest.skip(
            f"the 4.3 node is not up ({type(exc).__name__}; scripts/broker-up --version 4.3)"
        )
    name = f"rmqkit-test-delay43-{uuid.uuid4().hex[:6]}"
    vhost_path = f"{NODE_43_MGMT}/api/vhosts/{broker.q(name)}"
    httpx.put(vhost_path, json={}, auth=broker.AUTH, timeout=10).raise_for_status()
    perms = {"configure": ".*", "write": ".*", "read": ".*"}
    httpx.put(
        f"{NODE_43_MGMT}/api/permissions/{broker.q(name)}/guest",
        json=perms,
        auth=broker.AUTH,
        timeout=10,
    ).raise_for_status()
    try:
        assert str(overview.json()["rabbitmq_version"]).startswith("4.3")
        settings = load_settings(url=with_vhost(NODE_43_AMQP, name), management_url=NODE_43_MGMT)
        broker.run(_acceptance(settings, 300, 3000))
    finally:
        httpx.delete(vhost_path, auth=broker.AUTH, timeout=10)


async def _redelay(settings: Settings, strip: bool) -> int:
    """Deliver a message through the ladder, then delay the delivered message again through
    the same rungs with its headers (x-death included unless ``strip``)."""
    ladder = Ladder(prefix=f"again-{strip}", unit_ms=UNIT_MS, bits=3)
    queue = f"again-{strip}"
    inbox = Inbox()
    arrivals = inbox.arrivals
    async with session(settings) as s:
        await s.declare(
            [], [{"queue": queue, "durable": True, "arguments": {"x-queue-type": "quorum"}}], []
        )
        await declare_ladder(s, ladder, targets=[("", queue)])
        await inbox.consume(s, queue)
        plan = ladder.plan(50, "", queue, {"trip": 1})  # rungs 02 and 00
        channel = await s.channel(confirms=True)
        await (
            await channel.publisher.publish(
                b"x",
                exchange=plan.exchange,
                routing_key=plan.routing_key,
                properties=Properties(message_id="again", headers=plan.headers, delivery_mode=2),
            )
        )
        await inbox.wait(lambda: len(arrivals.get("again", [])) == 1, 10.0)
        delivered: dict[str, Any] = dict(arrivals["again"][0].properties.headers or {})
        _check_trail(ladder, delivered)
        if strip:
            again = ladder.plan(50, "", queue, delivered)
            headers = again.headers
        else:  # what a naive republish does: the delivered headers as they are
            headers = delivered
        await (
            await channel.publisher.publish(
                b"x",
                exchange=ladder.entry,
                routing_key=queue,
                properties=Properties(message_id="again", headers=headers, delivery_mode=2),
            )
        )
        await inbox.wait(lambda: len(arrivals["again"]) == 2, 2.0)
        return len(arrivals["again"])


def test_a_delivered_message_delayed_again_arrives_again(vhost: str) -> None:
    settings = broker.settings_for(vhost)
    assert broker.run(_redelay(settings, strip=True)) == 2
    # Why plan() strips x-death: 3.10 keeps a client's x-death and its cycle detection drops
    # the message when it dead-letters into a rung it already expired from (no `rejected` in
    # between); 4.0+ ignores a client's x-death.
    assert broker.run(_redelay(settings, strip=False)) == (1 if broker.version() < (4, 0) else 2)


async def _status(settings: Settings) -> tuple[Ladder, Ladder, Ladder, dict[str, int]]:
    """Three messages that wait 30 s; and one due message on each kind of ladder whose target
    has no exit binding. Returns the ladders and the AMQP counts of the first right away."""
    waiting = Ladder(prefix="status", unit_ms=UNIT_MS, bits=12)
    quorum = Ladder(prefix="noexit-q", unit_ms=UNIT_MS, bits=3)
    classic = Ladder(prefix="noexit-c", unit_ms=UNIT_MS, bits=3, queue_type="classic")
    async with session(settings) as s:
        await _target(s)
        await declare_ladder(s, waiting, targets=[(EXCHANGE, "")])
        await _publish(s, waiting, {f"s-{i}": 30_000 for i in range(3)})  # 3000 units: rung 11
        counts = await delayed_counts(s, waiting)
        for ladder in (quorum, classic):
            await declare_ladder(s, ladder)  # no targets: nothing can leave
            await _publish(s, ladder, {f"{ladder.prefix}-1": 30})
        # The same names with other arguments: refused, naming the rung.
        other = Ladder(prefix="status", unit_ms=UNIT_MS, bits=12, queue_type="classic")
        with pytest.raises(DataError, match=r"status\.10ms\.00-10ms"):
            await declare_ladder(s, other)
        await declare_target(s, waiting, EXCHANGE)  # idempotent
        await asyncio.sleep(0.5)
        assert (await s.queue_depth(WORK)).ready == 0
    return waiting, quorum, classic, counts


def test_status_counts_waiting_and_stuck_messages_per_rung(vhost: str) -> None:
    """What ``status`` shows: messages waiting per rung (AMQP at once, management API after its
    lag), and a due message that cannot leave — kept by a quorum rung (at-least-once
    dead-lettering retries the hop), dropped by a classic one (at-most-once)."""
    waiting, quorum, classic, counts = broker.run(_status(broker.settings_for(vhost)))
    assert counts == {n: 3 if n == waiting.queue_name(11) else 0 for n in waiting.queue_names}

    def held(ladder: Ladder) -> tuple[int, int]:
        stats = [broker.mgmt_queue(vhost, n) or {} for n in ladder.queue_names]
        counts = ladder.delayed_in(stats).values()
        return sum(c.waiting for c in counts), sum(c.stuck for c in counts)

    assert broker.wait_for(lambda: held(waiting) == (3, 0) and held(quorum) == (0, 1), timeout_s=15)
    stats = [broker.mgmt_queue(vhost, n) or {} for n in quorum.queue_names]
    assert quorum.delayed_in(stats)[quorum.queue_name(0)].stuck == 1  # stuck in its last rung
    assert held(classic) == (0, 0)

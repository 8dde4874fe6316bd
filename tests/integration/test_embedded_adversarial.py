"""The embedded consumer, one variant further than the plain cases: two on one queue in one
process, stop() twice / before start / during start / concurrently, handlers raising while the
consumer drains, the app's task or whole event loop cancelled mid-message, a grace that runs
out, and the connection closed under it by the management API (twice). Each asserts what the
broker holds afterwards: every message handled, parked, retried or still queued — none lost."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

import rmqkit
from rmqkit import headers as h
from rmqkit.settings import Settings
from tests import broker
from tests.integration.test_embedded_consumer import (
    all_queues,
    depths,
    make_topology,
    publish,
    until,
)


@pytest.fixture
def settings(vhost: str) -> Settings:
    return broker.settings_for(vhost)


def test_two_consumers_on_one_queue_share_it_and_one_stopping_leaves_the_other(
    vhost: str, settings: Settings, tmp_path: Path
) -> None:
    spec = make_topology(tmp_path, vhost, "adv-two", prefetch=2)
    queue = "adv-two.work"
    handled: dict[str, Counter[str]] = {"a": Counter(), "b": Counter()}

    def handler(name: str):  # type: ignore[no-untyped-def]
        async def handle(message: rmqkit.Message) -> None:
            await asyncio.sleep(0.01)
            handled[name][str(message.message_id)] += 1

        return handle

    async def main() -> None:
        ids = await publish(vhost, "adv-two", [{"n": n} for n in range(60)])
        a = rmqkit.Consumer(handler("a"), queue=queue, topology=spec, settings=settings)
        b = rmqkit.Consumer(handler("b"), queue=queue, topology=spec, settings=settings)
        await asyncio.gather(a.start(), b.start())
        assert await until(lambda: sum(handled["a"].values()) >= 10)
        await a.stop(grace_s=5)  # b goes on alone
        total = handled["a"] + handled["b"]
        assert await until(lambda: set(handled["a"] + handled["b"]) == set(ids))
        await b.stop(grace_s=5)
        total = handled["a"] + handled["b"]
        assert set(total) == set(ids)
        assert max(total.values()) == 1  # a graceful stop hands nothing back: no redelivery
        assert handled["a"] and handled["b"]  # both took a share
        assert a.processed + b.processed == len(ids)
        assert await depths(vhost, all_queues(spec, queue)) == dict.fromkeys(
            all_queues(spec, queue), 0
        )

    asyncio.run(main())


def test_stop_before_start_twice_concurrently_and_during_start(
    vhost: str, settings: Settings, tmp_path: Path
) -> None:
    spec = make_topology(tmp_path, vhost, "adv-stops")
    queue = "adv-stops.work"
    seen: list[str] = []

    async def handle(message: rmqkit.Message) -> None:
        seen.append(str(message.message_id))

    async def main() -> None:
        consumer = rmqkit.Consumer(handle, queue=queue, topology=spec, settings=settings)
        await consumer.stop()  # before start: nothing to do, still startable
        await consumer.stop(grace_s=0)
        await consumer.start()
        await consumer.start()  # while started: returns at once
        ids = await publish(vhost, "adv-stops", [{"n": n} for n in range(5)])
        assert await until(lambda: set(seen) == set(ids))
        await asyncio.gather(consumer.stop(), consumer.stop(grace_s=1), consumer.stop())
        assert not consumer.consuming
        with pytest.raises(rmqkit.UsageError):
            await consumer.start()  # one-shot: a stopped consumer is not restarted
        # stop() while start() is still preparing: start returns without ever consuming
        late = rmqkit.Consumer(handle, queue=queue, topology=spec, settings=settings)
        starting = asyncio.create_task(late.start())
        await asyncio.sleep(0)
        await late.stop()
        await starting
        await publish(vhost, "adv-stops", [{"n": 99}])
        await asyncio.sleep(0.3)
        assert not late.consuming and late.processed == 0
        assert (await depths(vhost, [queue]))[queue] == 1  # nobody took it
        # run() after that: already stopped, raises rather than hanging
        with pytest.raises(rmqkit.UsageError):
            await late.run()

    asyncio.run(main())
    broker.drain(vhost, queue)


def test_handlers_raising_during_the_drain_are_settled_as_failures(
    vhost: str, settings: Settings, tmp_path: Path
) -> None:
    spec = make_topology(tmp_path, vhost, "adv-raise", prefetch=4)
    queue = "adv-raise.work"
    parking = spec.parking_name(queue)
    started = 0
    release = asyncio.Event()

    async def handle(message: rmqkit.Message) -> None:
        nonlocal started
        started += 1
        await release.wait()
        raise rmqkit.Permanent("failed while the consumer was stopping")

    async def main() -> None:
        await publish(vhost, "adv-raise", [{"n": n} for n in range(10)])
        consumer = rmqkit.Consumer(handle, queue=queue, topology=spec, settings=settings)
        await consumer.start()
        assert await until(lambda: started == 4)
        stopping = asyncio.create_task(consumer.stop(grace_s=10))
        await asyncio.sleep(0.2)
        release.set()  # each in-flight handler now raises inside the drain
        await asyncio.wait_for(stopping, timeout=10)
        got = await depths(vhost, all_queues(spec, queue))
        # the 4 parked (copy confirmed, then the original acked), 6 never taken
        assert got == {**dict.fromkeys(all_queues(spec, queue), 0), queue: 6, parking: 4}

    asyncio.run(main())
    parked = broker.drain(vhost, parking)
    assert {p["headers"][h.PARK_REASON] for p in parked} == {"permanent"}
    broker.drain(vhost, queue)


def test_cancelled_task_and_closed_loop_mid_message_redeliver_it(
    vhost: str, settings: Settings, tmp_path: Path
) -> None:
    spec = make_topology(tmp_path, vhost, "adv-cancel", prefetch=2)
    queue = "adv-cancel.work"
    started: list[str] = []
    done: list[str] = []

    async def stuck(message: rmqkit.Message) -> None:
        started.append(str(message.message_id))
        await asyncio.sleep(60)
        done.append(str(message.message_id))

    async def cancel_run_task() -> None:
        await publish(vhost, "adv-cancel", [{"n": n} for n in range(3)])
        consumer = rmqkit.Consumer(stuck, queue=queue, topology=spec, settings=settings)
        task = asyncio.create_task(consumer.run())
        assert await until(lambda: len(started) == 2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not consumer.consuming

    asyncio.run(cancel_run_task())
    assert not done
    # nothing in hand was acked: all 3 back in the queue
    assert broker.wait_for(lambda: broker.depths(vhost, [queue])[queue] == 3, timeout_s=10)

    started.clear()

    async def leave_it_running() -> None:
        consumer = rmqkit.Consumer(stuck, queue=queue, topology=spec, settings=settings)
        await consumer.start()
        assert await until(lambda: len(started) == 2)
        # main returns with the consumer mid-message: asyncio.run cancels every task left

    asyncio.run(leave_it_running())
    assert not done
    assert broker.wait_for(lambda: broker.depths(vhost, [queue])[queue] == 3, timeout_s=10)
    broker.drain(vhost, queue)


@pytest.mark.timing
def test_grace_running_out_hands_the_rest_back_and_cancels_async_handlers(
    vhost: str, settings: Settings, tmp_path: Path
) -> None:
    spec = make_topology(tmp_path, vhost, "adv-grace", prefetch=2)
    queue = "adv-grace.work"
    outcomes: list[str] = []
    slow_started = 0

    async def slow(message: rmqkit.Message) -> None:
        nonlocal slow_started
        if message.json()["n"] == 0:
            return  # one quick message: acked before the stop
        slow_started += 1
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            outcomes.append("cancelled")
            raise

    async def main() -> None:
        await publish(vhost, "adv-grace", [{"n": n} for n in range(4)])
        consumer = rmqkit.Consumer(slow, queue=queue, topology=spec, settings=settings)
        await consumer.start()
        assert await until(lambda: consumer.processed == 1 and slow_started == 2)
        loop = asyncio.get_running_loop()
        began = loop.time()
        await consumer.stop(grace_s=0.5)
        assert loop.time() - began < 5  # the grace, not the handlers' 60 s
        await asyncio.sleep(0.1)
        assert outcomes == ["cancelled", "cancelled"]  # nothing of theirs keeps running

    asyncio.run(main())
    # the quick one acked; the 2 cut off (not acked) and the 1 never taken are back
    assert broker.depths(vhost, all_queues(spec, queue)) == {
        **dict.fromkeys(all_queues(spec, queue), 0),
        queue: 3,
    }
    broker.drain(vhost, queue)


def _connections_named(name: str) -> list[str]:
    return [
        c["name"]
        for c in broker.api("GET", "/connections").json()
        if (c.get("client_properties") or {}).get("connection_name") == name
    ]


def test_connection_closed_by_the_management_api_twice_every_message_accounted_for(
    vhost: str, settings: Settings, tmp_path: Path
) -> None:
    spec = make_topology(tmp_path, vhost, "adv-kill", prefetch=5)
    queue = "adv-kill.work"
    seen: Counter[str] = Counter()

    async def handle(message: rmqkit.Message) -> None:
        seen[str(message.message_id)] += 1
        await asyncio.sleep(0.02)

    async def close_connection() -> None:
        names: list[str] = []
        for _ in range(100):  # the management API lists a new connection within seconds
            names = await asyncio.to_thread(_connections_named, f"rmqkit consume {queue}")
            if names:
                break
            await asyncio.sleep(0.1)
        assert names, "the consumer's connection never showed in the management API"
        for name in names:
            await asyncio.to_thread(
                broker.api,
                "DELETE",
                f"/connections/{broker.q(name)}",
                headers={"X-Reason": "test: closed by an operator"},
            )

    async def main() -> None:
        ids = await publish(vhost, "adv-kill", [{"n": n} for n in range(80)])
        consumer = rmqkit.Consumer(handle, queue=queue, topology=spec, settings=settings)
        await consumer.start()
        for _ in range(2):
            await until(lambda: len(seen) >= 10)
            await close_connection()
            await until(lambda: not consumer.consuming, timeout_s=5)
            assert await until(lambda: consumer.consuming, timeout_s=15)  # reconnected
        assert await until(lambda: set(seen) == set(ids), timeout_s=30), len(seen)
        assert await until(lambda: consumer.metrics is not None and consumer.processed >= 80)
        await consumer.stop(grace_s=5)
        assert consumer.metrics is not None and consumer.metrics._reconnects == 2
        # every message handled at least once (those in hand at a close: again), none left
        assert await depths(vhost, all_queues(spec, queue)) == dict.fromkeys(
            all_queues(spec, queue), 0
        )

    asyncio.run(main())


def test_permissions_revoked_while_running_end_it_and_run_raises(
    vhost: str, settings: Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec = make_topology(tmp_path, vhost, "adv-revoke")
    queue = "adv-revoke.work"
    perms = {"configure": ".*", "write": ".*", "read": ".*"}

    async def handle(message: rmqkit.Message) -> None:
        return None

    async def main() -> None:
        consumer = rmqkit.Consumer(handle, queue=queue, topology=spec, settings=settings)
        await consumer.start()
        running = asyncio.create_task(consumer.run())
        await asyncio.to_thread(broker.api, "DELETE", f"/permissions/{broker.q(vhost)}/guest")
        try:
            for _ in range(100):
                names = await asyncio.to_thread(_connections_named, f"rmqkit consume {queue}")
                if names:
                    break
                await asyncio.sleep(0.1)
            for name in names:
                await asyncio.to_thread(broker.api, "DELETE", f"/connections/{broker.q(name)}")
            # the reconnect is refused: fatal, as for `rmqkit consume` (exit 77)
            with pytest.raises(rmqkit.AccessRefused):
                await asyncio.wait_for(running, timeout=20)
        finally:
            await asyncio.to_thread(
                broker.api, "PUT", f"/permissions/{broker.q(vhost)}/guest", json=perms
            )
        assert not consumer.consuming
        await consumer.stop()  # after a fatal end: returns, raises nothing

    with caplog.at_level("ERROR", logger="rmqkit.consumer"):
        asyncio.run(main())
    assert any("stopped" in r.getMessage() for r in caplog.records), caplog.text

"""``rmqkit.Publisher`` against what an application (or an attacker feeding it) will do: one
variant further than the plain cases. Every check reads back what the queue holds."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

import rmqkit
from tests import broker
from tests.integration.test_publisher_api import declare, get_raw, held

pytestmark = [pytest.mark.broker, pytest.mark.semantics("4.3")]


def test_a_reused_message_id_in_flight_keeps_both_messages(vhost: str) -> None:
    """Two different bodies under one id, and the same body twice, in flight together: each is
    confirmed on its own (returns are matched by id and body, not by id alone)."""
    settings = broker.settings_for(vhost)

    async def main() -> list[rmqkit.PublishResult]:
        await declare(settings, "adv.reused")
        async with rmqkit.Publisher.connect(settings) as pub:
            same = [rmqkit.PublishMessage(b, message_id="dup") for b in (b"one", b"two", b"two")]
            many = await pub.publish_many("pub", "adv.reused", same)
            alone = await asyncio.gather(
                *(pub.publish("pub", "adv.reused", b"three", message_id="dup") for _ in range(2))
            )
            # an unroutable twin of a routed one: only the unroutable is reported so
            with pytest.raises(rmqkit.Unroutable) as caught:
                await pub.publish_many(
                    "pub",
                    "adv.reused",
                    [
                        rmqkit.PublishMessage(b"x", message_id="dup"),
                        rmqkit.PublishMessage(b"x", message_id="dup", routing_key="nowhere"),
                    ],
                )
        return [*many, *alone, *caught.value.results]  # type: ignore[list-item]

    results = broker.run(main())
    assert [r.outcome for r in results] == ["confirmed"] * 6 + ["returned"]
    got = sorted(m["body"] for m in held(vhost, "adv.reused"))
    assert got == [b"one", b"three", b"three", b"two", b"two", b"x"]


def test_empty_and_oversized_bodies(vhost: str) -> None:
    """0 bytes, and 15 MiB (more than a frame many times over, split into frames; under 4.x's
    16 MiB max_message_size): both arrive byte for byte; the empty body keeps its id and
    headers."""
    settings = broker.settings_for(vhost)
    big = uuid.uuid4().bytes * (15 * 1024 * 1024 // 16 + 1)

    async def main() -> list[Any]:
        await declare(settings, "adv.sizes")
        async with rmqkit.Publisher.connect(settings) as pub:
            await pub.publish("pub", "adv.sizes", b"", message_id="empty", headers={"h": 1})
            await pub.publish("pub", "adv.sizes", big, message_id="big")
        return await get_raw(settings, "adv.sizes")

    got = broker.run(main())
    assert [(m.message_id, len(m.body)) for m in got] == [("empty", 0), ("big", len(big))]
    assert got[0].headers == {"h": 1}
    assert hashlib.sha256(got[1].body).digest() == hashlib.sha256(big).digest()


@pytest.mark.skipif(
    broker.version() < (4, 0), reason="3.x's max_message_size is 128 MiB (4.x: 16 MiB)"
)
def test_a_message_over_the_brokers_max_size_is_refused_for_good(vhost: str) -> None:
    """RabbitMQ 4.x closes the channel on a message over max_message_size (16 MiB). That
    message is MessageTooLarge (65), never sent again; the others of the call are confirmed;
    a later call's oversized message is refused without being sent. (Before: sent again on
    five new channels, then PublishInterrupted, "fate unknown", for a message that can never
    be taken.)"""
    settings = broker.settings_for(vhost)
    big = b"x" * (17 * 1024 * 1024)

    async def main() -> tuple[Any, Any, list[Any]]:
        await declare(settings, "adv.toolarge")
        async with rmqkit.Publisher.connect(settings) as pub:
            with pytest.raises(rmqkit.MessageTooLarge) as first:
                await pub.publish_many(
                    "pub",
                    "adv.toolarge",
                    [
                        rmqkit.PublishMessage(b"before", "before"),
                        rmqkit.PublishMessage(big, "big"),
                        rmqkit.PublishMessage(b"after", "after"),
                    ],
                )
            with pytest.raises(rmqkit.MessageTooLarge) as second:
                await pub.publish("pub", "adv.toolarge", big, message_id="big-2")
            await pub.publish("pub", "adv.toolarge", b"last", message_id="last")
        return first.value, second.value, await get_raw(settings, "adv.toolarge")

    first, second, got = broker.run(main())
    assert [(r.message_id, r.outcome) for r in first.results] == [
        ("before", "confirmed"),
        ("big", "too_large"),
        ("after", "confirmed"),
    ]
    assert first.results[1].attempts == 1  # sent once, never again
    assert [(r.outcome, r.attempts) for r in second.results] == [("too_large", 0)]
    assert "max_message_size" in str(first)
    assert sorted(m.message_id for m in got) == ["after", "before", "last"]


@pytest.mark.parametrize(
    "bad",
    [
        {"a": {1, 2}},  # a set
        {"a": object()},
        {"a": [1, {"deep": complex(1, 2)}]},  # nested
        {"a": 2**70},  # wider than AMQP's long long
    ],
    ids=["set", "object", "nested-complex", "int-too-wide"],
)
def test_headers_amqp_cannot_carry_publish_nothing(vhost: str, bad: dict[str, Any]) -> None:
    """The bad header is on the last message of a batch: the whole batch is refused (65) before
    the first is sent, so no half batch is in the queue."""
    settings = broker.settings_for(vhost)
    queue = f"adv.headers.{uuid.uuid4().hex[:6]}"

    async def main() -> None:
        await declare(settings, queue)
        async with rmqkit.Publisher.connect(settings) as pub:
            messages = [
                rmqkit.PublishMessage(b"ok", headers={"when": datetime.now(UTC)}),
                rmqkit.PublishMessage(b"bad", headers=bad),
            ]
            with pytest.raises(rmqkit.DataError, match="header AMQP cannot carry"):
                await pub.publish_many("pub", queue, messages)
            ok = await pub.publish("pub", queue, b"after")  # the publisher still works
            assert ok.confirmed

    broker.run(main())
    assert [m["body"] for m in held(vhost, queue)] == [b"after"]


def test_publish_after_close_and_before_open(vhost: str) -> None:
    settings = broker.settings_for(vhost)

    async def main() -> None:
        await declare(settings, "adv.closed")
        pub = rmqkit.Publisher(settings)
        with pytest.raises(rmqkit.PublisherClosed):
            await pub.publish("pub", "adv.closed", b"too early")
        async with pub:
            await pub.publish("pub", "adv.closed", b"in time")
        with pytest.raises(rmqkit.PublisherClosed):
            await pub.publish("pub", "adv.closed", b"too late")
        with pytest.raises(rmqkit.PublisherClosed):
            await pub.publish_many("pub", "adv.closed", [b"too late"])
        with pytest.raises(rmqkit.PublisherClosed):
            await pub.open()  # not reopened behind the caller's back
        await pub.close()  # twice is fine

    broker.run(main())
    assert [m["body"] for m in held(vhost, "adv.closed")] == [b"in time"]


def test_cancelled_publish_gives_no_result_and_the_publisher_goes_on(vhost: str) -> None:
    """A caller's task cancelled while its batch waits for confirms gets CancelledError, never
    a result; the publisher's window is not leaked, and later calls are confirmed."""
    settings = broker.settings_for(vhost)

    async def main() -> list[rmqkit.PublishResult]:
        await declare(settings, "adv.cancel", **{"x-max-length": 1, "x-overflow": "reject-publish"})
        async with rmqkit.Publisher.connect(
            settings, window=2, retry_busy=True, busy_retries=50
        ) as pub:
            # the queue is full after one: the rest are nacked and retried with backoff, so the
            # call is still waiting when it is cancelled
            task = asyncio.ensure_future(pub.publish_many("pub", "adv.cancel", [b"c"] * 6))
            await asyncio.sleep(0.5)
            assert not task.done()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.to_thread(broker.drain, vhost, "adv.cancel")
            after = [await pub.publish("pub", "adv.cancel", b"next") for _ in range(1)]
            return after

    after = broker.run(main())
    assert [r.confirmed for r in after] == [True]
    assert [m["body"] for m in held(vhost, "adv.cancel")] == [b"next"]


def test_thousands_of_concurrent_publish_calls_share_one_channel(vhost: str) -> None:
    """2,100 ``publish()`` calls gathered at once (more than a connection's 2,047 channels): one
    probe of the exchange and one confirm window for all, each call its own result."""
    settings = broker.settings_for(vhost)
    n = 2100

    async def main() -> list[rmqkit.PublishResult]:
        await declare(settings, "adv.gather")
        async with rmqkit.Publisher.connect(settings) as pub:
            return list(
                await asyncio.gather(
                    *(pub.publish("pub", "adv.gather", b"g", message_id=f"g{i}") for i in range(n))
                )
            )

    results = broker.run(main())
    assert [r.message_id for r in results] == [f"g{i}" for i in range(n)]
    assert all(r.confirmed for r in results)
    assert broker.depths(vhost, ["adv.gather"])["adv.gather"] == n
    broker.drain(vhost, "adv.gather")


def test_connection_killed_without_reconnects_reports_the_unconfirmed(vhost: str) -> None:
    """``reconnect_attempts=0``: the batch the kill lands in raises PublishInterrupted (69);
    what it reports confirmed is in the queue, the rest is listed unconfirmed, and the next call
    connects again."""
    settings = broker.settings_for(vhost)
    name = f"rmqkit-test-noreconnect-{uuid.uuid4().hex[:8]}"

    def kill_when_seen() -> None:
        def ours() -> list[str]:
            listed = broker.api("GET", f"/vhosts/{broker.q(vhost)}/connections").json()
            return [
                c["name"]
                for c in listed
                if c.get("client_properties", {}).get("connection_name") == name
            ]

        for conn_name in broker.wait_for(ours, timeout_s=20, interval_s=0.05):
            broker.api("DELETE", f"/connections/{broker.q(conn_name)}")

    async def main() -> tuple[list[rmqkit.PublishResult], list[Any], rmqkit.PublishResult]:
        await declare(settings, "adv.noreconnect")
        ok: list[rmqkit.PublishResult] = []
        failed: list[Any] = []
        async with rmqkit.Publisher.connect(
            settings, window=20, name=name, reconnect_attempts=0
        ) as pub:
            killer = asyncio.ensure_future(asyncio.to_thread(kill_when_seen))
            deadline = asyncio.get_running_loop().time() + 40
            batch = 0
            while asyncio.get_running_loop().time() < deadline:
                batch += 1
                if killer.done():  # it landed between two batches: kill the new connection
                    killer.result()
                    killer = asyncio.ensure_future(asyncio.to_thread(kill_when_seen))
                bodies = [
                    rmqkit.PublishMessage(b"n" * 512, message_id=f"n{batch}-{i}")
                    for i in range(500)
                ]
                try:
                    ok += await pub.publish_many("pub", "adv.noreconnect", bodies)
                except rmqkit.PublishInterrupted as exc:
                    assert exc.exit_code == 69
                    failed += exc.results
                    break
            await killer
            after = await pub.publish("pub", "adv.noreconnect", b"after", message_id="after")
        return ok, failed, after

    ok, failed, after = broker.run(main())
    assert failed, "the kill never landed inside a batch"
    assert any(not r.confirmed and r.outcome == "unconfirmed" for r in failed)
    in_queue = {m["message_id"] for m in held(vhost, "adv.noreconnect")}
    confirmed = {r.message_id for r in [*ok, *failed] if r.confirmed}
    assert confirmed <= in_queue, "reported confirmed but not in the queue"
    assert after.confirmed and "after" in in_queue

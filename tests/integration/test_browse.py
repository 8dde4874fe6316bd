"""Browsing is complete or fails loudly: a slow broker is waited for, never taken for an empty
queue, and each browse leaves the queue whole for the next command."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiormq
import pytest

from rmqkit.broker.channel import Channel
from rmqkit.broker.session import Session
from rmqkit.parking.browse import BrowseIncomplete, Verdict, browse
from rmqkit.parking.model import ParkedFilter, ParkedMessage
from rmqkit.parking.ops import list_parked
from rmqkit.parking.replay import replay_parked
from rmqkit.settings import with_vhost
from tests import broker

pytestmark = pytest.mark.semantics("4.0", "4.3")

QUEUE = "b.parking"
COUNT = 8_000


def _declare(vhost: str, name: str, **arguments: Any) -> None:
    # Version difference: a parking queue needs no delivery limit, which on 4.x must be said
    # (-1; the default is 20 and rmqkit refuses to browse such a queue) and on 3.x must not be.
    args = {"x-queue-type": "quorum", **broker.no_delivery_limit(), **arguments}
    body = {"durable": True, "arguments": args}
    broker.api("PUT", f"/queues/{broker.q(vhost)}/{broker.q(name)}", json=body).raise_for_status()


@pytest.fixture(scope="module")
def filled(vhost: str) -> str:
    _declare(vhost, QUEUE)
    messages = [(f"m-{i}", b"x" * 100) for i in range(COUNT)]
    broker.publish_with_ids(vhost, "", QUEUE, messages)
    return vhost


def test_back_to_back_browses_each_see_every_message(filled: str) -> None:
    settings = broker.settings_for(filled)

    async def three_lists() -> list[set[str]]:
        seen: list[set[str]] = []
        for _ in range(3):  # each right after the other: the returns of the last still landing
            ids: set[str] = set()

            def add(message: ParkedMessage, ids: set[str] = ids) -> None:
                ids.add(message.message_id or "")

            stats = await list_parked(settings, QUEUE, ParkedFilter(), add)
            assert stats.settled and stats.missed == 0
            seen.append(ids)
        return seen

    expected = {f"m-{i}" for i in range(COUNT)}
    assert all(ids == expected for ids in broker.run(three_lists()))
    assert broker.depths(filled, [QUEUE])[QUEUE] == COUNT


def test_pauses_in_delivery_do_not_end_a_pass(filled: str) -> None:
    """An idle check every 10 ms: before the fix, the first pause ended the browse short."""

    async def browse_twice() -> list[int]:
        conn = await aiormq.connect(with_vhost(broker.BASE_URL, filled))
        counts = []
        try:
            for _ in range(2):
                seen = 0

                async def visit(message: ParkedMessage) -> Verdict:
                    nonlocal seen
                    seen += 1
                    if seen % 500 == 0:
                        await asyncio.sleep(0.05)  # a slow visitor, too
                    return Verdict.KEEP

                stats = await browse(conn, QUEUE, visit, idle_check_s=0.01)
                assert stats.queue_count == COUNT and stats.settled
                counts.append(seen)
        finally:
            await conn.close()
        return counts

    assert broker.run(browse_twice()) == [COUNT, COUNT]
    assert broker.depths(filled, [QUEUE])[QUEUE] == COUNT


def test_a_queue_that_delivers_nothing_is_an_error_not_an_empty_result(vhost: str) -> None:
    """Single active consumer: another connection is the active one, so the broker delivers
    nothing to the browse although messages are ready."""
    name = "b.sac"
    _declare(vhost, name, **{"x-single-active-consumer": True})
    broker.publish_with_ids(vhost, "", name, [(f"s-{i}", b"s") for i in range(5)])

    async def scenario() -> None:
        url = with_vhost(broker.BASE_URL, vhost)
        holder = await aiormq.connect(url)
        conn = await aiormq.connect(url)
        try:
            channel = await holder.channel()
            await channel.basic_qos(prefetch_count=1)
            held: asyncio.Queue[int] = asyncio.Queue()

            async def hold(message: aiormq.abc.DeliveredMessage) -> None:
                held.put_nowait(1)  # never acked: the queue keeps 4 ready

            await channel.basic_consume(name, hold)
            await asyncio.wait_for(held.get(), timeout=10)

            async def visit(message: ParkedMessage) -> Verdict:
                raise AssertionError("nothing should be delivered to the browse")

            with pytest.raises(
                BrowseIncomplete, match=r"delivered nothing.*\(4 message\(s\) ready"
            ):
                await browse(conn, name, visit, idle_check_s=0.2, stall_timeout_s=1.5)
        finally:
            await conn.close()
            await holder.close()

    broker.run(scenario())
    assert broker.depths(vhost, [name])[name] == 5  # the held one is back too


def test_a_full_replay_leaves_no_original_behind(vhost: str) -> None:
    """Every message taken: acks go as multiple-acks while confirms keep arriving. A lost ack
    would leave an original parked next to its confirmed copy (seen as ~1% before the fix)."""
    source, target, count = "b.full.parking", "b.full.target", 5_000
    _declare(vhost, source)
    _declare(vhost, target)
    broker.publish_with_ids(vhost, "", source, [(f"r-{i}", b"r" * 200) for i in range(count)])
    settings = broker.settings_for(vhost)
    report = broker.run(replay_parked(settings, source, ParkedFilter(), routing_key=target))
    assert (report.selected, report.moved) == (count, count)
    # Returned originals would be back within a second or two; give them three.
    time.sleep(3)
    assert broker.depths(vhost, [source, target]) == {source: 0, target: count}


@pytest.mark.parametrize("kept", ["first", "middle"])
def test_a_pass_whose_last_message_is_taken_ends_without_a_channel_error(
    vhost: str, kept: str
) -> None:
    """The kept messages go back with one nack(multiple) naming the highest *kept* tag. Named
    by the last tag delivered, which was taken (acked), the broker refused it ("unknown
    delivery tag", 406) and closed the channel; that close racing ours ended the connection
    of a group archive on 3.10 ("expected 'channel.open'")."""
    name = f"b.last-taken.{kept}"
    count = 40
    _declare(vhost, name)
    broker.publish_with_ids(vhost, "", name, [(f"t-{i}", b"t") for i in range(count)])
    keep = {"first": {"t-0"}, "middle": {f"t-{i}" for i in range(10, 20)}}[kept]
    opened: list[Channel] = []

    class Recording(Session):
        async def channel(self, *, confirms: bool = False, window: int = 1000) -> Channel:
            made = await super().channel(confirms=confirms, window=window)
            opened.append(made)
            return made

    async def scenario() -> tuple[int, int, list[str]]:
        conn = await aiormq.connect(with_vhost(broker.BASE_URL, vhost))
        try:

            async def visit(message: ParkedMessage) -> Verdict:
                return Verdict.KEEP if message.message_id in keep else Verdict.TAKE

            stats = await browse(Recording(conn), name, visit)
            await asyncio.sleep(0.3)  # a refusal arrives just after the nack
            # Our own close ends a channel with a bare ChannelClosed; the broker's, a subclass.
            ended = [c.closing.exception() for c in opened if c.closing.done()]
            errors = [str(e) for e in ended if type(e) is not aiormq.exceptions.ChannelClosed]
            return stats.taken, stats.kept, errors
        finally:
            await conn.close()

    taken, kept_count, errors = broker.run(scenario())
    assert errors == []
    assert (taken, kept_count) == (count - len(keep), len(keep))
    assert {m["message_id"] for m in broker.drain(vhost, name)} == keep

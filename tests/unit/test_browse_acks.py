"""The browse's ack batching: one multiple-ack for a fully taken prefix, never a kept tag acked."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from rmqkit.parking.browse import _Acks


class Recorder:
    """Stands in for the channel: records acks and applies AMQP's multiple-ack semantics."""

    def __init__(self) -> None:
        self.outstanding: set[int] = set()
        self.calls: list[tuple[int, bool]] = []

    async def ack(self, tag: int, *, multiple: bool = False) -> None:
        assert tag in self.outstanding, f"ack of unknown tag {tag}"  # the broker closes the channel
        self.calls.append((tag, multiple))
        if multiple:
            self.outstanding -= {t for t in self.outstanding if t <= tag}
        else:
            self.outstanding.discard(tag)


def _run(tags: int, kept: set[int], order: list[int]) -> Recorder:
    channel = Recorder()
    channel.outstanding = set(range(1, tags + 1))
    acks = _Acks(channel)  # type: ignore[arg-type]

    async def go() -> None:
        for tag in order:
            if tag in kept:
                acks.blocked = True
            else:
                acks.take(tag)
            if acks.due:
                await acks.flush()
        await acks.flush(final=True)

    asyncio.run(go())
    return channel


def test_all_taken_in_order_is_a_few_multiple_acks() -> None:
    channel = _run(1000, set(), list(range(1, 1001)))
    assert channel.outstanding == set()
    assert all(multiple for _, multiple in channel.calls) and len(channel.calls) <= 4


def test_kept_messages_are_never_acked_whatever_the_order() -> None:
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(1, 700)
        kept = {t for t in range(1, n + 1) if rng.random() < rng.choice([0, 0.01, 0.3])}
        order = list(range(1, n + 1))
        for i in range(len(order) - 1):  # confirms mostly in order, some swapped
            if rng.random() < 0.1:
                order[i], order[i + 1] = order[i + 1], order[i]
        channel = _run(n, kept, order)
        assert channel.outstanding == kept, (n, sorted(kept)[:5])


def test_a_gap_waits_for_its_confirm_then_one_multiple_ack_covers_it() -> None:
    order: list[Any] = [*range(2, 300), 1]  # tag 1's copy is confirmed last
    channel = _run(299, set(), order)
    assert channel.outstanding == set()
    assert channel.calls[-1] == (299, True)


def test_tags_taken_while_an_ack_is_being_sent_are_not_lost() -> None:
    """Confirms resolve (and call take) while flush awaits the channel."""
    channel = Recorder()
    channel.outstanding = set(range(1, 2001))
    acks = _Acks(channel)  # type: ignore[arg-type]
    incoming = iter(range(1, 2001))
    original = channel.ack

    async def slow_ack(tag: int, *, multiple: bool = False) -> None:
        await asyncio.sleep(0)
        for _ in range(3):  # three confirms land during each ack frame
            nxt = next(incoming, None)
            if nxt is not None:
                acks.take(nxt)
        await original(tag, multiple=multiple)

    channel.ack = slow_ack  # type: ignore[method-assign]

    async def go() -> None:
        for tag in incoming:
            acks.take(tag)
            if acks.due:
                await acks.flush()
        await acks.flush(final=True)

    asyncio.run(go())
    assert channel.outstanding == set()

"""Conflation's per-key admission: one handler per key at a time, the newest waiting message
runs next, older waiting ones are superseded, and a cancelled waiter never blocks its key."""

from __future__ import annotations

import asyncio

import pytest

from rmqkit.consumer.conflation import Conflation, key_of


def test_the_first_runs_the_newest_waiter_runs_next_the_rest_are_superseded() -> None:
    async def scenario() -> list[tuple[str, bool]]:
        c = Conflation()
        assert await c.admit("k")  # v0 runs at once
        waiters = {v: asyncio.ensure_future(c.admit("k")) for v in ("v1", "v2", "v3")}
        other = await c.admit("other")  # another key is independent
        await asyncio.sleep(0.01)
        assert waiters["v1"].done() and waiters["v2"].done() and not waiters["v3"].done()
        c.release("k")  # v0 done: v3, the newest, runs
        await asyncio.sleep(0.01)
        c.release("k")  # v3 done: nothing waits, the key is free
        c.release("other")
        assert c.keys_running == 0
        return [("other", other), *((v, f.result()) for v, f in waiters.items())]

    assert asyncio.run(scenario()) == [("other", True), ("v1", False), ("v2", False), ("v3", True)]


def test_a_cancelled_waiter_that_had_the_turn_passes_it_on() -> None:
    async def scenario() -> bool:
        c = Conflation()
        assert await c.admit("k")
        waiter = asyncio.ensure_future(c.admit("k"))
        await asyncio.sleep(0.01)
        c.release("k")  # the turn goes to the waiter...
        waiter.cancel()  # ...which is cancelled (its channel went away) before it resumes
        with pytest.raises(asyncio.CancelledError):
            await waiter
        return await asyncio.wait_for(c.admit("k"), timeout=1)  # the key is not stuck

    assert asyncio.run(scenario()) is True


def test_a_cancelled_waiter_leaves_no_waiter_behind() -> None:
    async def scenario() -> int:
        c = Conflation()
        assert await c.admit("k")
        waiter = asyncio.ensure_future(c.admit("k"))
        await asyncio.sleep(0.01)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        c.release("k")
        return c.keys_running

    assert asyncio.run(scenario()) == 0


@pytest.mark.parametrize(
    ("value", "key"), [(None, None), ("a", "a"), (b"b", "b"), (bytearray(b"c"), "c"), (7, "7")]
)
def test_key_of(value: object, key: str | None) -> None:
    assert key_of(value) == key

"""Delayed outbox rows through a running relay: marked only when they will arrive, and planned
with the delay they have left at the moment they enter the ladder.

Real broker, real SQLite file (the delayed path does not differ by store); counted on the
broker by message_id and in the table. Variants an on-call engineer would try next:
test_outbox_delay_adversarial.py.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aio_pika
import pytest

import rmqkit.outbox
from rmqkit.delay import Ladder
from rmqkit.outbox import RelayOptions, run_relay
from rmqkit.settings import with_vhost
from tests import broker
from tests.integration.test_outbox import declare, relay_process
from tests.integration.test_outbox_adversarial import _rows, _stop, _wait

pytestmark = pytest.mark.broker


def sqlite_outbox(tmp_path: Path, name: str = "app.db") -> str:
    dsn = f"sqlite:///{tmp_path}/{name}"
    rmqkit.outbox.init(dsn)
    return dsn


def add_rows(dsn: str, exchange: str, count: int, *, delay: str | None = "1s") -> list[str]:
    """``count`` rows for ``exchange`` (routing key ``k``) in one committed transaction."""
    with sqlite3.connect(dsn.removeprefix("sqlite:///")) as conn:
        return [
            rmqkit.outbox.add(conn, exchange=exchange, routing_key="k", body={"n": n}, delay=delay)
            for n in range(count)
        ]


def arrived(vhost: str, queue: str, count: int, timeout_s: float) -> list[str]:
    """message_ids drained from ``queue`` until ``count`` came or the timeout."""
    got: list[str] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        got += [str(m["message_id"]) for m in broker.drain(vhost, queue)]
        time.sleep(0.2)
    return got


def running_relay(dsn: str, vhost: str, *extra: str, env: dict[str, str] | None = None) -> Any:
    """A daemon relay, returned once it has published a first (plain) row: the rows a test
    adds after this are claimed at once, so a delayed one goes through the ladder (a relay
    still starting would find a short delay already due and publish it straight)."""
    relay = relay_process(dsn, vhost, "--poll", "100ms", *extra, env=env)
    ready = f"ready-{uuid.uuid4().hex[:6]}"
    declare(vhost, f"unused-{ready}", ready)
    with sqlite3.connect(dsn.removeprefix("sqlite:///")) as conn:
        mid = rmqkit.outbox.add(conn, exchange="", routing_key=ready, body=b"ready")
    try:
        _wait(lambda: _rows(dsn)[mid][0] or relay.poll() is not None, "relay not up", 30)
        assert relay.poll() is None, relay.communicate()
    except BaseException:
        relay.kill()
        relay.communicate()
        raise
    broker.api("DELETE", f"/queues/{broker.q(vhost)}/{broker.q(ready)}")
    return relay


def delete_exchange(vhost: str, exchange: str) -> None:
    response = broker.api("DELETE", f"/exchanges/{broker.q(vhost)}/{broker.q(exchange)}")
    assert response.status_code in (204, 404), response.text


def test_delayed_rows_after_the_target_exchange_is_deleted_and_declared_again(
    vhost: str, tmp_path: Path
) -> None:
    """The exchange is deleted and declared again (with its queue binding) under a running
    relay: the ladder's exit into it went with the old exchange. The relay must bind it again
    before it publishes, or every delayed row is confirmed into the ladder, marked and lost."""
    exchange, queue = f"dx-{uuid.uuid4().hex[:6]}", f"dq-{uuid.uuid4().hex[:6]}"
    declare(vhost, exchange, queue)
    dsn = sqlite_outbox(tmp_path)
    relay = running_relay(dsn, vhost)
    try:
        first = add_rows(dsn, exchange, 1)
        assert arrived(vhost, queue, 1, 20) == first  # the exit is declared and works
        delete_exchange(vhost, exchange)
        declare(vhost, exchange, queue)
        later = add_rows(dsn, exchange, 5)
        got = arrived(vhost, queue, 5, 20)
        assert sorted(got) == sorted(later), _rows(dsn)
        assert all(_rows(dsn)[m][0] for m in later)
        assert relay.poll() is None, relay.communicate()
    finally:
        out, err = _stop(relay)
    assert relay.returncode == 0, out + err


def test_delayed_rows_for_a_missing_exchange_stay_pending_like_plain_ones(
    vhost: str, tmp_path: Path
) -> None:
    """While the exchange is missing, delayed rows for it are held pending with the error, as
    the plain row for it is; once it is back (with its binding) all of them arrive."""
    exchange, queue = f"mx-{uuid.uuid4().hex[:6]}", f"mq-{uuid.uuid4().hex[:6]}"
    declare(vhost, exchange, queue)
    dsn = sqlite_outbox(tmp_path)
    relay = running_relay(dsn, vhost)
    try:
        first = add_rows(dsn, exchange, 1)
        assert arrived(vhost, queue, 1, 20) == first
        delete_exchange(vhost, exchange)
        delayed = add_rows(dsn, exchange, 5)
        plain = add_rows(dsn, exchange, 1, delay=None)
        _wait(lambda: all(_rows(dsn)[m][2] >= 1 for m in delayed + plain), "not tried", 20)
        rows = _rows(dsn)
        assert not any(rows[m][0] for m in delayed + plain), rows
        assert all(exchange in str(rows[m][1]) for m in delayed), rows
        declare(vhost, exchange, queue)
        got = arrived(vhost, queue, 6, 40)
        assert sorted(got) == sorted(delayed + plain), _rows(dsn)
        assert relay.poll() is None, relay.communicate()
    finally:
        out, err = _stop(relay)
    assert relay.returncode == 0, out + err


# --- the delay a row has left, at the moment it enters the ladder -------------------------------
class Tap:
    """A queue bound to the ladder's entry exchange for one target: it receives a copy of each
    delayed message for that target the moment the message enters the ladder; ``seen`` holds
    (receive time, headers) per message_id."""

    def __init__(self, vhost: str, target: str) -> None:
        self.vhost, self.target = vhost, target
        self.seen: dict[str, tuple[float, dict[str, Any]]] = {}
        self.name = f"tap-{uuid.uuid4().hex[:6]}"

    async def run(self, ready: asyncio.Event, stop: asyncio.Event) -> None:
        conn = await aio_pika.connect(with_vhost(broker.BASE_URL, self.vhost))
        try:
            channel = await conn.channel()
            # The entry exchange exactly as the relay declares it (so its declare is a no-op).
            entry = await channel.declare_exchange(Ladder().entry, "headers", durable=True)
            tap = await channel.declare_queue(self.name, exclusive=True)
            await tap.bind(
                entry, arguments={"x-match": "all", "rmqkit-delay-exchange": self.target}
            )

            async def got(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                self.seen[str(message.message_id)] = (time.time(), dict(message.headers or {}))

            await tap.consume(got, no_ack=True)
            ready.set()
            await stop.wait()
        finally:
            await conn.close()


def created_at(dsn: str) -> dict[str, float]:
    with sqlite3.connect(dsn.removeprefix("sqlite:///")) as conn:
        return {
            str(m): float(c)
            for m, c in conn.execute("SELECT message_id, created_at FROM rmqkit_outbox")
        }


def relay_once_with_tap(vhost: str, dsn: str, tap: Tap, until: Callable[[], bool]) -> Any:
    async def main() -> Any:
        ready, stop = asyncio.Event(), asyncio.Event()
        watching = asyncio.create_task(tap.run(ready, stop))
        await asyncio.wait_for(ready.wait(), 20)
        try:
            report = await run_relay(broker.settings_for(vhost), RelayOptions(dsn=dsn, once=True))
            for _ in range(200):  # the tap's copies: at most 10 s
                if until():
                    break
                await asyncio.sleep(0.05)
            return report
        finally:
            stop.set()
            await watching

    return asyncio.run(main())


@pytest.mark.timing
def test_a_delayed_row_enters_the_ladder_with_the_delay_it_has_left(
    fresh_vhost: Callable[[], str], tmp_path: Path
) -> None:
    """Entry time + the planned delay (``rmqkit-delay-ms``) must be add time + the delay asked
    for: the remaining delay is computed when the row is published, after the ladder and its
    exit are declared (on a vhost without a ladder yet, that declare is 20 quorum rungs and
    their bindings: hundreds of ms on a loaded machine, all of it added to every row's delay if
    the plan is made before it).

    Timing, generously: the tap receives its copy a little after the entry, so the error is
    measured from above. The margin is 150 ms (the declare alone took 150-490 ms, median, on
    the shared test machine); an early plan would give a negative error (never seen).
    """
    vhost = fresh_vhost()  # no ladder yet: the relay's first batch declares it
    exchange, queue = f"ex-{uuid.uuid4().hex[:6]}", f"eq-{uuid.uuid4().hex[:6]}"
    declare(vhost, exchange, queue)
    dsn = sqlite_outbox(tmp_path)
    ids = add_rows(dsn, exchange, 3, delay="10s")  # not yet due however slowly the relay starts
    created = created_at(dsn)
    tap = Tap(vhost, exchange)
    report = relay_once_with_tap(vhost, dsn, tap, lambda: len(tap.seen) == 3)
    assert (report.published, report.left_pending) == (3, 0), report.errors
    assert sorted(tap.seen) == sorted(ids)
    errors = []
    for mid in ids:
        entered, headers = tap.seen[mid]
        planned_s = int(headers["rmqkit-delay-ms"]) / 1000
        errors.append(entered + planned_s - (created[mid] + 10.0))
    assert all(-0.05 < e < 0.15 for e in errors), [f"{e * 1000:.0f} ms" for e in errors]
    got = arrived(vhost, queue, 3, 30)
    assert sorted(got) == sorted(ids)


def test_the_whole_ladder_deleted_under_a_running_relay(vhost: str, tmp_path: Path) -> None:
    """An operator deletes the ladder (its exchanges and rungs) under a running relay: delayed
    rows are held pending with the error, the relay declares the ladder again, and they arrive."""
    exchange, queue = f"lx-{uuid.uuid4().hex[:6]}", f"lq-{uuid.uuid4().hex[:6]}"
    declare(vhost, exchange, queue)
    dsn = sqlite_outbox(tmp_path)
    relay = running_relay(dsn, vhost)
    try:
        first = add_rows(dsn, exchange, 1)
        assert arrived(vhost, queue, 1, 20) == first
        ladder = Ladder()
        for name in ladder.queue_names:
            broker.api("DELETE", f"/queues/{broker.q(vhost)}/{broker.q(name)}")
        for name in [ladder.entry, ladder.out, *(ladder.after(b) for b in range(ladder.bits))]:
            delete_exchange(vhost, name)
        left = {x["name"] for x in broker.api("GET", f"/exchanges/{broker.q(vhost)}").json()}
        assert not {n for n in left if n.startswith(ladder.base)}, left
        later = add_rows(dsn, exchange, 3, delay="5s")  # still delayed when retried
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + 40
        while len(got) < 3 and time.monotonic() < deadline:
            got += broker.drain(vhost, queue)
            time.sleep(0.2)
        assert sorted(m["message_id"] for m in got) == sorted(later), _rows(dsn)
        assert all("rmqkit-delay-ms" in m["headers"] for m in got)  # through the ladder
        assert all(_rows(dsn)[m][0] for m in later)
        assert relay.poll() is None, relay.communicate()
    finally:
        out, err = _stop(relay)
    assert relay.returncode == 0, out + err

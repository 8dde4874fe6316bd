"""Several relays, a relay killed between confirm and mark, SIGTERM: real PostgreSQL and broker.

Counted on the broker side by message_id. The crash window is widened with the relay's test-only
hook (RMQKIT_OUTBOX_TEST_PAUSE_BEFORE_MARK, rmqkit/outbox/batch.py), which sleeps between a
batch's confirms and its marks after touching a marker file.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import rmqkit.outbox
from tests.integration.test_outbox import (
    collect,
    declare,
    drop_schema,
    outbox,
    pg_schema_dsn,
    relay_process,
)

pytestmark = pytest.mark.broker

PAUSE = "RMQKIT_OUTBOX_TEST_PAUSE_BEFORE_MARK"
MARKER = "RMQKIT_OUTBOX_TEST_PAUSE_FILE"


@pytest.fixture
def pg() -> Iterator[str]:
    schema, dsn = pg_schema_dsn("rmqkit_obr")
    rmqkit.outbox.init(dsn)
    yield dsn
    drop_schema(schema)


def _pending(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return int(
            conn.execute(
                "SELECT count(*) FROM rmqkit_outbox WHERE published_at IS NULL"
            ).fetchone()[0]
        )  # type: ignore[index]


def _fill(dsn: str, exchange: str, count: int, aggregates: int | None = None) -> list[str]:
    ids = []
    with psycopg.connect(dsn) as conn, conn.pipeline(), conn.transaction():
        for n in range(count):
            aggregate = None if aggregates is None else f"agg-{n % aggregates}"
            body = {"aggregate": aggregate, "seq": n if aggregates is None else n // aggregates}
            ids.append(
                rmqkit.outbox.add(
                    conn, exchange=exchange, routing_key="ev", body=body, aggregate=aggregate
                )
            )
    return ids


def _wait_file(path: Path, process: object, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, "the relay never reached the pause"
        assert process.poll() is None, process.communicate()
        time.sleep(0.05)


def test_three_relays_share_the_rows_in_order_per_aggregate(vhost: str, pg: str) -> None:
    """20,000 rows, 50 aggregates x 400: every event once, each aggregate in insertion order."""
    exchange, queue = f"ev-{uuid.uuid4().hex[:6]}", f"ev-{uuid.uuid4().hex[:6]}"
    declare(vhost, exchange, queue)
    ids = _fill(pg, exchange, 20_000, aggregates=50)
    relays = [relay_process(pg, vhost, "--batch", "200", "--poll", "200ms") for _ in range(3)]
    try:
        deadline = time.monotonic() + 240
        while _pending(pg):
            assert time.monotonic() < deadline, f"{_pending(pg)} rows still pending"
            assert all(r.poll() is None for r in relays), [r.communicate() for r in relays]
            time.sleep(0.5)
    finally:
        for relay in relays:
            relay.send_signal(signal.SIGTERM)
    outputs = [relay.communicate(timeout=60) for relay in relays]
    assert [relay.returncode for relay in relays] == [0, 0, 0], outputs
    published = [int(out.split()[1].rstrip(",")) for out, _ in outputs]
    assert sum(published) == 20_000  # each row marked by exactly one relay
    got = collect(vhost, queue)
    counts = collections.Counter(m["message_id"] for m in got)
    assert len(got) == 20_000 and set(counts) == set(ids)  # every event, none twice
    last: dict[str, int] = {}
    for message in got:  # the queue's order is the order the broker took them in
        body = json.loads(message["body"])
        assert body["seq"] > last.get(body["aggregate"], -1), body
        last[body["aggregate"]] = body["seq"]
    assert len(last) == 50 and set(last.values()) == {399}
    print(f"rows published per relay: {published}")


def test_kill_9_between_confirm_and_mark_duplicates_only_that_batch(
    vhost: str, pg: str, tmp_path: Path
) -> None:
    exchange, queue = f"ev-{uuid.uuid4().hex[:6]}", f"ev-{uuid.uuid4().hex[:6]}"
    declare(vhost, exchange, queue)
    ids = _fill(pg, exchange, 1000)
    marker = tmp_path / "paused"
    relay = relay_process(pg, vhost, "--batch", "100", env={PAUSE: "120", MARKER: str(marker)})
    try:
        _wait_file(marker, relay)  # batch 1 (rows 1..100) confirmed, not marked
    finally:
        relay.send_signal(signal.SIGKILL)
        relay.communicate(timeout=30)
    assert _pending(pg) == 1000  # nothing marked
    deadline = time.monotonic() + 30
    while True:  # PostgreSQL rolls the dead relay's claim back when it sees the socket close
        run = outbox("relay", "--dsn", pg, "--once", vhost=vhost)
        if run.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert run.returncode == 0, run.stdout + run.stderr
    counts = collections.Counter(m["message_id"] for m in collect(vhost, queue))
    assert set(counts) == set(ids)  # every event on the broker
    duplicates = {mid for mid, n in counts.items() if n > 1}
    assert duplicates == set(ids[:100])  # exactly the killed batch, each twice
    assert max(counts.values()) == 2
    assert _pending(pg) == 0


def test_sigterm_finishes_the_batch_in_flight(vhost: str, pg: str, tmp_path: Path) -> None:
    exchange, queue = f"ev-{uuid.uuid4().hex[:6]}", f"ev-{uuid.uuid4().hex[:6]}"
    declare(vhost, exchange, queue)
    ids = _fill(pg, exchange, 300)
    marker = tmp_path / "paused"
    relay = relay_process(pg, vhost, "--batch", "100", env={PAUSE: "2", MARKER: str(marker)})
    _wait_file(marker, relay)
    relay.send_signal(signal.SIGTERM)  # during the pause: confirmed, not yet marked
    out, err = relay.communicate(timeout=30)
    assert relay.returncode == 0, err
    assert out.startswith("published 100,")
    assert _pending(pg) == 200  # the batch in flight was marked, no other batch started
    got = [m["message_id"] for m in collect(vhost, queue)]
    assert got == ids[:100]


@pytest.mark.timing
def test_metrics_and_notify_latency(vhost: str, pg: str) -> None:
    """A relay idle on LISTEN picks a commit up well before its 10 s poll; /metrics counts it."""
    import httpx

    exchange, queue = f"ev-{uuid.uuid4().hex[:6]}", f"ev-{uuid.uuid4().hex[:6]}"
    declare(vhost, exchange, queue)
    port = 29_000 + os.getpid() % 1000
    relay = relay_process(pg, vhost, "--poll", "10s", "--metrics-port", str(port))
    try:
        metrics = ""
        deadline = time.monotonic() + 30
        while "rmqkit_outbox_pending" not in metrics:  # up, connected, listening
            assert time.monotonic() < deadline and relay.poll() is None
            time.sleep(0.2)
            try:
                metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
            except httpx.HTTPError:
                continue
        time.sleep(0.5)
        started = time.monotonic()
        (mid,) = _fill(pg, exchange, 1)
        while _pending(pg):
            assert time.monotonic() - started < 5, "the NOTIFY did not wake the relay"
            time.sleep(0.02)
        assert [m["message_id"] for m in collect(vhost, queue)] == [mid]
        deadline = time.monotonic() + 10
        while "rmqkit_outbox_published_total 1.0" not in metrics:
            assert time.monotonic() < deadline, metrics
            time.sleep(0.2)
            metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    finally:
        relay.send_signal(signal.SIGTERM)
        relay.communicate(timeout=30)
    assert relay.returncode == 0

"""Outbox relay benchmark (issue 12): relay throughput and commit-to-confirm latency on PostgreSQL,
beside rmqkit's own confirmed publish of the same messages, in the same run.

Run from the repository root (broker from scripts/broker-up, PostgreSQL from scripts/postgres-up)::

    .venv/bin/python -m bench.outbox_relay --rounds 3 --rows 20000 --json bench/results/outbox-DATE.json

What it does, per round (contenders in an order rotated every round, medians over rounds):

``publish``      rmqkit's confirmed publish, in-process: ``publish_messages(settings, "bench.out",
                 "bench.q", N messages)`` (window 1,000), timed around the call (connect, the
                 exchange check, publishing, closing). The bodies and ids are the relay's rows'.
``relay-b200``   one ``rmqkit outbox relay --batch 200`` process, started and idle (connected,
                 LISTENing) before the rows exist; the N rows are inserted and committed in one
                 transaction; timed from that commit until no row is pending (polled every 20 ms):
                 rows published and marked per second.
``relay-b1``     the same with ``--batch 1`` on N/10 rows (one transaction per row).
``relay-3x200``  three relay processes, ``--batch 200``, N rows.

Rows have no aggregate (free to share between relays); bodies are 256 bytes. After every run the
queue must hold exactly the messages of that run (passive declare), else the run is invalid.
Latency: one relay (``--batch 200``) with LISTEN/NOTIFY, then one with ``--no-notify --poll 500ms``;
``--latency-rows`` single-row transactions committed 20-40 ms apart; latency = the row's
``published_at`` (set when its confirm is marked) minus the moment its commit returned (same host,
same clock): p50 / p99.

The machine may be shared (CI, other work): the report records the load average before and
after, and what counts are the ratios within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from bench import common

PG_DSN = os.environ.get("RMQKIT_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")
EXCHANGE, QUEUE = "bench.out", "bench.q"


def _schema_dsn() -> tuple[str, str]:
    import psycopg

    schema = f"rmqkit_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_DSN, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    return schema, f"{PG_DSN}{'&' if '?' in PG_DSN else '?'}options=-csearch_path%3D{schema}"


def _drop_schema(schema: str) -> None:
    import psycopg

    with psycopg.connect(PG_DSN, autocommit=True) as admin:
        admin.execute(f"DROP SCHEMA {schema} CASCADE")


async def _reset_queue(url: str) -> None:
    import aio_pika

    conn = await aio_pika.connect(url)
    try:
        channel = await conn.channel()
        exchange = await channel.declare_exchange(EXCHANGE, "direct", durable=True)
        await channel.queue_delete(QUEUE)
        queue = await channel.declare_queue(QUEUE, durable=True)
        await queue.bind(exchange, QUEUE)
    finally:
        await conn.close()


def _rows(n: int) -> list[tuple[str, bytes]]:
    return [(uuid.uuid4().hex, os.urandom(128).hex().encode()) for _ in range(n)]


def _insert(dsn: str, rows: list[tuple[str, bytes]]) -> float:
    """Insert the rows in one transaction; the time its commit returned."""
    import psycopg

    import rmqkit.outbox

    with psycopg.connect(dsn) as conn:
        with conn.pipeline():
            for mid, body in rows:
                rmqkit.outbox.add(
                    conn, exchange=EXCHANGE, routing_key=QUEUE, body=body, message_id=mid
                )
        conn.commit()
        return time.time()


def _pending(dsn: str) -> int:
    import psycopg

    with psycopg.connect(dsn) as conn:
        return int(
            conn.execute(
                "SELECT count(*) FROM rmqkit_outbox WHERE published_at IS NULL"
            ).fetchone()[0]
        )  # type: ignore[index]


def _start_relays(dsn: str, url: str, count: int, *extra: str) -> list[subprocess.Popen[str]]:
    env = common.cli_env(url)
    relays = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rmqkit",
                "outbox",
                "relay",
                "--dsn",
                dsn,
                "--retention",
                "off",
                *extra,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]
    time.sleep(3.0)  # connected and listening (start-up is not what is measured)
    for relay in relays:
        if relay.poll() is not None:
            raise RuntimeError(f"relay exited: {relay.communicate()}")
    return relays


def _stop(relays: list[subprocess.Popen[str]]) -> list[str]:
    for relay in relays:
        relay.send_signal(signal.SIGTERM)
    return [relay.communicate(timeout=60)[0].strip() for relay in relays]


def _relay_run(url: str, rows: int, relays: int, batch: int) -> dict[str, Any]:
    schema, dsn = _schema_dsn()
    try:
        import rmqkit.outbox

        rmqkit.outbox.init(dsn)
        asyncio.run(_reset_queue(url))
        procs = _start_relays(dsn, url, relays, "--batch", str(batch))
        committed = _insert(dsn, _rows(rows))
        while _pending(dsn):
            time.sleep(0.02)
        elapsed = time.time() - committed
        outputs = _stop(procs)
        depth = asyncio.run(common.depths(url, [QUEUE]))[QUEUE]
        return {
            "rows": rows,
            "seconds": elapsed,
            "rate": rows / elapsed,
            "valid": depth == rows,
            "queue": depth,
            "relays": outputs,
        }
    finally:
        _drop_schema(schema)


def _publish_run(url: str, rows: int) -> dict[str, Any]:
    from rmqkit.publish import OutgoingMessage, publish_messages
    from rmqkit.settings import load_settings

    asyncio.run(_reset_queue(url))
    messages = [OutgoingMessage(body, mid, None) for mid, body in _rows(rows)]
    started = time.perf_counter()
    report = asyncio.run(publish_messages(load_settings(url=url), EXCHANGE, QUEUE, messages))
    elapsed = time.perf_counter() - started
    depth = asyncio.run(common.depths(url, [QUEUE]))[QUEUE]
    return {
        "rows": rows,
        "seconds": elapsed,
        "rate": rows / elapsed,
        "valid": report.confirmed == rows and depth == rows,
        "queue": depth,
    }


def _latency(url: str, count: int, *extra: str) -> dict[str, Any]:
    import psycopg

    import rmqkit.outbox

    schema, dsn = _schema_dsn()
    try:
        rmqkit.outbox.init(dsn)
        asyncio.run(_reset_queue(url))
        procs = _start_relays(dsn, url, 1, "--batch", "200", *extra)
        committed: dict[str, float] = {}
        with psycopg.connect(dsn) as conn:
            for mid, body in _rows(count):
                with conn.transaction():
                    rmqkit.outbox.add(
                        conn, exchange=EXCHANGE, routing_key=QUEUE, body=body, message_id=mid
                    )
                committed[mid] = time.time()
                time.sleep(random.uniform(0.02, 0.04))
        while _pending(dsn):
            time.sleep(0.05)
        _stop(procs)
        with psycopg.connect(dsn) as conn:
            marks = dict(
                conn.execute("SELECT message_id, published_at FROM rmqkit_outbox").fetchall()
            )
        ms = sorted((marks[mid] - at) * 1000 for mid, at in committed.items())
        return {
            "rows": count,
            "p50_ms": statistics.median(ms),
            "p99_ms": ms[int(0.99 * (len(ms) - 1))],
            "max_ms": ms[-1],
        }
    finally:
        _drop_schema(schema)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--latency-rows", type=int, default=200)
    parser.add_argument("--json", default=None, help="write the report here (- for stdout)")
    args = parser.parse_args()
    load_before = os.getloadavg()
    vhost, url = common.create_vhost("bench-outbox")
    contenders = {
        "publish": lambda: _publish_run(url, args.rows),
        "relay-b200": lambda: _relay_run(url, args.rows, 1, 200),
        "relay-b1": lambda: _relay_run(url, max(args.rows // 10, 100), 1, 1),
        "relay-3x200": lambda: _relay_run(url, args.rows, 3, 200),
    }
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in contenders}
    try:
        names = list(contenders)
        for round_no in range(args.rounds):
            order = names[round_no % len(names) :] + names[: round_no % len(names)]
            for name in order:
                result = contenders[name]()
                samples[name].append(result)
                print(
                    f"round {round_no + 1} {name:12} {result['rate']:10.0f} rows/s"
                    f"{'' if result['valid'] else '  INVALID'}",
                    flush=True,
                )
        latency = {
            "notify": _latency(url, args.latency_rows),
            "poll-500ms": _latency(url, args.latency_rows, "--no-notify", "--poll", "500ms"),
        }
    finally:
        common.delete_vhost(vhost)
    medians = {n: statistics.median(s["rate"] for s in v if s["valid"]) for n, v in samples.items()}
    ratios = {
        "batch200_over_batch1": medians["relay-b200"] / medians["relay-b1"],
        "relay200_over_publish": medians["relay-b200"] / medians["publish"],
        "three_over_one": medians["relay-3x200"] / medians["relay-b200"],
    }
    for name, rate in medians.items():
        print(f"median {name:12} {rate:10.0f} rows/s")
    for name, value in ratios.items():
        print(f"ratio  {name:24} {value:6.2f}")
    for name, lat in latency.items():
        print(f"latency {name:10} p50 {lat['p50_ms']:7.1f} ms  p99 {lat['p99_ms']:7.1f} ms")
    report = {
        "benchmark": "outbox_relay",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": common.command_line("bench.outbox_relay"),
        "machine": common.machine_facts(load_before),
        "load_after": os.getloadavg(),
        "versions": common.versions(("rmqkit", "aio-pika", "aiormq", "pamqp", "psycopg")),
        "medians_rows_per_s": medians,
        "ratios": ratios,
        "targets": {
            "batch200_over_batch1": ">= 10",
            "relay200_over_publish": ">= 0.5",
            "three_over_one": ">= 1",
        },
        "latency": latency,
        "samples": samples,
    }
    common.write_report(report, args.json)


if __name__ == "__main__":
    main()

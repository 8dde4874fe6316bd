"""``rmqkit.Publisher`` against a raw aio-pika confirmed publish loop, same broker, same run.

    .venv/bin/python -m bench.publisher_api --rounds 5 --messages 3000 --json bench/results/x.json

One throwaway vhost (deleted at the end) with a durable quorum queue ``bench.api`` bound to a
direct exchange ``bench.api.in``. Per round, in an order rotated every round, each contender
publishes N persistent 256-byte messages with a message_id, ``mandatory``, confirmed; the queue
is purged before each run and must hold exactly N after it (else the run is invalid):

``publisher-many``   ``await pub.publish_many(exchange, key, messages)`` (window 1,000)
``publisher-gather`` ``await asyncio.gather(*(pub.publish(...) for each))``: concurrent callers
``publisher-loop``   ``for each: await pub.publish(...)``: one at a time, as a handler would
``aio-pika``         raw aio-pika: ``channel(publisher_confirms=True)`` then ``for each: await
                     exchange.publish(Message(body, delivery_mode=PERSISTENT, message_id=...),
                     key, mandatory=True)`` — the loop an application writes by hand

Timed: the publishing alone, connection open before (each contender connects once per run,
outside the timed window). Prints medians (messages/s) and the ratios to aio-pika; the target
is publisher-many >= 2x aio-pika.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python bench/publisher_api.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aio_pika

import rmqkit
from bench import common

EXCHANGE = "bench.api.in"
QUEUE = "bench.api"
BODY = b"x" * 256
CONTENDERS = ("publisher-many", "publisher-gather", "publisher-loop", "aio-pika")
TARGET = 2.0

Run = Callable[[str, int], Awaitable[float]]


async def _setup(url: str) -> None:
    conn = await aio_pika.connect(url)
    try:
        channel = await conn.channel()
        ex = await channel.declare_exchange(EXCHANGE, "direct", durable=True)
        queue = await channel.declare_queue(
            QUEUE, durable=True, arguments={"x-queue-type": "quorum"}
        )
        await queue.bind(ex, routing_key=QUEUE)
    finally:
        await conn.close()


async def _purge(url: str) -> None:
    conn = await aio_pika.connect(url)
    try:
        channel = await conn.channel()
        queue = await channel.get_queue(QUEUE, ensure=False)
        await queue.purge()
    finally:
        await conn.close()


def _ids(n: int) -> list[str]:
    return [uuid.uuid4().hex for _ in range(n)]


async def _publisher(url: str, n: int, how: str) -> float:
    settings = rmqkit.load_settings(url=url)
    ids = _ids(n)
    async with rmqkit.Publisher.connect(settings) as pub:
        started = time.perf_counter()
        if how == "many":
            messages = [rmqkit.PublishMessage(BODY, message_id=i) for i in ids]
            results = await pub.publish_many(EXCHANGE, QUEUE, messages)
        elif how == "gather":
            results = list(
                await asyncio.gather(
                    *(pub.publish(EXCHANGE, QUEUE, BODY, message_id=i) for i in ids)
                )
            )
        else:
            results = [await pub.publish(EXCHANGE, QUEUE, BODY, message_id=i) for i in ids]
        elapsed = time.perf_counter() - started
    assert len(results) == n and all(r.confirmed for r in results)
    return elapsed


async def _aiopika(url: str, n: int) -> float:
    ids = _ids(n)
    conn = await aio_pika.connect(url)
    try:
        channel = await conn.channel(publisher_confirms=True, on_return_raises=True)
        exchange = await channel.get_exchange(EXCHANGE)
        started = time.perf_counter()
        for message_id in ids:
            await exchange.publish(
                aio_pika.Message(
                    BODY, delivery_mode=aio_pika.DeliveryMode.PERSISTENT, message_id=message_id
                ),
                QUEUE,
                mandatory=True,
            )
        return time.perf_counter() - started
    finally:
        await conn.close()


RUNS: dict[str, Run] = {
    "publisher-many": lambda url, n: _publisher(url, n, "many"),
    "publisher-gather": lambda url, n: _publisher(url, n, "gather"),
    "publisher-loop": lambda url, n: _publisher(url, n, "loop"),
    "aio-pika": _aiopika,
}


async def bench(url: str, rounds: int, n: int) -> dict[str, Any]:
    await _setup(url)
    samples: list[dict[str, Any]] = []
    for round_no in range(rounds):
        order = CONTENDERS[round_no % len(CONTENDERS) :] + CONTENDERS[: round_no % len(CONTENDERS)]
        for contender in order:
            await _purge(url)
            elapsed = await RUNS[contender](url, n)
            held = (await common.depths(url, [QUEUE]))[QUEUE]
            samples.append(
                {
                    "round": round_no + 1,
                    "contender": contender,
                    "messages": n,
                    "seconds": elapsed,
                    "rate": n / elapsed,
                    "held": held,
                    "valid": held == n,
                }
            )
            print(f"round {round_no + 1} {contender:17} {n / elapsed:10.0f} msg/s", flush=True)
    medians = {
        c: statistics.median(s["rate"] for s in samples if s["contender"] == c and s["valid"])
        for c in CONTENDERS
    }
    ratios = {c: medians[c] / medians["aio-pika"] for c in CONTENDERS}
    return {
        "benchmark": "publisher_api",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "messages": n,
        "rounds": rounds,
        "body_bytes": len(BODY),
        "queue": "quorum",
        "median_rate": medians,
        "ratio_to_aiopika": ratios,
        "target": f"publisher-many >= {TARGET}x aio-pika",
        "target_met": ratios["publisher-many"] >= TARGET,
        "samples": samples,
        "versions": common.versions(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    vhost, url = common.create_vhost("bench-publisher-api")
    try:
        report = asyncio.run(bench(url, args.rounds, args.messages))
    finally:
        common.delete_vhost(vhost)
    print("median msg/s:", {k: round(v) for k, v in report["median_rate"].items()})
    print("ratio to aio-pika:", {k: round(v, 2) for k, v in report["ratio_to_aiopika"].items()})
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0 if report["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())

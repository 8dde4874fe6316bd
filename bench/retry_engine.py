"""Retries held back by wait queues against the broker's own delayed retry (RabbitMQ 4.3), and a
raw aio-pika loop on the broker's, same broker, same run: broker CPU and lateness.

Run from the repository root against a 4.3 node::

    set -a; eval "$(scripts/broker-up --version 4.3 --env)"; set +a
    RMQKIT_BENCH_URL=$RMQKIT_TEST_URL RMQKIT_BENCH_MANAGEMENT_URL=$RMQKIT_TEST_MANAGEMENT_URL \\
        .venv/bin/python -m bench.retry_engine --rounds 5 --messages 2000 --json out.json

Each round, for each contender (order rotated every round), in a vhost of its own: N messages
are published at once to a work queue whose handler fails each message's first attempt and
acks its second; the retry delay is 1 s (one tier, no jitter, so both engines are asked for the
same wait). Lateness: the time between a message's two deliveries minus 1 s (the handler
stamps both with time.monotonic). Broker CPU: the node's utime + stime over the whole round
(publish to the last ack). Contenders:

``rmqkit-queues``   rmqkit.Consumer, retry_engine = "queues": a retry copy to the wait queue,
                    confirmed, then the original acked; the wait queue's TTL dead-letters it back.
``rmqkit-broker``   rmqkit.Consumer, retry_engine = "broker": basic.reject(requeue=True), held by
                    the work queue's delayed retry.
``aio-pika-broker`` raw aio-pika on the same broker-retry queue: reject(requeue=True), then ack.

The result: per contender the medians over rounds of broker CPU, lateness p50/p99/max and
wall time, and the ratios of rmqkit-broker to rmqkit-queues and to aio-pika-broker.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python bench/retry_engine.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common

CONTENDERS = ("rmqkit-queues", "rmqkit-broker", "aio-pika-broker")
DELAY_S = 1.0
TOPOLOGY = """
[exchanges."rb"]
type = "direct"

[queues."rb.work"]
bind = [{{ exchange = "rb", routing_key = "job" }}]
retry_delays = ["1s"]
max_attempts = 2
prefetch = 200
{engine}
"""
WORK = "rb.work"


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def _publish(url: str, n: int) -> None:
    import aio_pika

    conn = await aio_pika.connect(url)
    try:
        channel = await conn.channel()
        exchange = await channel.get_exchange("rb")
        for i in range(n):
            await exchange.publish(
                aio_pika.Message(b"{}", message_id=f"m{i}", delivery_mode=2), routing_key="job"
            )
    finally:
        await conn.close()


async def _run_rmqkit(url: str, topology: Path, n: int, first: dict[str, float],
                      gaps: list[float]) -> None:  # fmt: skip
    import rmqkit
    from rmqkit.settings import load_settings

    done = asyncio.Event()

    async def handle(message: rmqkit.Message) -> None:
        key = str(message.message_id)
        if key not in first:
            first[key] = time.monotonic()
            raise ConnectionError("first attempt fails")
        gaps.append(time.monotonic() - first[key])
        if len(gaps) == n:
            done.set()

    settings = load_settings(url=url, management_url=common.MGMT_URL)
    consumer = rmqkit.Consumer(handle, queue=WORK, topology=topology, settings=settings)
    await consumer.start()
    try:
        await _publish(url, n)
        await asyncio.wait_for(done.wait(), 300)
    finally:
        await consumer.stop(grace_s=10)


async def _run_raw(url: str, n: int, first: dict[str, float], gaps: list[float]) -> None:
    import aio_pika

    done = asyncio.Event()
    conn = await aio_pika.connect(url)
    try:
        channel = await conn.channel()
        await channel.set_qos(prefetch_count=200)
        queue = await channel.get_queue(WORK, ensure=False)

        async def on_message(message: Any) -> None:
            key = str(message.message_id)
            if key not in first:
                first[key] = time.monotonic()
                await message.reject(requeue=True)
                return
            gaps.append(time.monotonic() - first[key])
            await message.ack()
            if len(gaps) == n:
                done.set()

        await queue.consume(on_message)
        await _publish(url, n)
        await asyncio.wait_for(done.wait(), 300)
    finally:
        await conn.close()


def one_run(contender: str, n: int, workdir: Path) -> dict[str, Any]:
    """One contender, one round, in a vhost of its own."""
    engine = 'retry_engine = "queues"\njitter = 0.0\njitter_slots = 1'
    if contender != "rmqkit-queues":
        engine = 'retry_engine = "broker"'
    topology = workdir / f"{contender}-{uuid.uuid4().hex[:6]}.toml"
    topology.write_text(TOPOLOGY.format(engine=engine), encoding="utf-8")
    vhost, url = common.create_vhost("bench-retry")
    first: dict[str, float] = {}
    gaps: list[float] = []
    try:
        common.declare(topology, url)
        with common.CpuWatch() as watch:
            if contender == "aio-pika-broker":
                asyncio.run(_run_raw(url, n, first, gaps))
            else:
                asyncio.run(_run_rmqkit(url, topology, n, first, gaps))
    finally:
        common.delete_vhost(vhost)
    late = [max(0.0, gap - DELAY_S) for gap in gaps]
    early = sum(1 for gap in gaps if gap < DELAY_S)
    return {
        "contender": contender,
        "messages": n,
        "wall_s": round(watch.seconds, 3),
        "broker_cpu_s": round(watch.broker_cpu_s, 3),
        "foreign_share": round(watch.foreign_share, 3),
        "late_p50_ms": round(_percentile(late, 0.5) * 1000, 1),
        "late_p99_ms": round(_percentile(late, 0.99) * 1000, 1),
        "late_max_ms": round(max(late) * 1000, 1),
        "early": early,  # retries delivered before their delay
        "earliest_ms": round((min(gaps) - DELAY_S) * 1000, 1),  # < 0: that much early
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians per contender, and the broker engine's ratios to the others."""
    out: dict[str, Any] = {}
    for contender in CONTENDERS:
        mine = [r for r in runs if r["contender"] == contender]
        if not mine:
            continue
        out[contender] = {
            key: statistics.median(r[key] for r in mine)
            for key in ("wall_s", "broker_cpu_s", "late_p50_ms", "late_p99_ms", "late_max_ms")
        }
        out[contender]["early"] = sum(r["early"] for r in mine)
        out[contender]["earliest_ms"] = min(r["earliest_ms"] for r in mine)
        out[contender]["rounds"] = len(mine)
    queues, broker, raw = (out.get(c) for c in CONTENDERS)
    if broker and queues:
        out["broker_vs_queues"] = {
            "broker_cpu": round(broker["broker_cpu_s"] / queues["broker_cpu_s"], 2),
            "late_p99": round(broker["late_p99_ms"] / max(queues["late_p99_ms"], 0.1), 2),
        }
    if broker and raw:
        out["broker_vs_aiopika"] = {
            "broker_cpu": round(broker["broker_cpu_s"] / raw["broker_cpu_s"], 2),
            "wall": round(broker["wall_s"] / raw["wall_s"], 2),
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--json", dest="json_out", default=None, help="write the report here")
    args = parser.parse_args()
    common.wait_for_broker(common.BASE_URL)
    load = __import__("os").getloadavg()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for round_no in range(args.rounds):
            order = CONTENDERS[round_no % 3 :] + CONTENDERS[: round_no % 3]
            for contender in order:
                run = one_run(contender, args.messages, Path(tmp))
                run["round"] = round_no
                runs.append(run)
                print(json.dumps(run), flush=True)
    summary = summarize(runs)
    report = {
        "benchmark": "retry_engine",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": common.command_line("bench.retry_engine"),
        "machine": common.machine_facts(load),
        "broker": common.broker_facts(),
        "versions": common.versions(),
        "code": common.code_state(),
        "runs": runs,
        "summary": summary,
    }
    print(json.dumps(summary, indent=2))
    common.write_report(report, args.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Pruning 1,000,000 processed ids while a ``--dedupe`` consumer runs on PostgreSQL: the
consumer's throughput before and during the prune, its longest stall, and that ids younger than
the window still count as duplicates.

Run from the repository root (broker and PostgreSQL as for the tests)::

    .venv/bin/python -m bench.dedupe_prune --ids 1000000 --messages 120000 --json out.json

1. a fresh store (a new schema) with ``--ids`` ids recorded 8 days ago (older than the 7-day
   window) plus 1,000 recorded an hour ago (younger);
2. ``bench.work`` filled with ``--messages`` new ids plus those 1,000 young ones again;
3. a consumer (in a subprocess, ``--dedupe``, no-op handler that notes when it ran) consumes;
   after ``--warmup`` seconds the same process runs ``rmqkit.idempotency.prune`` (batch
   ``--batch``) in a thread;
4. reported: messages/s in the seconds before the prune and while it ran, the longest gap
   between two handler completions before and during the prune, the prune's own time and
   longest batch, and how many of the young ids reached the handler (must be 0).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench import consume_throughput as ct

PG_BASE = os.environ.get("RMQKIT_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")
DONE: list[float] = []  # perf_counter() of each handler call, in the worker
SEEN: set[str] = set()


async def noting(message) -> None:  # type: ignore[no-untyped-def]
    """The no-op handler that notes when it ran and which id it saw (unannotated: rmqkit passes
    its Message; ``Any`` would make it validate the body as JSON)."""
    DONE.append(time.perf_counter())
    SEEN.add(message.message_id)


async def _worker(url: str, n: int, dsn: str, warmup_s: float, batch: int) -> dict[str, Any]:
    from bench import dedupe_prune as loaded  # the handler's module (this one runs as __main__)
    from rmqkit.consumer.config import ConsumerFlags, build_config, policy_from_topology
    from rmqkit.consumer.dedupe import dedupe_config
    from rmqkit.consumer.handler import load_handler
    from rmqkit.consumer.metrics import ConsumerMetrics
    from rmqkit.consumer.runner import QueueConsumer
    from rmqkit.idempotency import prune
    from rmqkit.settings import load_settings
    from rmqkit.topology import load_topology

    done, seen = loaded.DONE, loaded.SEEN
    spec = load_topology(ct.TOPOLOGY)
    handler = load_handler("bench.dedupe_prune:noting", cwd=common.ROOT)
    flags = ConsumerFlags(dedupe=dedupe_config(dsn, handler))
    policy = policy_from_topology(spec, ct.QUEUE, None)
    config = build_config("bench.dedupe_prune:noting", ct.QUEUE, policy, flags, spec)
    metrics = ConsumerMetrics(config.queue, config.tier_names)
    consumer = QueueConsumer(load_settings(url=url), config, handler, metrics)
    assert consumer.dedupe is not None
    await consumer.dedupe.start()
    run = asyncio.create_task(consumer.run())
    while not done:  # noqa: ASYNC110 (a benchmark's poll, as consume_throughput's _watch)
        await asyncio.sleep(0.01)
    started = time.perf_counter()
    await asyncio.sleep(warmup_s)
    prune_start = time.perf_counter()
    result = await asyncio.to_thread(prune, dsn, batch=batch)
    prune_end = time.perf_counter()
    while consumer.processed < n and not run.done():  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    consumer.stop()
    await asyncio.wait_for(run, timeout=30)
    await consumer.dedupe.close()

    def window(a: float, b: float) -> dict[str, float]:
        times = [t for t in done if a <= t < b]
        gaps = [y - x for x, y in itertools.pairwise(times)]
        return {
            "seconds": b - a,
            "handled": len(times),
            "msg_per_s": len(times) / (b - a) if b > a else 0.0,
            "longest_gap_ms": max(gaps, default=0.0) * 1000,
        }

    return {
        "before": window(started, prune_start),
        "during": window(prune_start, prune_end),
        "prune": result.as_dict(),
        "settled": consumer.processed,
        "handled": len(done),
        "duplicates": metrics._duplicates,
        "young_handled": sum(1 for m in seen if m.startswith("young-")),
        "finished_before_prune_ended": consumer.processed >= n and done[-1] < prune_end,
    }


def worker_main(args: argparse.Namespace) -> int:
    url = common.with_vhost(common.BASE_URL, args.vhost)
    result = asyncio.run(_worker(url, args.messages, args.dsn, args.warmup, args.batch))
    print(json.dumps(result), flush=True)
    return 0


async def _publish(url: str, ids: list[str]) -> None:
    import aiormq
    from pamqp import commands as spec

    conn = await aiormq.connect(url)
    try:
        channel = await conn.channel(publisher_confirms=True)
        for first in range(0, len(ids), 1000):
            await asyncio.gather(
                *(
                    channel.basic_publish(
                        b"x" * 64,
                        routing_key=ct.QUEUE,
                        properties=spec.Basic.Properties(delivery_mode=2, message_id=mid),
                    )
                    for mid in ids[first : first + 1000]
                )
            )
    finally:
        await conn.close()


def orchestrate(args: argparse.Namespace) -> int:
    import psycopg

    from rmqkit.idempotency import init_store

    schema = f"rmqkit_prune_{uuid.uuid4().hex[:8]}"
    sep = "&" if "?" in PG_BASE else "?"
    dsn = f"{PG_BASE}{sep}options=-csearch_path%3D{schema}"
    log_dir = Path(tempfile.mkdtemp(prefix="rmqkit-dedupe-prune-"))
    load_before = os.getloadavg()
    with psycopg.connect(PG_BASE, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    vhost, url = common.create_vhost("rmqkit-bench-prune")
    try:
        init_store(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            now = time.time()
            conn.execute(
                "INSERT INTO rmqkit_processed (message_id, queue, processed_at) "
                "SELECT 'old-' || i, '', %s FROM generate_series(1, %s) AS i",
                (now - 8 * 86400, args.ids),
            )
            conn.execute(
                "INSERT INTO rmqkit_processed (message_id, queue, processed_at) "
                "SELECT 'young-' || i, '', %s FROM generate_series(1, 1000) AS i",
                (now - 3600,),
            )
            conn.execute("VACUUM ANALYZE rmqkit_processed")
        common.declare(ct.TOPOLOGY, url)
        young = [f"young-{i}" for i in range(1, 1001)]
        fresh = [uuid.uuid4().hex for _ in range(args.messages)]
        # the young ids spread through the stream, so some arrive while the prune runs
        step = max(1, len(fresh) // len(young))
        stream: list[str] = []
        for index, mid in enumerate(fresh):
            stream.append(mid)
            if index % step == 0 and young:
                stream.append(young.pop())
        stream.extend(young)
        asyncio.run(_publish(url, stream))
        cmd = [
            *common.worker_cmd(["-m", "bench.dedupe_prune"], "consumer", vhost, len(stream)),
            "--dsn",
            dsn,
            "--warmup",
            str(args.warmup),
            "--batch",
            str(args.batch),
        ]
        with common.CpuWatch() as watch:
            result = common.run_json_worker(cmd, log_dir / "worker.log", 900, "consumer")
        left = asyncio.run(common.depths(url, ct._queue_names()))
    finally:
        common.delete_vhost(vhost)
        with psycopg.connect(PG_BASE, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")
    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "params": vars(args),
        "machine": common.machine_facts(load_before),
        "foreign_cpu_share": round(watch.foreign_share, 3),
        "left_in_queues": {k: v for k, v in left.items() if v},
        **result,
    }
    before, during, prune = result["before"], result["during"], result["prune"]
    print(
        f"before prune: {before['msg_per_s']:,.0f} msg/s, longest gap "
        f"{before['longest_gap_ms']:.0f} ms ({before['seconds']:.1f}s)\n"
        f"during prune: {during['msg_per_s']:,.0f} msg/s, longest gap "
        f"{during['longest_gap_ms']:.0f} ms ({during['seconds']:.1f}s)\n"
        f"prune: {prune['deleted']:,} ids in {prune['batches']} batches, "
        f"{prune['elapsed_s']:.1f}s, longest batch {prune['longest_batch_s'] * 1000:.0f} ms\n"
        f"young ids handled again: {result['young_handled']} (duplicates {result['duplicates']})"
        f"; others used {watch.foreign_share:.0%} of the CPUs"
    )
    common.write_report(report, args.json)
    return 0 if result["young_handled"] == 0 and not report["left_in_queues"] else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ids", type=int, default=1_000_000)
    parser.add_argument("--messages", type=int, default=120_000)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--json")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--vhost", help=argparse.SUPPRESS)
    parser.add_argument("--dsn", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(args)
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())

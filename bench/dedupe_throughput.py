"""Consumer throughput with ``--dedupe`` (PostgreSQL, SQLite) against the same consumer without
it, in one run; also one transaction per message (``--dedupe-batch 1``), the naive baseline.

Run from the repository root (broker and PostgreSQL as for the tests)::

    .venv/bin/python -m bench.dedupe_throughput --rounds 3 --messages 20000 --json out.json

Per round and contender (order rotated every round): fill ``bench.work`` (bench/topology.toml,
the consume_throughput benchmark's queue) with N persistent messages with distinct ids, make a
fresh store (a new PostgreSQL schema or SQLite file, ``init_store``), then run the consumer in a
subprocess of its own until N messages are settled and acked; every queue must be empty after,
and the store must hold N ids. The handler is a no-op (``bench.handlers:noop``; ``*-tx``: a
no-op that takes the ``rmqkit.Transaction``, so each message runs in a SAVEPOINT).

Contenders: ``plain`` (no --dedupe), ``pg`` / ``sqlite`` (defaults: batch 100, 4 connections on
PostgreSQL, 1 on SQLite), ``pg-tx``, ``pg-per-message`` / ``sqlite-per-message`` (batch 1).
PostgreSQL is RMQKIT_TEST_POSTGRES_DSN (default the local ``test`` database).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python bench/dedupe_throughput.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import rmqkit
from bench import common
from bench import consume_throughput as ct

PG_BASE = os.environ.get("RMQKIT_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")
# name: (backend or None, batch, handler)
CONTENDERS: dict[str, tuple[str | None, int, str]] = {
    "plain": (None, 100, "bench.handlers:noop"),
    "pg": ("postgresql", 100, "bench.handlers:noop"),
    "pg-tx": ("postgresql", 100, "bench.dedupe_throughput:noop_tx"),
    "pg-per-message": ("postgresql", 1, "bench.handlers:noop"),
    "sqlite": ("sqlite", 100, "bench.handlers:noop"),
    "sqlite-per-message": ("sqlite", 1, "bench.handlers:noop"),
}


async def noop_tx(message: rmqkit.Message, tx: rmqkit.Transaction) -> None:
    """A no-op that takes the transaction (so it runs in a SAVEPOINT of the batch)."""
    from bench.handlers import _tick

    _tick()


# --- worker side -------------------------------------------------------------------------------


async def _worker(
    url: str, n: int, dsn: str | None, batch: int, handler_spec: str, connections: int | None
) -> Any:
    from rmqkit.consumer.config import ConsumerFlags, build_config, policy_from_topology
    from rmqkit.consumer.dedupe import dedupe_config
    from rmqkit.consumer.handler import load_handler
    from rmqkit.consumer.logs import configure_logging
    from rmqkit.consumer.metrics import ConsumerMetrics
    from rmqkit.consumer.runner import QueueConsumer
    from rmqkit.settings import load_settings
    from rmqkit.topology import load_topology

    settings = load_settings(url=url)
    spec = load_topology(ct.TOPOLOGY)
    handler = load_handler(handler_spec, cwd=common.ROOT)
    flags = ConsumerFlags(dedupe=dedupe_config(dsn, handler, batch=batch, connections=connections))
    config = build_config(
        handler_spec, ct.QUEUE, policy_from_topology(spec, ct.QUEUE, None), flags, spec
    )
    configure_logging(config.log_format)
    metrics = ConsumerMetrics(config.queue, config.tier_names)
    consumer = QueueConsumer(settings, config, handler, metrics)
    if consumer.dedupe is not None:
        await consumer.dedupe.start()
    run = asyncio.create_task(consumer.run())

    def done() -> bool:
        if run.done():
            run.result()
        return consumer.processed >= n and consumer.dispatcher._tracker.outstanding == 0

    try:
        result = await ct._watch(done)
    finally:
        consumer.stop()
        await asyncio.wait_for(run, timeout=30)
        if consumer.dedupe is not None:
            await consumer.dedupe.close()
    return {
        **result,
        "settled": consumer.processed,
        "duplicates": metrics._duplicates,
        "transactions": consumer.dedupe.lanes.transactions if consumer.dedupe else 0,
        "retried": sum(metrics._retried.values()),
        "parked": sum(metrics._parked.values()),
        "reconnects": metrics._reconnects,
    }


def worker_main(args: argparse.Namespace) -> int:
    backend, batch, handler = CONTENDERS[args.worker]
    url = common.with_vhost(common.BASE_URL, args.vhost)
    result = common.run_profiled(
        _worker(url, args.messages, args.dsn, batch, handler, args.connections), args.cprofile
    )
    result.update(contender=args.worker, messages=args.messages, backend=backend, batch=batch)
    print(json.dumps(result), flush=True)
    return 0


# --- orchestrator side ---------------------------------------------------------------------------


class _Store:
    """A fresh store for one run: a PostgreSQL schema or a SQLite file; removed after."""

    def __init__(self, backend: str, tmp: Path) -> None:
        from rmqkit.idempotency import init_store

        self.backend, self.schema = backend, ""
        if backend == "sqlite":
            self.dsn = f"sqlite:///{tmp / f'dedupe-{uuid.uuid4().hex[:6]}.db'}"
        else:
            import psycopg

            self.schema = f"rmqkit_bench_{uuid.uuid4().hex[:8]}"
            with psycopg.connect(PG_BASE, autocommit=True) as admin:
                admin.execute(f"CREATE SCHEMA {self.schema}")
            sep = "&" if "?" in PG_BASE else "?"
            self.dsn = f"{PG_BASE}{sep}options=-csearch_path%3D{self.schema}"
        init_store(self.dsn)

    def ids(self) -> int:
        from rmqkit.idempotency import dedupe_status

        return dedupe_status(self.dsn).rows

    def drop(self) -> None:
        if self.schema:
            import psycopg

            with psycopg.connect(PG_BASE, autocommit=True) as admin:
                admin.execute(f"DROP SCHEMA {self.schema} CASCADE")
        else:
            for suffix in ("", "-wal", "-shm"):
                Path(self.dsn.removeprefix("sqlite:///") + suffix).unlink(missing_ok=True)


def _run(
    contender: str,
    vhost: str,
    n: int,
    dsn: str | None,
    log_dir: Path,
    tag: str,
    connections: int | None,
) -> Any:
    cmd = common.worker_cmd(["-m", "bench.dedupe_throughput"], contender, vhost, n)
    if os.environ.get("RMQKIT_BENCH_CPROFILE"):
        cmd += ["--cprofile", str(log_dir / f"{tag}.prof")]
    if dsn is not None:
        cmd += ["--dsn", dsn]
    if connections is not None:
        cmd += ["--connections", str(connections)]
    return common.run_json_worker(cmd, log_dir / f"{tag}.log", ct.WORKER_TIMEOUT_S + 60, contender)


def _summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for name in CONTENDERS:
        runs = [s for s in samples if s["contender"] == name and not s.get("invalid")]
        if not runs:
            continue
        rates = [r["messages"] / r["seconds"] for r in runs]
        summary[name] = {
            "runs": len(runs),
            "msg_per_s_median": statistics.median(rates),
            "msg_per_s_all": [round(x) for x in rates],
            "cpu_us_per_msg_median": statistics.median(
                r["cpu_seconds"] / r["messages"] * 1e6 for r in runs
            ),
            "foreign_cpu_share_max": max(r.get("foreign_cpu_share", 0.0) for r in runs),
        }
    plain = summary.get("plain")
    for entry in summary.values():
        if plain:
            entry["ratio_vs_plain"] = entry["msg_per_s_median"] / plain["msg_per_s_median"]
    return summary


def _table(summary: dict[str, Any]) -> str:
    head = (
        f"{'contender':<20}{'runs':>5}{'msg/s (median)':>16}{'x plain':>9}{'CPU µs/msg':>12}"
        f"{'others':>8}  all"
    )
    lines = [head, "-" * len(head)]
    for name in CONTENDERS:
        s = summary.get(name)
        if s is None:
            continue
        ratio = s.get("ratio_vs_plain")
        lines.append(
            f"{name:<20}{s['runs']:>5}{s['msg_per_s_median']:>16,.0f}"
            f"{(f'{ratio:.2f}x' if ratio else '-'):>9}{s['cpu_us_per_msg_median']:>12.1f}"
            f"{s['foreign_cpu_share_max']:>8.0%}  {', '.join(f'{x:,}' for x in s['msg_per_s_all'])}"
        )
    lines.append("others: the most CPU other processes took during one of its runs")
    return "\n".join(lines)


def orchestrate(args: argparse.Namespace) -> int:
    contenders = [c for c in CONTENDERS if c in args.only] if args.only else list(CONTENDERS)
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="rmqkit-dedupe-bench-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    names = ct._queue_names()
    samples: list[dict[str, Any]] = []
    started, load_before = time.monotonic(), os.getloadavg()
    vhost, url = common.create_vhost("rmqkit-bench-dedupe")
    try:
        common.declare(ct.TOPOLOGY, url)
        for rnd in range(args.rounds):
            shift = rnd % len(contenders)
            for contender in contenders[shift:] + contenders[:shift]:
                backend = CONTENDERS[contender][0]
                asyncio.run(ct._purge(url, names))
                asyncio.run(ct._fill(url, args.messages))
                store = _Store(backend, log_dir) if backend else None
                try:
                    with common.CpuWatch() as watch:
                        result = _run(
                            contender,
                            vhost,
                            args.messages,
                            store.dsn if store else None,
                            log_dir,
                            f"r{rnd + 1}-{contender}",
                            args.connections,
                        )
                    left = asyncio.run(common.depths(url, names))
                    recorded = store.ids() if store else args.messages
                finally:
                    if store is not None:
                        store.drop()
                problems = []
                if any(left.values()):
                    problems.append(f"left {left}")
                if recorded != args.messages:
                    problems.append(f"{recorded} ids recorded")
                if result.get("reconnects") or result.get("parked") or result.get("duplicates"):
                    problems.append("reconnected, parked or duplicates")
                result.update(
                    round=rnd + 1,
                    invalid="; ".join(problems) or None,
                    foreign_cpu_share=round(watch.foreign_share, 3),
                )
                samples.append(result)
                rate = result["messages"] / result["seconds"]
                print(
                    f"round {rnd + 1} {contender:<20} {rate:>9,.0f} msg/s  "
                    f"{result['messages'] / max(1, result['transactions']):5.1f} msg/commit  "
                    f"others {watch.foreign_share:.0%}"
                    + (f"  INVALID ({result['invalid']})" if result["invalid"] else ""),
                    flush=True,
                )
    finally:
        common.delete_vhost(vhost)
    summary = _summarize(samples)
    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "params": {
            "rounds": args.rounds,
            "messages": args.messages,
            "prefetch": ct.PREFETCH,
            "connections": args.connections,
        },
        "machine": common.machine_facts(load_before),
        "broker": common.broker_facts(),
        "total_seconds": time.monotonic() - started,
        "summary": summary,
        "samples": samples,
        "logs": str(log_dir),
    }
    print()
    print(_table(summary))
    common.write_report(report, args.json)
    return 0 if summary else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--json", help="write the full report here ('-': stdout)")
    parser.add_argument("--only", nargs="+", choices=list(CONTENDERS))
    parser.add_argument("--log-dir")
    parser.add_argument(
        "--connections", type=int, help="--dedupe-connections (default: the consumer's)"
    )
    parser.add_argument("--worker", choices=list(CONTENDERS), help=argparse.SUPPRESS)
    parser.add_argument("--vhost", help=argparse.SUPPRESS)
    parser.add_argument("--dsn", help=argparse.SUPPRESS)
    parser.add_argument("--cprofile", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(args)
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())

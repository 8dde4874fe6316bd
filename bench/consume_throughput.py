"""Consumer throughput: rmqkit against a raw aio-pika loop and FastStream, same queue, same run.

Run from the repository root (the broker from docker-compose or scripts/broker-up)::

    .venv/bin/python -m bench.consume_throughput --rounds 3 --messages 20000 --json out.json

What it does (docs/benchmarks.md has the why):

1. creates a throwaway vhost through the management API and declares ``bench/topology.toml``
   into it with ``rmqkit declare`` (a quorum work queue ``bench.work`` with its policy, one 1 s
   retry tier with its jitter slots, a parking queue);
2. per round, for each contender in an order rotated every round: fills ``bench.work`` with N
   persistent 256-byte messages (pipelined confirmed publishes), then starts the contender in a
   subprocess of its own (its own interpreter and event loop), which consumes until N messages
   are acked and prints one JSON line: wall time from its first delivery, CPU time over the same
   window, and its VmRSS sampled during the run;
3. after each contender, checks that the work, wait and parking queues are empty (nothing left
   ready or unacked, nothing parked);
4. prints a table of medians and ratios, writes every sample as JSON, deletes the vhost.

Contenders:

``aio-pika``      ``queue.consume(callback)``; the callback awaits the handler, then
                  ``await message.ack()`` (one ack frame per message), prefetch 200.
``faststream``    ``RabbitBroker.subscriber(RabbitQueue(..., declare=False),
                  channel=Channel(prefetch_count=200), ack_policy=REJECT_ON_ERROR)``: acks after
                  the handler returned. Its per-message log lines are emitted at DEBUG (filtered),
                  as one would run it at this rate.
``rmqkit``        ``rmqkit.consumer.runner.QueueConsumer`` built as ``rmqkit consume`` builds it,
                  every default on: handler timeout watchdog, attempt counting, metrics, batched
                  acks after the handler, publisher confirms on the channel, logging configured.
``rmqkit-base``   (with ``--base-tree DIR``) the ``rmqkit`` contender as the checkout DIR has
                  it, e.g. a git worktree of the commit before a change: run in the same
                  rounds, it compares the code before and after under the same load.
``rmqkit-traced`` the ``rmqkit`` contender with OpenTelemetry tracing on: an SDK tracer provider
                  with the in-memory exporter (a span per handling, kept in memory), given to
                  rmqkit with ``rmqkit.tracing.set_tracer_provider``. The messages carry no
                  traceparent, so each handling starts a trace of its own.
``rmqkit-retry``  the same consumer with a handler that fails on attempt 1 and succeeds on
                  attempt 2: each message is copied to a wait queue (confirmed), acked, comes
                  back after ≤ 1 s and is acked. Compared by CPU time per message, since its wall
                  time includes the tier's wait.

All three throughput contenders call the same ``bench.handlers:noop`` coroutine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python bench/consume_throughput.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common

TOPOLOGY = common.ROOT / "bench" / "topology.toml"
QUEUE = "bench.work"
PREFETCH = 200
BODY_BYTES = 256
CONTENDERS = ("aio-pika", "faststream", "rmqkit", "rmqkit-traced", "rmqkit-retry", "rmqkit-base")
THROUGHPUT = ("aio-pika", "faststream", "rmqkit")
POLL_S = 0.002  # how often a worker checks whether it is done (the same for every contender)
RSS_EVERY_S = 0.1
WORKER_TIMEOUT_S = 120.0


# --- worker side (one contender, in its own process) ---------------------------------------


async def _watch(done: Callable[[], bool], timeout_s: float = WORKER_TIMEOUT_S) -> dict[str, Any]:
    """Poll until ``done()``; return the timing and memory of the window since the first call."""
    from time import perf_counter, process_time

    from bench.handlers import Clock

    samples: list[int] = []
    next_rss = 0.0
    deadline = perf_counter() + timeout_s
    while not done():
        now = perf_counter()
        if now > deadline:
            raise TimeoutError(f"not done after {timeout_s:.0f}s ({Clock.calls} calls)")
        if Clock.calls and now >= next_rss:
            samples.append(common.rss_kb())
            next_rss = now + RSS_EVERY_S
        await asyncio.sleep(POLL_S)
    wall_end, cpu_end = perf_counter(), process_time()
    samples.append(common.rss_kb())
    return {
        "seconds": wall_end - Clock.first_wall,
        "cpu_seconds": cpu_end - Clock.first_cpu,
        "handler_calls": Clock.calls,
        "rss_kb_median": int(statistics.median(samples)),
        "rss_kb_peak": max(samples),
    }


async def _worker_aiopika(url: str, n: int) -> dict[str, Any]:
    import aio_pika

    from bench.handlers import noop

    acked = 0
    conn = await aio_pika.connect(url)
    try:
        channel = await conn.channel()
        await channel.set_qos(prefetch_count=PREFETCH)
        queue = await channel.get_queue(QUEUE, ensure=True)  # passive declare

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            nonlocal acked
            await noop(message)
            await message.ack()
            acked += 1

        tag = await queue.consume(on_message)
        result = await _watch(lambda: acked >= n)
        await queue.cancel(tag)
    finally:
        await conn.close()
    return {**result, "settled": acked}


async def _worker_faststream(url: str, n: int) -> dict[str, Any]:
    import logging

    from faststream import AckPolicy
    from faststream.rabbit import Channel, QueueType, RabbitBroker, RabbitQueue

    from bench.handlers import Clock, noop

    broker = RabbitBroker(url, log_level=logging.DEBUG, graceful_timeout=10.0)
    broker.subscriber(
        RabbitQueue(QUEUE, queue_type=QueueType.QUORUM, declare=False),
        channel=Channel(prefetch_count=PREFETCH),
        ack_policy=AckPolicy.REJECT_ON_ERROR,
    )(noop)
    await broker.start()
    try:
        # The handler is counted when it returns; FastStream acks right after, in the same task:
        # one more loop tick after the N-th call lets that last ack go out.
        result = await _watch(lambda: Clock.calls >= n)
    finally:
        await broker.stop()
    return {**result, "settled": Clock.calls}


async def _worker_rmqkit(
    url: str, n: int, handler_spec: str, target: int, traced: bool = False
) -> dict[str, Any]:
    from rmqkit.consumer.config import ConsumerFlags, build_config, policy_from_topology
    from rmqkit.consumer.handler import load_handler
    from rmqkit.consumer.logs import configure_logging
    from rmqkit.consumer.metrics import ConsumerMetrics
    from rmqkit.consumer.runner import QueueConsumer
    from rmqkit.settings import load_settings
    from rmqkit.topology import load_topology

    settings = load_settings(url=url)
    if traced:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        from rmqkit import tracing

        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
        tracing.set_tracer_provider(provider)
        settings = settings.model_copy(update={"tracing": "on"})
    spec = load_topology(TOPOLOGY)
    flags = ConsumerFlags()
    policy = policy_from_topology(spec, QUEUE, flags.max_attempts)
    config = build_config(handler_spec, QUEUE, policy, flags, spec)
    configure_logging(config.log_format)  # as a worker process does (stderr: the parent's log)
    handler = load_handler(config.handler, cwd=common.ROOT)
    metrics = ConsumerMetrics(config.queue, config.tier_names)
    consumer = QueueConsumer(settings, config, handler, metrics)
    run = asyncio.create_task(consumer.run())

    def done() -> bool:
        if run.done():
            run.result()  # raise what stopped it
        # All settled (processed) and acked: nothing left in the ack tracker, whose prefix is
        # taken just before the basic.ack(multiple=True) frame is written. (Not the acked
        # metric: it under-counts, see docs/benchmarks.md.)
        return consumer.processed >= target and consumer.dispatcher._tracker.outstanding == 0

    try:
        result = await _watch(done)
    finally:
        consumer.stop()
        await asyncio.wait_for(run, timeout=30)
    return {
        **result,
        "settled": consumer.processed,
        "retried": sum(metrics._retried.values()),
        "parked": sum(metrics._parked.values()),
        "metrics_received": metrics._received,
        # a reconnect (someone restarted the broker) redelivers what was in flight: duplicates
        # then count towards the target, and the run is not comparable
        "reconnects": metrics._reconnects,
        "metrics_acked": metrics._acked,
    }


def worker_main(args: argparse.Namespace) -> int:
    url = common.with_vhost(common.BASE_URL, args.vhost)
    rss_start = common.rss_kb()
    coro: Coroutine[Any, Any, dict[str, Any]]
    if args.worker == "aio-pika":
        coro = _worker_aiopika(url, args.messages)
    elif args.worker == "faststream":
        coro = _worker_faststream(url, args.messages)
    elif args.worker == "rmqkit":
        coro = _worker_rmqkit(url, args.messages, "bench.handlers:noop", args.messages)
    elif args.worker == "rmqkit-traced":
        coro = _worker_rmqkit(url, args.messages, "bench.handlers:noop", args.messages, True)
    elif args.worker == "rmqkit-retry":
        # every message is settled twice: its first delivery when the retry copy is confirmed,
        # its second when the handler succeeds
        coro = _worker_rmqkit(url, args.messages, "bench.handlers:fail_once", 2 * args.messages)
    else:
        raise SystemExit(f"unknown worker {args.worker!r}")
    result = common.run_profiled(coro, args.cprofile)
    result.update(contender=args.worker, messages=args.messages, rss_kb_start=rss_start)
    print(json.dumps(result), flush=True)
    return 0


# --- orchestrator side ------------------------------------------------------------------------


def _queue_names() -> list[str]:
    from rmqkit.topology import load_topology
    from rmqkit.topology.expand import wait_queue_names

    spec = load_topology(TOPOLOGY)
    waits = [name for tier in wait_queue_names(spec, QUEUE) for name, _ in tier]
    return [QUEUE, *waits, spec.parking_name(QUEUE)]


async def _fill(url: str, n: int) -> float:
    """Publish ``n`` persistent messages to the work queue, confirmed, pipelined; msg/s."""
    import aiormq
    from pamqp import commands as spec

    body = (b"0123456789abcdef" * (BODY_BYTES // 16 + 1))[:BODY_BYTES]
    run = uuid.uuid4().hex[:8]
    conn = await aiormq.connect(url)
    try:
        channel = await conn.channel(publisher_confirms=True)
        started = time.perf_counter()
        window = 1000
        for first in range(0, n, window):
            confirms = await asyncio.gather(
                *(
                    channel.basic_publish(
                        body,
                        routing_key=QUEUE,
                        properties=spec.Basic.Properties(
                            delivery_mode=2,
                            message_id=f"{run}-{i}",
                            content_type="application/octet-stream",
                        ),
                    )
                    for i in range(first, min(n, first + window))
                )
            )
            if not all(isinstance(c, spec.Basic.Ack) for c in confirms):
                raise RuntimeError("a fill publish was not confirmed")
        return n / (time.perf_counter() - started)
    finally:
        await conn.close()


async def _purge(url: str, names: list[str]) -> None:
    import aiormq

    conn = await aiormq.connect(url)
    try:
        channel = await conn.channel()
        for name in names:
            await channel.queue_purge(name)
    finally:
        await conn.close()


def _run_worker(
    contender: str,
    vhost: str,
    n: int,
    log_dir: Path,
    tag: str,
    profile: str | None,
    base_tree: Path | None = None,
) -> dict[str, Any]:
    tree: Path | None = None
    if contender == "rmqkit-base":
        # The rmqkit contender as the other tree has it (its own consumer and worker code),
        # in the same rounds as this tree's: a before/after comparison under the same load.
        if base_tree is None:
            raise ValueError("rmqkit-base needs --base-tree")
        tree = base_tree
    worker = "rmqkit" if contender == "rmqkit-base" else contender
    cmd = common.worker_cmd(["-m", "bench.consume_throughput"], worker, vhost, n)
    if profile == "cprofile":
        cmd += ["--cprofile", str(log_dir / f"{tag}.prof")]
    elif profile == "py-spy":  # collapsed stacks: flamegraph.pl, speedscope
        cmd = common.py_spy(cmd, log_dir / f"{tag}.collapsed.txt", rate=500)
    result = common.run_json_worker(
        cmd, log_dir / f"{tag}.log", WORKER_TIMEOUT_S + 60, contender, tree=tree
    )
    result["contender"] = contender
    return result


def _faststream_available() -> bool:
    try:
        import faststream.rabbit  # noqa: F401
    except ImportError:
        return False
    return True


def _invalid(result: dict[str, Any]) -> str | None:
    """Why a run does not count (None: it does). A broker restarted under the consumer (by a
    fault test elsewhere, say) redelivers what was in flight: handled twice, those count towards
    N while others are still queued."""
    expected = (
        2 * result["messages"] if result["contender"] == "rmqkit-retry" else result["messages"]
    )
    if result.get("reconnects"):
        return f"reconnected {result['reconnects']}x"
    if result.get("left_in_queues"):
        return f"left {result['left_in_queues']} behind"
    if result.get("handler_calls", expected) != expected:
        return f"{result['handler_calls']} handler calls for {expected} deliveries"
    if result.get("parked"):
        return f"parked {result['parked']}"
    return None


def _summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    by: dict[str, list[dict[str, Any]]] = {}
    for s in samples:
        if not _invalid(s):
            by.setdefault(s["contender"], []).append(s)
    summary: dict[str, Any] = {}
    for name, runs in by.items():
        rates = [r["messages"] / r["seconds"] for r in runs]
        cpu_us = [r["cpu_seconds"] / r["messages"] * 1e6 for r in runs]
        summary[name] = {
            "runs": len(runs),
            "msg_per_s_median": statistics.median(rates),
            "msg_per_s_all": [round(x) for x in rates],
            "cpu_us_per_msg_median": statistics.median(cpu_us),
            "cpu_us_per_msg_all": [round(x, 1) for x in cpu_us],
            "rss_mb_median": statistics.median(r["rss_kb_median"] for r in runs) / 1024,
            "rss_mb_peak": max(r["rss_kb_peak"] for r in runs) / 1024,
            "rss_mb_start": statistics.median(r["rss_kb_start"] for r in runs) / 1024,
            "disturbed_runs": sum(1 for r in runs if r.get("disturbed")),
            "foreign_cpu_share_max": max(r.get("foreign_cpu_share", 0.0) for r in runs),
        }
    for s in samples:
        if _invalid(s) and s["contender"] in summary:
            summary[s["contender"]]["invalid_runs"] = (
                summary[s["contender"]].get("invalid_runs", 0) + 1
            )
    base = summary.get("aio-pika")
    for entry in summary.values():
        if base:
            entry["ratio_vs_aiopika"] = entry["msg_per_s_median"] / base["msg_per_s_median"]
            entry["cpu_ratio_vs_aiopika"] = (
                entry["cpu_us_per_msg_median"] / base["cpu_us_per_msg_median"]
            )
    if "rmqkit" in summary and "rmqkit-base" in summary:
        ok, base_tree = summary["rmqkit"], summary["rmqkit-base"]
        ok["ratio_vs_base_tree"] = ok["msg_per_s_median"] / base_tree["msg_per_s_median"]
        ok["cpu_ratio_vs_base_tree"] = (
            ok["cpu_us_per_msg_median"] / base_tree["cpu_us_per_msg_median"]
        )
    if "rmqkit" in summary and "rmqkit-traced" in summary:
        ok, traced = summary["rmqkit"], summary["rmqkit-traced"]
        traced["ratio_vs_rmqkit"] = traced["msg_per_s_median"] / ok["msg_per_s_median"]
        traced["cpu_ratio_vs_rmqkit"] = (
            traced["cpu_us_per_msg_median"] / ok["cpu_us_per_msg_median"]
        )
    if "rmqkit" in summary and "rmqkit-retry" in summary:
        ok, retry = summary["rmqkit"], summary["rmqkit-retry"]
        retry["cpu_ratio_vs_rmqkit_success"] = (
            retry["cpu_us_per_msg_median"] / ok["cpu_us_per_msg_median"]
        )
    return summary


def _table(summary: dict[str, Any]) -> str:
    head = (
        f"{'contender':<15}{'runs':>5}{'msg/s (median)':>16}{'x aio-pika':>12}"
        f"{'CPU µs/msg':>12}{'RSS MB':>9}{'others':>8}  all rounds (msg/s)"
    )
    lines = [head, "-" * len(head)]
    for name in CONTENDERS:
        s = summary.get(name)
        if s is None:
            continue
        ratio = s.get("ratio_vs_aiopika")
        lines.append(
            f"{name:<15}{s['runs']:>5}{s['msg_per_s_median']:>16,.0f}"
            f"{(f'{ratio:.2f}x' if ratio else '-'):>12}{s['cpu_us_per_msg_median']:>12.1f}"
            f"{s['rss_mb_median']:>9.1f}{s['foreign_cpu_share_max']:>8.0%}"
            f"  {', '.join(f'{x:,}' for x in s['msg_per_s_all'])}"
        )
    retry = summary.get("rmqkit-retry", {})
    if "cpu_ratio_vs_rmqkit_success" in retry:
        lines.append(
            "rmqkit-retry: msg/s is end to end (includes the ≤ 1 s tier wait); CPU per message "
            f"is {retry['cpu_ratio_vs_rmqkit_success']:.2f}x the success path's"
        )
    traced = summary.get("rmqkit-traced", {})
    if "ratio_vs_rmqkit" in traced:
        lines.append(
            f"rmqkit-traced vs rmqkit: {traced['ratio_vs_rmqkit']:.2f}x the rate, "
            f"{traced['cpu_ratio_vs_rmqkit']:.2f}x the CPU per message"
        )
    if "ratio_vs_base_tree" in summary.get("rmqkit", {}):
        ok = summary["rmqkit"]
        lines.append(
            f"rmqkit vs rmqkit-base (--base-tree): {ok['ratio_vs_base_tree']:.2f}x the rate, "
            f"{ok['cpu_ratio_vs_base_tree']:.2f}x the CPU per message"
        )
    lines.append(
        "others: the most CPU other processes took during one of its runs (share of the machine)"
    )
    return "\n".join(lines)


def orchestrate(args: argparse.Namespace) -> int:
    # SIGTERM: unwind (the vhost is deleted in a finally), as Ctrl-C does
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    contenders = [c for c in CONTENDERS if c in args.only] if args.only else list(CONTENDERS)
    if "rmqkit-base" in contenders and args.base_tree is None:
        if args.only:
            raise SystemExit("rmqkit-base needs --base-tree")
        contenders.remove("rmqkit-base")
    if "faststream" in contenders and not _faststream_available():
        print("faststream is not installed (pip install -e '.[bench]'): skipping it")
        contenders.remove("faststream")
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="rmqkit-bench-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    names = _queue_names()
    samples: list[dict[str, Any]] = []
    fills: list[float] = []
    failures: list[dict[str, Any]] = []
    started = time.monotonic()
    load_before = os.getloadavg()
    vhost, url = common.create_vhost("rmqkit-bench")
    try:
        common.declare(TOPOLOGY, url)
        for rnd in range(args.rounds):
            shift = rnd % len(contenders)
            order = contenders[shift:] + contenders[:shift]
            for contender in order:
                profile = args.profile if contender in args.profile_only else None
                tag = f"r{rnd + 1}-{contender}"
                result: dict[str, Any] | None = None
                for attempt in range(1, args.reruns + 2):
                    try:
                        left = asyncio.run(common.depths(url, names))
                        if any(left.values()):
                            print(f"  (purging leftovers {left})")
                            asyncio.run(_purge(url, names))
                        fills.append(asyncio.run(_fill(url, args.messages)))
                        waited = common.wait_quiet(args.quiet_wait) if args.quiet_wait > 0 else 0.0
                        with common.CpuWatch() as watch:
                            result = _run_worker(
                                contender,
                                vhost,
                                args.messages,
                                log_dir,
                                tag,
                                profile,
                                args.base_tree,
                            )
                        left = asyncio.run(common.depths(url, names))
                    except Exception as exc:  # e.g. someone restarted the broker
                        line = f"{type(exc).__name__}: {exc}".splitlines()[0]
                        print(f"round {rnd + 1} {contender:<13} FAILED ({line})", flush=True)
                        failures.append({"round": rnd + 1, "contender": contender, "error": line})
                        result = None
                        common.wait_for_broker(url)
                        continue
                    result["left_in_queues"] = {k: v for k, v in left.items() if v}
                    invalid = _invalid(result)
                    disturbed = watch.foreign_share > args.disturbed
                    if (disturbed or invalid) and attempt <= args.reruns:
                        why = invalid or f"others used {watch.foreign_share:.0%} of the CPUs"
                        print(
                            f"round {rnd + 1} {contender:<13} {why}: running it again", flush=True
                        )
                        continue
                    break
                if result is None:
                    continue
                result["round"] = rnd + 1
                result["attempt"] = attempt
                result["waited_for_quiet_s"] = round(waited, 1)
                result["foreign_cpu_share"] = round(watch.foreign_share, 3)
                result["disturbed"] = disturbed
                result["invalid"] = invalid
                result["broker_cpu_s"] = round(watch.broker_cpu_s, 2)
                samples.append(result)
                rate = result["messages"] / result["seconds"]
                print(
                    f"round {rnd + 1} {contender:<13} {rate:>9,.0f} msg/s  "
                    f"cpu {result['cpu_seconds'] / result['messages'] * 1e6:6.1f} µs/msg  "
                    f"rss {result['rss_kb_median'] / 1024:5.1f} MB  "
                    f"left {result['left_in_queues'] or 0}  "
                    f"others {result['foreign_cpu_share']:.0%}"
                    + ("  DISTURBED" if disturbed else "")
                    + (f"  INVALID ({invalid}): left out of the medians" if invalid else ""),
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
            "prefetch": PREFETCH,
            "body_bytes": BODY_BYTES,
            "queue": "quorum (rmqkit declare bench/topology.toml)",
            "quiet_wait_s": args.quiet_wait,
            "disturbed_above": args.disturbed,
            "reruns": args.reruns,
        },
        "machine": common.machine_facts(load_before),
        "broker": common.broker_facts(),
        "versions": common.versions(("rmqkit", "aio-pika", "aiormq", "pamqp", "faststream")),
        "fill_msg_per_s_median": statistics.median(fills) if fills else None,
        "total_seconds": time.monotonic() - started,
        "summary": summary,
        "samples": samples,
        "failed_runs": failures,
        "logs": str(log_dir),
    }
    print()
    print(_table(summary))
    print(f"\nworker logs in {log_dir}; total {report['total_seconds']:.0f}s")
    # only the samples in the event loop: not the worker's start-up and shutdown
    common.print_profiles(log_dir, limit=15, loop_only=True)
    common.write_report(report, args.json)
    bad = [s for s in samples if _invalid(s)]
    if bad or failures:
        print(
            f"WARNING: {len(bad)} invalid run(s) (left out of the medians), "
            f"{len(failures)} failed run(s)",
            file=sys.stderr,
        )
    return 0 if summary else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--json", help="write the full report here ('-': stdout)")
    parser.add_argument("--only", nargs="+", choices=CONTENDERS, help="run only these contenders")
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=10.0,
        help="before each run, wait up to this many seconds for the CPUs to be idle (0: don't)",
    )
    parser.add_argument(
        "--disturbed",
        type=float,
        default=0.15,
        help="a run during which other processes used more than this share of the CPUs is "
        "disturbed (default 0.15)",
    )
    parser.add_argument(
        "--reruns", type=int, default=1, help="run a disturbed run again, up to this many times"
    )
    parser.add_argument("--log-dir", help="worker logs (and profiles) here (default: a temp dir)")
    parser.add_argument(
        "--base-tree",
        type=Path,
        help="a checkout of other code (e.g. a git worktree of the commit before a change): "
        "with --only ... rmqkit-base, its rmqkit consumer runs in the same rounds as this one's",
    )
    parser.add_argument(
        "--profile",
        choices=("cprofile", "py-spy"),
        help="profile the worker subprocesses of --profile-only (numbers are then skewed)",
    )
    parser.add_argument("--profile-only", nargs="+", choices=CONTENDERS, default=["rmqkit"])
    parser.add_argument(
        "--summarize",
        metavar="REPORT",
        help="only recompute the summary of a saved JSON report (with --json: write it back)",
    )
    # worker mode (internal: started by the orchestrator)
    parser.add_argument("--worker", choices=CONTENDERS, help=argparse.SUPPRESS)
    parser.add_argument("--vhost", help=argparse.SUPPRESS)
    parser.add_argument("--cprofile", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(args)
    if args.summarize:
        return common.resummarize(args.summarize, args.json, _summarize, _invalid, _table)
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())

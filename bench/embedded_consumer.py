"""The embedded consumer (``rmqkit.Consumer``) against raw aio-pika and the consumer ``rmqkit
consume`` runs, same queue, same run.

Run from the repository root (the broker from docker-compose or scripts/broker-up)::

    .venv/bin/python -m bench.embedded_consumer --rounds 5 --messages 20000 --json out.json

Contenders (each in a subprocess of its own, its own interpreter and event loop; the order is
rotated every round; bench/consume_throughput.py's fill, workers and checks are reused):

``aio-pika``         the raw baseline: ``queue.consume(callback)``, ack per message, prefetch 200.
``rmqkit``           the runner ``rmqkit consume``'s worker runs, built as the command builds it
                     (bench/consume_throughput.py's ``rmqkit`` contender).
``rmqkit-embedded``  ``rmqkit.Consumer(noop, queue=..., topology=..., settings=...)``, started with
                     ``await consumer.start()`` in the worker's event loop, as an application
                     would; logging configured as the command does, so both log alike.

Every contender calls ``bench.handlers:noop`` and is timed from its first delivery until N
messages are acked (rmqkit: settled and nothing left in the ack tracker). The result: medians per
contender, ``ratio_vs_aiopika`` for each, and whether the embedded consumer's ratio is at least 90%
of the command's (``embedded_within_10pct``), over all runs and over the undisturbed ones.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python bench/embedded_consumer.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench import consume_throughput as ct

CONTENDERS = ("aio-pika", "rmqkit", "rmqkit-embedded")
ALLOWED_GAP = 0.10  # the embedded ratio may trail the command's by this share of it at most


async def _worker_embedded(url: str, n: int) -> dict[str, Any]:
    import rmqkit
    from bench.handlers import noop
    from rmqkit.consumer.logs import configure_logging

    configure_logging("text")  # as the rmqkit contender (and a worker process) does
    consumer = rmqkit.Consumer(
        noop, queue=ct.QUEUE, topology=ct.TOPOLOGY, settings=rmqkit.load_settings(url=url)
    )
    await consumer.start()
    runners = consumer._runners

    def done() -> bool:
        # settled and acked: nothing left in the ack trackers (as for the rmqkit contender)
        return consumer.processed >= n and all(
            r.dispatcher._tracker.outstanding == 0 for r in runners
        )

    try:
        result = await ct._watch(done)
    finally:
        await consumer.stop(grace_s=30)
    metrics = consumer.metrics
    assert metrics is not None
    return {
        **result,
        "settled": consumer.processed,
        "retried": sum(metrics._retried.values()),
        "parked": sum(metrics._parked.values()),
        "reconnects": metrics._reconnects,
        "metrics_acked": metrics._acked,
    }


def worker_main(args: argparse.Namespace) -> int:
    url = common.with_vhost(common.BASE_URL, args.vhost)
    rss_start = common.rss_kb()
    if args.worker == "aio-pika":
        coro = ct._worker_aiopika(url, args.messages)
    elif args.worker == "rmqkit":
        coro = ct._worker_rmqkit(url, args.messages, "bench.handlers:noop", args.messages)
    elif args.worker == "rmqkit-embedded":
        coro = _worker_embedded(url, args.messages)
    else:
        raise SystemExit(f"unknown worker {args.worker!r}")
    result = common.run_profiled(coro, args.cprofile)
    result.update(contender=args.worker, messages=args.messages, rss_kb_start=rss_start)
    print(json.dumps(result), flush=True)
    return 0


def _run_worker(contender: str, vhost: str, n: int, log_dir: Path, tag: str) -> dict[str, Any]:
    cmd = common.worker_cmd(["-m", "bench.embedded_consumer"], contender, vhost, n)
    return common.run_json_worker(cmd, log_dir / f"{tag}.log", ct.WORKER_TIMEOUT_S + 60, contender)


def _summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    summary = ct._summarize(samples)
    # Medians of the undisturbed runs alone too: on a shared machine, one contender's runs can
    # be slowed by others more than another's in the same round.
    quiet = ct._summarize([s for s in samples if not s.get("disturbed")])
    summary["embedded_vs_cli"] = _compare(summary)
    summary["undisturbed_only"] = {**quiet, "embedded_vs_cli": _compare(quiet)}
    return summary


def _compare(summary: dict[str, Any]) -> dict[str, Any] | None:
    """The embedded consumer's ratio to aio-pika against the command's: it passes when it is at
    least 90% of it (the command's ratio less 10% of it)."""
    embedded, cli = summary.get("rmqkit-embedded"), summary.get("rmqkit")
    if not (embedded and cli and "ratio_vs_aiopika" in embedded and "ratio_vs_aiopika" in cli):
        return None
    floor = cli["ratio_vs_aiopika"] * (1 - ALLOWED_GAP)
    return {
        "embedded_ratio": embedded["ratio_vs_aiopika"],
        "cli_ratio": cli["ratio_vs_aiopika"],
        "floor": floor,
        "embedded_within_10pct": embedded["ratio_vs_aiopika"] >= floor,
        "embedded_over_cli_msg_per_s": embedded["msg_per_s_median"] / cli["msg_per_s_median"],
        "embedded_over_cli_cpu_per_msg": (
            embedded["cpu_us_per_msg_median"] / cli["cpu_us_per_msg_median"]
        ),
    }


def _table(summary: dict[str, Any]) -> str:
    lines = []
    for title, part in (("all runs", summary), ("undisturbed runs", summary["undisturbed_only"])):
        lines.append(f"{title}:")
        lines.append(
            f"  {'contender':<17}{'runs':>5}{'msg/s (median)':>16}{'x aio-pika':>12}"
            f"{'CPU µs/msg':>12}  all rounds"
        )
        for name in CONTENDERS:
            s = part.get(name)
            if s is None:
                continue
            ratio = s.get("ratio_vs_aiopika")
            lines.append(
                f"  {name:<17}{s['runs']:>5}{s['msg_per_s_median']:>16,.0f}"
                f"{(f'{ratio:.2f}x' if ratio else '-'):>12}{s['cpu_us_per_msg_median']:>12.1f}"
                f"  {', '.join(f'{x:,}' for x in s['msg_per_s_all'])}"
            )
        gap = part.get("embedded_vs_cli")
        if gap:
            lines.append(
                f"  embedded {gap['embedded_ratio']:.2f}x vs the command's "
                f"{gap['cli_ratio']:.2f}x (floor {gap['floor']:.2f}x): "
                + ("ok" if gap["embedded_within_10pct"] else "BELOW")
                + f"; CPU per message {gap['embedded_over_cli_cpu_per_msg']:.2f}x the command's"
            )
    return "\n".join(lines)


def orchestrate(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: the vhost is deleted
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="rmqkit-bench-embedded-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    names = ct._queue_names()
    contenders = list(CONTENDERS)
    samples: list[dict[str, Any]] = []
    started = time.monotonic()
    load_before = os.getloadavg()
    vhost, url = common.create_vhost("rmqkit-bench-embedded")
    try:
        common.declare(ct.TOPOLOGY, url)
        for rnd in range(args.rounds):
            shift = rnd % len(contenders)
            for contender in contenders[shift:] + contenders[:shift]:
                for attempt in range(1, args.reruns + 2):
                    left = asyncio.run(common.depths(url, names))
                    if any(left.values()):
                        asyncio.run(ct._purge(url, names))
                    asyncio.run(ct._fill(url, args.messages))
                    if args.quiet_wait > 0:
                        common.wait_quiet(args.quiet_wait)
                    with common.CpuWatch() as watch:
                        result = _run_worker(
                            contender, vhost, args.messages, log_dir, f"r{rnd + 1}-{contender}"
                        )
                    left = asyncio.run(common.depths(url, names))
                    result["left_in_queues"] = {k: v for k, v in left.items() if v}
                    invalid = ct._invalid(result)
                    disturbed = watch.foreign_share > args.disturbed
                    if (invalid or disturbed) and attempt <= args.reruns:
                        continue
                    break
                result.update(
                    round=rnd + 1,
                    attempt=attempt,
                    foreign_cpu_share=round(watch.foreign_share, 3),
                    disturbed=disturbed,
                    invalid=invalid,
                )
                samples.append(result)
                rate = result["messages"] / result["seconds"]
                print(
                    f"round {rnd + 1} {contender:<16} {rate:>9,.0f} msg/s  "
                    f"others {watch.foreign_share:.0%}"
                    + ("  DISTURBED" if disturbed else "")
                    + (f"  INVALID ({invalid})" if invalid else ""),
                    flush=True,
                )
    finally:
        common.delete_vhost(vhost)
    summary = _summarize(samples)
    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": common.command_line("bench.embedded_consumer"),
        "params": {
            "rounds": args.rounds,
            "messages": args.messages,
            "prefetch": ct.PREFETCH,
            "body_bytes": ct.BODY_BYTES,
            "quiet_wait_s": args.quiet_wait,
            "disturbed_above": args.disturbed,
            "reruns": args.reruns,
        },
        "machine": common.machine_facts(load_before),
        "broker": common.broker_facts(),
        "versions": common.versions(),
        "code": common.code_state(),
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
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--json", help="write the full report here ('-': stdout)")
    parser.add_argument("--quiet-wait", type=float, default=10.0)
    parser.add_argument("--disturbed", type=float, default=0.15)
    parser.add_argument("--reruns", type=int, default=1)
    parser.add_argument("--log-dir")
    parser.add_argument(
        "--summarize", metavar="REPORT", help="only recompute the summary of a saved report"
    )
    parser.add_argument("--worker", choices=CONTENDERS, help=argparse.SUPPRESS)
    parser.add_argument("--vhost", help=argparse.SUPPRESS)
    parser.add_argument("--cprofile", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(args)
    if args.summarize:
        return common.resummarize(args.summarize, args.json, _summarize, ct._invalid, _table)
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())

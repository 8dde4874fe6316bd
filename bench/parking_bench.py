"""Parking lane benchmark: replay and `list --json` of N parked messages against raw aio-pika.

Run from the repository root (the broker from docker-compose or scripts/broker-up)::

    .venv/bin/python -m bench.parking_bench --rounds 3 --messages 50000 --json out.json

(``python bench/parking_bench.py ...`` works too.) docs/benchmarks.md, section "Parking", has the
results and the why. What it does:

1. creates a throwaway vhost through the management API, declares a one-queue topology (work
   queue ``bench.work``, parking queue ``bench.work.parking``; written to a temporary file) with
   ``rmqkit declare``, and creates the replay target ``bench.target`` (a plain quorum queue)
   through the management API;
2. per round, for each contender of each group in an order rotated every round: deletes and
   re-declares the parking and target queues (fresh quorum queues, nothing late from an earlier
   run), fills the parking queue with parked 1 KB messages carrying the headers rmqkit's
   consumer writes when it parks (reason, error type and message, origin, attempt, first/last
   failure time, host, pid, a traceback; pipelined confirmed publishes), runs the contender in a
   subprocess of its own (its own interpreter and event loop), and checks the queue depths
   afterwards (replay: all in the target, nothing left parked; list: all still parked);
3. a run that did not handle all N messages (or died with the broker: the machine is shared,
   other test suites restart it) is reported and run again (``--retries``); a timed run that
   left unexpected depths is reported apart;
4. prints medians, ratios against the targets of issue 4 and per-round ratios, writes every
   sample as JSON (``--json``), deletes the vhost. ``--profile py-spy`` records the rmqkit
   contenders (collapsed stacks in the log directory) and prints their hottest functions.

Contenders (``bench/parking_contenders.py`` says what each one does and how it is timed): the
replay group ``naive``, ``rmqkit-replay``, ``aio-pika-publish`` and, with ``--raw-replay``,
``aiormq-replay``; the list group ``rmqkit-list``, ``rmqkit-cli``, ``aio-pika-consume``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

if __package__ in (None, ""):  # `python bench/parking_bench.py`, as the workers are started
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common, parking_contenders
from bench.parking_contenders import (
    BODIES,
    BODY_BYTES,
    CONTENDERS,
    FILL_TEMPLATES,
    LIST_GROUP,
    PARKING,
    RAW_REPLAY,
    REPLAY_GROUP,
    TARGET,
    WINDOW,
    WORK,
    WORKER_TIMEOUT_S,
    WORKERS,
    parked_headers,
    run_cli_list,
)

TOPOLOGY_TOML = f"""\
# written by bench/parking_bench.py into a temporary directory
[queues."{WORK}"]
retry_delays = ["1s"]
max_attempts = 3
parking = "{PARKING}"
"""
FILL_WINDOW = 5000  # the fill is not measured: as fast as the broker takes it


# --- orchestrator side ----------------------------------------------------------------------------


async def _fill(url: str, n: int, *, fingerprints: bool = False) -> float:
    """Park ``n`` messages (persistent, pipelined confirmed publishes); returns msg/s.
    ``fingerprints``: with the ``rmqkit-fingerprint`` header today's consumer writes (without:
    as parked before fingerprints, each computed from the stored traceback when read).

    The fill is not what is measured, and encoding a header table this size costs pamqp more
    CPU than the broker spends storing the message: the properties are encoded once per header
    template and only the message_id (fixed width) is swapped in per message.
    """
    import aiormq
    from pamqp import commands as spec

    class Preencoded(spec.Basic.Properties):
        def __init__(self, message_id: str, raw: bytes) -> None:
            super().__init__(message_id=message_id)
            self.raw = raw

        def marshal(self) -> bytes:
            return self.raw

    now = datetime.now(UTC)
    run = uuid.uuid4().hex[:8]
    placeholder = "#" * len(f"{run}-{0:07d}")
    templates = [
        spec.Basic.Properties(
            content_type="application/json",
            headers=parked_headers(i, now, fingerprints=fingerprints),
            delivery_mode=2,
            message_id=placeholder,
            timestamp=now.replace(microsecond=0),
        ).marshal()
        for i in range(FILL_TEMPLATES)
    ]
    hole = placeholder.encode()
    conn = await aiormq.connect(url)
    try:
        channel = await conn.channel(publisher_confirms=True)
        started = time.perf_counter()
        for first in range(0, n, FILL_WINDOW):
            publishes = []
            for i in range(first, min(n, first + FILL_WINDOW)):
                message_id = f"{run}-{i:07d}"
                raw = templates[i % FILL_TEMPLATES].replace(hole, message_id.encode(), 1)
                publishes.append(
                    channel.basic_publish(
                        BODIES[i % len(BODIES)],
                        routing_key=PARKING,
                        properties=Preencoded(message_id, raw),
                    )
                )
            confirms = await asyncio.gather(*publishes)
            if not all(isinstance(c, spec.Basic.Ack) for c in confirms):
                raise RuntimeError("a fill publish was not confirmed")
        return n / (time.perf_counter() - started)
    finally:
        await conn.close()


async def _fresh_queues(url: str) -> None:
    """Delete and re-declare the parking and target queues: every run starts on new quorum
    queues (no raft log from earlier runs, no late returns of an earlier run's holds landing in
    this one). The parking queue gets its rmqkit policy back by name."""
    import aiormq

    conn = await aiormq.connect(url)
    try:
        channel = await conn.channel()
        for name in (PARKING, TARGET):
            await channel.queue_delete(name)
            await channel.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    finally:
        await conn.close()


def _run_worker(
    contender: str, vhost: str, n: int, log_dir: Path, tag: str, profile: str | None
) -> dict[str, Any]:
    cmd = common.worker_cmd([str(Path(__file__).resolve())], contender, vhost, n)
    if profile == "cprofile":
        cmd += ["--cprofile", str(log_dir / f"{tag}.prof")]
    elif profile == "py-spy":
        cmd = common.py_spy(cmd, log_dir / f"{tag}.collapsed.txt")
    return common.run_json_worker(cmd, log_dir / f"{tag}.log", WORKER_TIMEOUT_S + 60, contender)


def _summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    by: dict[str, list[dict[str, Any]]] = {}
    for s in samples:
        by.setdefault(s["contender"], []).append(s)
    summary: dict[str, Any] = {}
    for name, runs in by.items():
        rates = [r["done"] / r["seconds"] for r in runs]
        entry: dict[str, Any] = {
            "runs": len(runs),
            "messages": runs[0]["messages"],
            "msg_per_s_median": statistics.median(rates),
            "msg_per_s_all": [round(x) for x in rates],
            "seconds_median": statistics.median(r["seconds"] for r in runs),
        }
        cpu = [r["cpu_seconds"] / r["done"] * 1e6 for r in runs if "cpu_seconds" in r]
        if cpu:
            entry["cpu_us_per_msg_median"] = statistics.median(cpu)
        setup = [r["setup_seconds"] for r in runs if r.get("setup_seconds") is not None]
        if setup:
            entry["setup_seconds_median"] = statistics.median(setup)
        to_last = [r["to_last_message_seconds"] for r in runs if "to_last_message_seconds" in r]
        if to_last:
            entry["to_last_message_seconds_median"] = statistics.median(to_last)
        summary[name] = entry

    def ratio(a: str, b: str) -> float | None:
        if a in summary and b in summary:
            return float(summary[a]["msg_per_s_median"] / summary[b]["msg_per_s_median"])
        return None

    summary["ratios"] = {
        "replay_vs_raw_replay": ratio("rmqkit-replay", RAW_REPLAY),
        # the ceiling of replay_vs_naive: a raw pipelined publish that reads and acks nothing
        "aiopika_publish_vs_naive": ratio("aio-pika-publish", "naive"),
        "replay_vs_naive": ratio("rmqkit-replay", "naive"),
        "replay_vs_aiopika_publish": ratio("rmqkit-replay", "aio-pika-publish"),
        "list_vs_aiopika_consume": ratio("rmqkit-list", "aio-pika-consume"),
        "cli_list_vs_aiopika_consume": ratio("rmqkit-cli", "aio-pika-consume"),
    }
    # per-round ratios: the spread shows how much the shared machine moved the numbers
    per_round: dict[str, list[float]] = {}
    rounds = sorted({s["round"] for s in samples})
    for key, (a, b) in {
        "replay_vs_raw_replay": ("rmqkit-replay", RAW_REPLAY),
        "aiopika_publish_vs_naive": ("aio-pika-publish", "naive"),
        "replay_vs_naive": ("rmqkit-replay", "naive"),
        "replay_vs_aiopika_publish": ("rmqkit-replay", "aio-pika-publish"),
        "list_vs_aiopika_consume": ("rmqkit-list", "aio-pika-consume"),
        "cli_list_vs_aiopika_consume": ("rmqkit-cli", "aio-pika-consume"),
    }.items():
        values = []
        for rnd in rounds:
            sa = [s for s in samples if s["round"] == rnd and s["contender"] == a]
            sb = [s for s in samples if s["round"] == rnd and s["contender"] == b]
            if sa and sb:
                values.append(
                    round(
                        (sa[0]["done"] / sa[0]["seconds"]) / (sb[0]["done"] / sb[0]["seconds"]), 3
                    )
                )
        if values:
            per_round[key] = values
    summary["ratios_per_round"] = per_round
    return summary


TARGETS = {
    "replay_vs_naive": 5.0,
    "replay_vs_aiopika_publish": 0.5,
    "list_vs_aiopika_consume": 0.5,
    "cli_list_vs_aiopika_consume": 0.5,
}


def _table(summary: dict[str, Any]) -> str:
    head = (
        f"{'contender':<18}{'msgs':>7}{'msg/s (median)':>16}{'s (median)':>12}"
        f"{'CPU µs/msg':>12}{'set-up s':>10}  all rounds (msg/s)"
    )
    lines = [head, "-" * len(head)]
    for name in CONTENDERS:
        s = summary.get(name)
        if s is None:
            continue
        cpu = s.get("cpu_us_per_msg_median")
        setup = s.get("setup_seconds_median")
        lines.append(
            f"{name:<18}{s['messages']:>7}{s['msg_per_s_median']:>16,.0f}"
            f"{s['seconds_median']:>12.2f}{(f'{cpu:.1f}' if cpu else '-'):>12}"
            f"{(f'{setup:.2f}' if setup is not None else '-'):>10}  "
            f"{', '.join(f'{x:,}' for x in s['msg_per_s_all'])}"
        )
    lines.append("")
    for key, value in summary["ratios"].items():
        if value is None:
            continue
        if key not in TARGETS:
            rounds = summary["ratios_per_round"].get(key, [])
            lines.append(f"{key:<30}{value:>7.2f}x  (no target: context)   per round {rounds}")
            continue
        target = TARGETS[key]
        verdict = "meets" if value >= target else "BELOW"
        rounds = summary["ratios_per_round"].get(key, [])
        lines.append(
            f"{key:<30}{value:>7.2f}x  target ≥ {target:g}x: {verdict}   per round {rounds}"
        )
    return "\n".join(lines)


def _errored(contender: str, n: int, rnd: int, attempt: int, exc: Exception) -> dict[str, Any]:
    return {
        "contender": contender,
        "messages": n,
        "round": rnd + 1,
        "attempt": attempt,
        "done": 0,
        "seconds": 0.0,
        "queues_after": None,
        "error": repr(exc)[:500],
    }


def _one_run(
    contender: str,
    vhost: str,
    url: str,
    n: int,
    log_dir: Path,
    rnd: int,
    attempt: int,
    args: argparse.Namespace,
    fills: list[float],
) -> dict[str, Any]:
    """Fresh queues, one contender run, then the queue depths checked; never raises on a
    wrong outcome. ``ok``: it handled all ``n`` messages (else the caller retries it and reports
    the failure); ``queues_ok``: the depths afterwards are the expected ones (a replay that
    leaves originals parked next to their confirmed copies is timed, and reported apart)."""
    asyncio.run(_fresh_queues(url))
    if contender != "aio-pika-publish":  # it publishes only: nothing to read
        fills.append(asyncio.run(_fill(url, n)))
        asyncio.run(common.wait_depths(url, {PARKING: n, TARGET: 0}, timeout_s=90.0, stable_s=None))
    tag = f"r{rnd + 1}-{contender}" + (f"-retry{attempt}" if attempt else "")
    profile = args.profile if contender in args.profile_only else None
    if contender == "rmqkit-cli":
        result = run_cli_list(url, n, log_dir, tag, profile)
    else:
        result = _run_worker(contender, vhost, n, log_dir, tag, profile)
    result["round"] = rnd + 1
    result["attempt"] = attempt
    # Wait for the expected depths. A replay: the target has all, nothing is left parked (a
    # parked original whose ack the broker dropped comes back as ready, possibly late: wait
    # for the depths to stay put for 15 s). A list: everything is back as ready.
    if contender in (*REPLAY_GROUP, RAW_REPLAY):
        expected = {PARKING: 0, TARGET: n}
        left = asyncio.run(
            common.wait_depths(url, expected, timeout_s=90.0, stable_s=15.0, watch_s=3.0)
        )
    else:
        expected = {PARKING: n, TARGET: 0}
        timeout_s = 90.0 if result["done"] == n else 5.0
        left = asyncio.run(common.wait_depths(url, expected, timeout_s, stable_s=None))
    result["queues_after"] = left
    result["ok"] = result["done"] == n
    result["queues_ok"] = left == expected
    print(
        f"round {rnd + 1} {contender:<17} {n:>6} msgs "
        f"{result['done'] / result['seconds']:>9,.0f} msg/s "
        f"{result['seconds']:7.2f}s  done {result['done']}  after {left}"
        f"{'' if result['queues_ok'] else f'  EXPECTED {expected}'}"
        f"{'' if result['ok'] else '  INCOMPLETE: retried' if attempt < args.retries else ''}",
        flush=True,
    )
    return result


def orchestrate(args: argparse.Namespace) -> int:
    groups = []
    replay_group = (*REPLAY_GROUP, RAW_REPLAY) if args.raw_replay else REPLAY_GROUP
    for candidates in (replay_group, LIST_GROUP):
        chosen = [c for c in candidates if not args.only or c in args.only]
        if chosen:
            groups.append(chosen)
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="rmqkit-parking-bench-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    samples: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    fills: list[float] = []
    started = time.monotonic()
    load_before = os.getloadavg()
    startup: float | None = None
    vhost, url = common.create_vhost("rmqkit-bench-parking")
    try:
        topology = log_dir / "parking-bench-topology.toml"
        topology.write_text(TOPOLOGY_TOML)
        common.declare(topology, url)
        target_def = {"durable": True, "arguments": {"x-queue-type": "quorum"}}
        common.api("PUT", f"/queues/{quote(vhost, safe='')}/{TARGET}", json=target_def)
        if any("rmqkit-cli" in g for g in groups):
            startup = common.rmqkit_startup(url)["seconds"]
        for rnd in range(args.rounds):
            for group in groups:
                shift = rnd % len(group)
                for contender in group[shift:] + group[:shift]:
                    n = args.naive_messages if contender == "naive" else args.messages
                    for attempt in range(1 + args.retries):
                        try:
                            result = _one_run(
                                contender, vhost, url, n, log_dir, rnd, attempt, args, fills
                            )
                        except Exception as exc:  # e.g. the shared broker was restarted
                            print(f"round {rnd + 1} {contender}: {exc!r}; retrying", flush=True)
                            failures.append(_errored(contender, n, rnd, attempt, exc))
                            common.wait_for_broker(url)
                            continue
                        if result["ok"]:
                            samples.append(result)
                            break
                        failures.append(result)
    finally:
        common.delete_vhost(vhost)
    summary = _summarize(samples)
    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": common.command_line("bench.parking_bench"),
        "params": {
            "rounds": args.rounds,
            "messages": args.messages,
            "naive_messages": args.naive_messages,
            "body_bytes": BODY_BYTES,
            "window": WINDOW,
        },
        "machine": common.machine_facts(load_before),
        "broker": common.broker_facts(),
        "versions": common.versions(),
        "cli_startup_seconds": startup,
        "fill_msg_per_s_median": statistics.median(fills) if fills else None,
        "total_seconds": time.monotonic() - started,
        "summary": summary,
        "samples": samples,
        "failed_runs": failures,
        "wrong_depth_runs": [
            {k: s[k] for k in ("round", "contender", "queues_after")}
            for s in samples
            if not s["queues_ok"]
        ],
        "logs": str(log_dir),
    }
    print()
    print(_table(summary))
    if startup is not None:
        print(f"\n`rmqkit --version` (start-up, imports): {startup:.2f}s median")
    print(f"fill: {report['fill_msg_per_s_median'] or 0:,.0f} msg/s median")
    print(f"worker logs in {log_dir}; total {report['total_seconds']:.0f}s")
    common.print_profiles(log_dir)
    common.write_report(report, args.json)
    if failures:
        print(f"\n{len(failures)} run(s) did not handle every message (not timed; retried):")
        for f in failures:
            print(
                f"  round {f['round']} {f['contender']}: done {f['done']} of {f['messages']}, "
                f"{f['seconds']:.1f}s, queues after {f['queues_after']}"
            )
    wrong = [s for s in samples if not s["queues_ok"]]
    if wrong:
        print(f"\n{len(wrong)} timed run(s) left unexpected queue depths:")
        for w in wrong:
            print(f"  round {w['round']} {w['contender']}: queues after {w['queues_after']}")
    missing = {
        c for g in groups for c in g if sum(s["contender"] == c for s in samples) < args.rounds
    }
    if missing:
        print(f"WARNING: no valid sample in some rounds for {sorted(missing)}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument(
        "--naive-messages",
        type=int,
        default=3_000,
        help="sample for the one-at-a-time replay (compared per message)",
    )
    parser.add_argument(
        "--raw-replay",
        action="store_true",
        help=f"add the {RAW_REPLAY} contender (a hand-written pipelined replay on aiormq)",
    )
    parser.add_argument(
        "--retries", type=int, default=2, help="re-runs of a run that lost or left messages"
    )
    parser.add_argument("--only", nargs="*", choices=CONTENDERS, help="run only these contenders")
    parser.add_argument("--json", help="write the full report here ('-': stdout)")
    parser.add_argument("--log-dir", help="worker logs and profiles (default: a temporary dir)")
    parser.add_argument("--profile", choices=("py-spy", "cprofile"), help="profile contenders")
    parser.add_argument(
        "--profile-only",
        nargs="*",
        default=["rmqkit-replay", "rmqkit-list", "rmqkit-cli"],
        help="contenders to profile with --profile (cprofile: not rmqkit-cli)",
    )
    # worker mode (internal)
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--vhost", help=argparse.SUPPRESS)
    parser.add_argument("--cprofile", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return parking_contenders.worker_main(args)
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())

"""Publish benchmark (issue 5): `rmqkit publish` from stdin against a raw aio-pika pipelined
confirmed publisher, same queue, same run.

Run from the repository root (the broker from docker-compose or scripts/broker-up)::

    .venv/bin/python -m bench.publish_bench --rounds 3 --messages 100000 --json out.json

docs/benchmarks.md, section "Publish", has the results and the why. What it does:

1. creates a throwaway vhost through the management API and writes a topology derived from
   ``bench/topology.toml`` to the log directory: the same quorum work queue ``bench.work`` (1 s
   retry tier, parking queue, rmqkit's policy with ``overflow = reject-publish``) plus a direct
   exchange ``bench.in`` bound to it with routing key ``bench.work``, and a ``max_length`` of
   ``max(1,000,000, 2N)``, so that the bound is there but refuses nothing; writes N lines of
   256-byte bodies to a file in the log directory; declares the topology with ``rmqkit
   declare`` and checks through the management API that the queue is quorum with that policy;
2. per round, times ``rmqkit --version`` (interpreter start-up and the CLI's imports), then runs
   each contender in an order rotated every round; before each run the work queue is deleted
   and declared again with ``rmqkit declare`` (a fresh quorum queue, empty; the policy applies
   by name), and after it the queue must hold exactly N messages (passive declares),
   else the run is invalid (left out of the medians, run again with ``--reruns``);
3. prints medians, per-round numbers and the ratios rmqkit / aio-pika, writes every sample as
   JSON (``--json``), deletes the vhost. ``--summarize REPORT`` recomputes the summary of a
   saved report. ``--profile py-spy`` records the rmqkit contenders (collapsed stacks in the log
   directory) and prints their hottest functions.

Contenders, each a process of its own:

``rmqkit-cli``  ``rmqkit publish bench.in bench.work --json`` with the body file on stdin (the
                CLI's defaults otherwise: window 1,000), timed by the orchestrator around the
                whole process, start-up included; its CPU from ``RUSAGE_CHILDREN``. Its JSON
                summary must say N published and N confirmed, none returned or nacked.
``rmqkit-lib``  what the CLI calls, in-process: ``publish_messages(settings, "bench.in",
                "bench.work", messages_from_lines(file), window=DEFAULT_WINDOW)``, timed around
                the call (connect, the exchange check, publishing, closing).
``aio-pika``    raw aio-pika: ``connect``, ``channel(publisher_confirms=True)``,
                ``get_exchange("bench.in")`` (a passive declare, as rmqkit checks the exchange),
                then one task per message through a sliding window of ``DEFAULT_WINDOW``
                (1,000) unconfirmed publishes: ``exchange.publish(Message(body,
                delivery_mode=PERSISTENT, message_id=uuid4().hex), "bench.work",
                mandatory=True)``, each confirm checked; timed from connect to the closed
                connection. The bodies are read from the file before the timed window.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

if __package__ in (None, ""):  # `python bench/publish_bench.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common

EXCHANGE = "bench.in"
QUEUE = "bench.work"
ROUTING_KEY = QUEUE
BODY_BYTES = 256
CONTENDERS = ("rmqkit-cli", "rmqkit-lib", "aio-pika")
TARGET = 0.8  # issue 5: rmqkit publish ≥ 80% of the raw pipelined publisher
WORKER_TIMEOUT_S = 600.0
TOPOLOGY_TOML = """\
# written by bench/publish_bench.py: bench/topology.toml's work queue, bound to an exchange, with
# a max_length that refuses nothing (the publish benchmark fills the queue, never consumes it)
[exchanges."{exchange}"]
type = "direct"

[queues."{queue}"]
bind = [{{ exchange = "{exchange}", routing_key = "{routing_key}" }}]
retry_delays = ["1s"]
max_attempts = 3
prefetch = 200
max_length = {max_length}
"""


# --- worker side (one contender, in its own process) --------------------------------------------


def _read_bodies(path: str) -> list[bytes]:
    with open(path, "rb") as lines:
        return [line.rstrip(b"\r\n") for line in lines]


def _timing(started: float, cpu_started: float) -> dict[str, Any]:
    return {
        "seconds": time.perf_counter() - started,
        "cpu_seconds": time.process_time() - cpu_started,
        "rss_kb_end": common.rss_kb(),
    }


async def _worker_aiopika(url: str, n: int, bodies_path: str, window: int) -> dict[str, Any]:
    import aio_pika
    from pamqp.commands import Basic

    bodies = _read_bodies(bodies_path)  # not timed: the CLI reads its stdin as it goes
    if len(bodies) != n:
        raise SystemExit(f"{bodies_path}: {len(bodies)} bodies, expected {n}")
    confirmed = 0
    failures: list[BaseException | object] = []
    started, cpu_started = time.perf_counter(), time.process_time()
    conn = await aio_pika.connect(url)
    try:
        channel = await conn.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(EXCHANGE)  # passive declare
        setup = time.perf_counter() - started
        slots = asyncio.Semaphore(window)

        async def one(body: bytes) -> None:
            nonlocal confirmed
            try:
                message = aio_pika.Message(
                    body,
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    message_id=uuid.uuid4().hex,
                )
                confirm = await exchange.publish(message, routing_key=ROUTING_KEY, mandatory=True)
                if isinstance(confirm, Basic.Ack):
                    confirmed += 1
                else:
                    failures.append(confirm)
            except Exception as exc:
                failures.append(exc)
            finally:
                slots.release()

        tasks: set[asyncio.Task[None]] = set()
        for body in bodies:
            await slots.acquire()
            task = asyncio.create_task(one(body))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
    finally:
        await conn.close()
    result = _timing(started, cpu_started)
    return {
        **result,
        "setup_seconds": setup,
        "published": n,
        "confirmed": confirmed,
        "not_confirmed": len(failures),
        "first_failure": repr(failures[0])[:300] if failures else None,
    }


async def _worker_rmqkit_lib(url: str, n: int, bodies_path: str, window: int) -> dict[str, Any]:
    from rmqkit.publish import messages_from_lines, publish_messages
    from rmqkit.settings import load_settings

    settings = load_settings(url=url)
    # blocking reads inside the loop, as the CLI iterates sys.stdin.buffer
    with open(bodies_path, "rb") as lines:  # noqa: ASYNC230
        started, cpu_started = time.perf_counter(), time.process_time()
        report = await publish_messages(
            settings, EXCHANGE, ROUTING_KEY, messages_from_lines(lines), window=window
        )
        result = _timing(started, cpu_started)
    return {**result, **report.as_dict()}


WORKERS = {"aio-pika": _worker_aiopika, "rmqkit-lib": _worker_rmqkit_lib}


def worker_main(args: argparse.Namespace) -> int:
    url = common.with_vhost(common.BASE_URL, args.vhost)
    rss_start = common.rss_kb()
    result = asyncio.run(WORKERS[args.worker](url, args.messages, args.bodies, args.window))
    result.update(contender=args.worker, messages=args.messages, rss_kb_start=rss_start)
    print(json.dumps(result), flush=True)
    return 0


# --- orchestrator side --------------------------------------------------------------------------


def write_bodies(path: Path, n: int) -> None:
    """N lines of 256-byte printable bodies, each distinct (its number first), newline-ended."""
    filler = (b"abcdefghijklmnopqrstuvwxyz0123456789" * (BODY_BYTES // 36 + 1))[:BODY_BYTES]
    with path.open("wb") as out:
        for i in range(n):
            head = b"msg-%09d-" % i
            out.write(head + filler[len(head) :] + b"\n")


def _window() -> int:
    from rmqkit.publish import DEFAULT_WINDOW

    return DEFAULT_WINDOW


async def _drop_queue(url: str) -> None:
    import aiormq

    conn = await aiormq.connect(url)
    try:
        channel = await conn.channel()
        await channel.queue_delete(QUEUE)
    finally:
        await conn.close()


def _check_policy(vhost: str, max_length: int, timeout_s: float = 20.0) -> dict[str, Any]:
    """Wait until the management API shows rmqkit's policy on the work queue (its queue view
    lags a few seconds behind a declare); the effective policy."""
    path = f"/queues/{quote(vhost, safe='')}/{quote(QUEUE, safe='')}"
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(Exception):
            queue = common.api("GET", path)
            effective: dict[str, Any] = queue.get("effective_policy_definition") or {}
            if (
                queue.get("type") == "quorum"
                and effective.get("max-length") == max_length
                and effective.get("overflow") == "reject-publish"
            ):
                return {"policy": queue.get("policy"), **effective}
        if time.monotonic() > deadline:
            raise RuntimeError(f"{QUEUE}: not a quorum queue with rmqkit's policy")
        time.sleep(0.5)


def _fresh_queue(url: str, topology: Path) -> None:
    """Delete the work queue and declare it again with `rmqkit declare` (the queue and its
    binding; the policies stay, and apply by name); check that it is empty."""
    asyncio.run(_drop_queue(url))
    common.declare(topology, url)
    left = asyncio.run(common.depths(url, [QUEUE]))
    if left[QUEUE]:
        raise RuntimeError(f"{QUEUE} holds {left[QUEUE]} right after being declared")


def _worker_cmd(contender: str, vhost: str, n: int, bodies: Path, window: int) -> list[str]:
    cmd = common.worker_cmd(["-m", "bench.publish_bench"], contender, vhost, n)
    return [*cmd, "--bodies", str(bodies), "--window", str(window)]


def _run_cli(
    url: str, n: int, bodies: Path, log_dir: Path, tag: str, profile: bool
) -> dict[str, Any]:
    """`rmqkit publish bench.in bench.work --json < bodies`, timed around the process."""
    cmd = [common.rmqkit_exe(), "publish", EXCHANGE, ROUTING_KEY, "--json"]
    if profile:
        cmd = common.py_spy(cmd, log_dir / f"{tag}.collapsed.txt")
    log_path = log_dir / f"{tag}.log"
    with bodies.open("rb") as stdin, log_path.open("w") as log:
        proc, seconds, cpu_seconds = common.run_timed(
            cmd,
            cwd=common.ROOT,
            env=common.cli_env(url),
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            timeout=WORKER_TIMEOUT_S,
        )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    summary = json.loads(lines[-1]) if lines else {}
    return {
        "contender": "rmqkit-cli",
        "messages": n,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "exit_code": proc.returncode,
        "stderr_tail": log_path.read_text()[-500:] if proc.returncode else "",
        **summary,
    }


def _run_one(
    contender: str,
    vhost: str,
    url: str,
    n: int,
    bodies: Path,
    window: int,
    log_dir: Path,
    tag: str,
    profile: bool,
) -> dict[str, Any]:
    if contender == "rmqkit-cli":
        return _run_cli(url, n, bodies, log_dir, tag, profile)
    cmd = _worker_cmd(contender, vhost, n, bodies, window)
    if profile:
        cmd = common.py_spy(cmd, log_dir / f"{tag}.collapsed.txt")
    return common.run_json_worker(cmd, log_dir / f"{tag}.log", WORKER_TIMEOUT_S + 60, contender)


def _invalid(s: dict[str, Any]) -> str | None:
    """Why a run does not count (None: it does)."""
    n = s["messages"]
    if s.get("error"):
        return str(s["error"])
    if s.get("exit_code"):
        return f"exit {s['exit_code']}"
    if s.get("published") != n or s.get("confirmed") != n:
        return f"published {s.get('published')}, confirmed {s.get('confirmed')} of {n}"
    if s.get("returned") or s.get("nacked") or s.get("not_confirmed"):
        return (
            f"returned {s.get('returned', 0)}, nacked {s.get('nacked', 0)}, "
            f"not confirmed {s.get('not_confirmed', 0)}"
        )
    if s.get("depth_after") != n:
        return f"the queue holds {s.get('depth_after')} after the run, not {n}"
    return None


def _rate(s: dict[str, Any]) -> float:
    return float(s["messages"] / s["seconds"])


def _summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    kept = [s for s in samples if s.get("kept") and not _invalid(s)]
    summary: dict[str, Any] = {}
    for name in CONTENDERS:
        runs = sorted((s for s in kept if s["contender"] == name), key=lambda s: s["round"])
        if not runs:
            continue
        rates = [_rate(r) for r in runs]
        cpu = [r["cpu_seconds"] / r["messages"] * 1e6 for r in runs]
        broker = [r["broker_cpu_s"] / r["messages"] * 1e6 for r in runs if "broker_cpu_s" in r]
        entry: dict[str, Any] = {
            "runs": len(runs),
            "rounds": [r["round"] for r in runs],
            "messages": runs[0]["messages"],
            "msg_per_s_median": statistics.median(rates),
            "msg_per_s_all": [round(x) for x in rates],
            "seconds_all": [round(r["seconds"], 2) for r in runs],
            "cpu_us_per_msg_median": statistics.median(cpu),
            "cpu_us_per_msg_all": [round(x, 1) for x in cpu],
            "broker_cpu_us_per_msg_median": statistics.median(broker) if broker else None,
            "foreign_cpu_share_all": [r.get("foreign_cpu_share") for r in runs],
        }
        setup = [r["setup_seconds"] for r in runs if r.get("setup_seconds") is not None]
        if setup:
            entry["setup_seconds_median"] = statistics.median(setup)
        if name == "rmqkit-cli":
            # context: the same run without the process start-up (`rmqkit --version` that round)
            bare = [r["messages"] / (r["seconds"] - r["startup_seconds"]) for r in runs]
            entry["msg_per_s_without_startup_median"] = statistics.median(bare)
            entry["msg_per_s_without_startup_all"] = [round(x) for x in bare]
            lean = [
                (r["cpu_seconds"] - r["startup_cpu_seconds"]) / r["messages"] * 1e6 for r in runs
            ]
            entry["cpu_us_per_msg_without_startup_median"] = statistics.median(lean)
        summary[name] = entry
    discarded: dict[str, int] = {}
    for s in samples:
        if not s.get("kept") or _invalid(s):
            discarded[s["contender"]] = discarded.get(s["contender"], 0) + 1
    ratios: dict[str, Any] = {}
    base = summary.get("aio-pika")
    for name in ("rmqkit-cli", "rmqkit-lib"):
        if base is None or name not in summary:
            continue
        per_round = []
        for rnd in sorted({s["round"] for s in kept}):
            a = [s for s in kept if s["round"] == rnd and s["contender"] == name]
            b = [s for s in kept if s["round"] == rnd and s["contender"] == "aio-pika"]
            if a and b:
                per_round.append(round(_rate(a[0]) / _rate(b[0]), 3))
        ratios[f"{name}_vs_aio-pika"] = {
            "medians": summary[name]["msg_per_s_median"] / base["msg_per_s_median"],
            "per_round": per_round,
            "cpu_per_msg": summary[name]["cpu_us_per_msg_median"] / base["cpu_us_per_msg_median"],
            "target": TARGET if name == "rmqkit-cli" else None,
        }
    if base and "rmqkit-cli" in summary:
        ratios["rmqkit-cli_without_startup_vs_aio-pika"] = {
            "medians": summary["rmqkit-cli"]["msg_per_s_without_startup_median"]
            / base["msg_per_s_median"],
            "target": None,
        }
    return {"contenders": summary, "ratios": ratios, "discarded_runs": discarded}


def _table(summary: dict[str, Any]) -> str:
    head = (
        f"{'contender':<12}{'runs':>5}{'msg/s (median)':>16}{'x aio-pika':>12}"
        f"{'CPU µs/msg':>12}{'broker µs':>11}{'others':>8}  all rounds (msg/s)"
    )
    lines = [head, "-" * len(head)]
    ratios = summary["ratios"]
    for name in CONTENDERS:
        s = summary["contenders"].get(name)
        if s is None:
            continue
        ratio = 1.0 if name == "aio-pika" else ratios.get(f"{name}_vs_aio-pika", {}).get("medians")
        broker = s.get("broker_cpu_us_per_msg_median")
        others = max((x or 0.0) for x in s["foreign_cpu_share_all"])
        lines.append(
            f"{name:<12}{s['runs']:>5}{s['msg_per_s_median']:>16,.0f}"
            f"{(f'{ratio:.2f}x' if ratio else '-'):>12}{s['cpu_us_per_msg_median']:>12.1f}"
            f"{(f'{broker:.1f}' if broker else '-'):>11}{others:>8.0%}"
            f"  {', '.join(f'{x:,}' for x in s['msg_per_s_all'])}"
        )
    cli = summary["contenders"].get("rmqkit-cli")
    if cli:
        lines.append(
            "rmqkit-cli without its start-up: "
            f"{cli['msg_per_s_without_startup_median']:,.0f} msg/s, "
            f"{cli['cpu_us_per_msg_without_startup_median']:.1f} CPU µs/msg (median)"
        )
    lines.append("")
    for key, r in ratios.items():
        line = f"{key:<40}{r['medians']:>6.2f}x (medians)"
        if r.get("per_round"):
            line += f"  per round {r['per_round']}"
        if r.get("target"):
            verdict = "meets" if r["medians"] >= r["target"] else "BELOW"
            line += f"  target ≥ {r['target']:g}x: {verdict}"
        lines.append(line)
    if summary["discarded_runs"]:
        lines.append(f"discarded (invalid or rerun) runs: {summary['discarded_runs']}")
    lines.append(
        "others: the most CPU other processes (not the contender, not the broker) took during "
        "one of its runs, as a share of the machine"
    )
    return "\n".join(lines)


def orchestrate(args: argparse.Namespace) -> int:
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: the vhost is deleted
    contenders = [c for c in CONTENDERS if not args.only or c in args.only]
    n = args.messages
    window = _window()
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="rmqkit-publish-bench-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    bodies = log_dir / f"bodies-{n}.txt"
    write_bodies(bodies, n)
    max_length = max(1_000_000, 2 * n)
    topology = log_dir / "publish-bench-topology.toml"
    topology.write_text(
        TOPOLOGY_TOML.format(
            exchange=EXCHANGE, queue=QUEUE, routing_key=ROUTING_KEY, max_length=max_length
        )
    )
    code = common.code_state()
    started = time.monotonic()
    load_before = os.getloadavg()
    samples: list[dict[str, Any]] = []
    startups: list[dict[str, Any]] = []
    vhost, url = common.create_vhost("rmqkit-bench-publish")
    try:
        common.declare(topology, url)
        policy = _check_policy(vhost, max_length)
        for rnd in range(1, args.rounds + 1):
            startup = common.rmqkit_startup(url)
            startups.append({"round": rnd, **startup})
            print(
                f"round {rnd}: `rmqkit --version` {startup['seconds']:.2f}s "
                f"(CPU {startup['cpu_seconds']:.2f}s)",
                flush=True,
            )
            shift = (rnd - 1) % len(contenders)
            for contender in contenders[shift:] + contenders[:shift]:
                profile = args.profile == "py-spy" and contender in args.profile_only
                for attempt in range(1 + args.reruns):
                    tag = f"r{rnd}-{contender}" + (f"-rerun{attempt}" if attempt else "")
                    sample: dict[str, Any] = {"contender": contender, "messages": n}
                    try:
                        _fresh_queue(url, topology)
                        waited = common.wait_quiet(args.quiet_wait) if args.quiet_wait else 0.0
                        loadavg = os.getloadavg()[0]
                        with common.CpuWatch() as watch:
                            sample = _run_one(
                                contender, vhost, url, n, bodies, window, log_dir, tag, profile
                            )
                        after = asyncio.run(common.wait_depths(url, {QUEUE: n}))
                        sample["depth_after"] = after[QUEUE]
                    except Exception as exc:  # e.g. someone restarted the broker
                        line = f"{type(exc).__name__}: {exc}".splitlines()[0]
                        sample.update(error=line[:300], seconds=0.0, cpu_seconds=0.0)
                        print(f"round {rnd} {contender:<11} FAILED ({line})", flush=True)
                        sample.update(round=rnd, attempt=attempt, kept=False)
                        samples.append(sample)
                        common.wait_for_broker(url)
                        continue
                    sample.update(
                        round=rnd,
                        attempt=attempt,
                        waited_for_quiet_s=round(waited, 1),
                        loadavg_1m=round(loadavg, 2),
                        foreign_cpu_share=round(watch.foreign_share, 3),
                        broker_cpu_s=round(watch.broker_cpu_s, 3),
                        process_cpu_s=round(watch.children_cpu_s, 3),
                        profiled=profile,
                    )
                    if contender == "rmqkit-cli":
                        sample["startup_seconds"] = startup["seconds"]
                        sample["startup_cpu_seconds"] = startup["cpu_seconds"]
                    invalid = _invalid(sample)
                    disturbed = watch.foreign_share > args.disturbed
                    sample["invalid"], sample["disturbed"] = invalid, disturbed
                    last = attempt == args.reruns
                    sample["kept"] = last or not (invalid or disturbed)
                    samples.append(sample)
                    print(
                        f"round {rnd} {contender:<11} {_rate(sample):>8,.0f} msg/s "
                        f"{sample['seconds']:6.2f}s  cpu "
                        f"{sample['cpu_seconds'] / n * 1e6:6.1f} µs/msg  broker "
                        f"{sample['broker_cpu_s'] / n * 1e6:6.1f} µs/msg  depth "
                        f"{sample['depth_after']}  others {sample['foreign_cpu_share']:.0%}  "
                        f"load {loadavg:.1f}"
                        + (f"  INVALID ({invalid})" if invalid else "")
                        + ("  DISTURBED" if disturbed else "")
                        + ("" if sample["kept"] else ": running it again"),
                        flush=True,
                    )
                    if sample["kept"]:
                        break
    finally:
        common.delete_vhost(vhost)
        bodies.unlink(missing_ok=True)
    summary = _summarize(samples)
    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": common.command_line("bench.publish_bench"),
        "params": {
            "rounds": args.rounds,
            "messages": n,
            "body_bytes": BODY_BYTES,
            "window": window,
            "queue": f"quorum {QUEUE} (rmqkit declare), max_length {max_length}, reject-publish",
            "exchange": f"{EXCHANGE} (direct), routing key {ROUTING_KEY}",
            "policy": policy,
            "quiet_wait_s": args.quiet_wait,
            "disturbed_above": args.disturbed,
            "reruns": args.reruns,
            "profile": args.profile,
        },
        "machine": common.machine_facts(load_before),
        "broker": common.broker_facts(),
        "versions": common.versions(),
        "code": code,
        "startup": startups,
        "total_seconds": round(time.monotonic() - started, 1),
        "summary": summary,
        "samples": samples,
        "logs": str(log_dir),
    }
    print()
    print(_table(summary))
    median_startup = statistics.median(s["seconds"] for s in startups) if startups else 0.0
    print(f"\n`rmqkit --version` (start-up, imports): {median_startup:.2f}s median")
    if code["modified"]:
        print(f"note: the working tree differs from {code['commit']} in {code['modified']}")
    print(f"logs in {log_dir}; total {report['total_seconds']:.0f}s")
    common.print_profiles(log_dir)
    common.write_report(report, args.json)
    missing = [c for c in contenders if summary["contenders"].get(c, {}).get("runs") != args.rounds]
    if missing:
        print(f"WARNING: no valid run in some rounds for {missing}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=100_000)
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
        "disturbed and run again (with --reruns; default 0.15)",
    )
    parser.add_argument(
        "--reruns",
        type=int,
        default=1,
        help="run an invalid, failed or disturbed run again, up to this many times (default 1)",
    )
    parser.add_argument("--log-dir", help="logs, the body file, profiles (default: a temp dir)")
    parser.add_argument("--profile", choices=("py-spy",), help="profile the rmqkit contenders")
    parser.add_argument(
        "--profile-only", nargs="+", choices=CONTENDERS, default=["rmqkit-cli", "rmqkit-lib"]
    )
    parser.add_argument(
        "--summarize",
        metavar="REPORT",
        help="only recompute the summary of a saved JSON report (with --json: write it back)",
    )
    # worker mode (internal: started by the orchestrator)
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--vhost", help=argparse.SUPPRESS)
    parser.add_argument("--bodies", help=argparse.SUPPRESS)
    parser.add_argument("--window", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(args)
    if args.summarize:
        return common.resummarize(args.summarize, args.json, _summarize, _invalid, _table)
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())

"""Lanes against head-of-line blocking (issue 15 acceptance): p99 latency of small jobs with a
lane for the large ones vs one queue for both, same run.

Run from the repository root (the broker from docker-compose or scripts/broker-up)::

    .venv/bin/python -m bench.lanes --rounds 3 --rate 200 --seconds 10 --json out.json

The load (seed 001 §3): a steady stream of ``--rate`` jobs a second for ``--seconds``, 5 % large
(handler 500 ms) and 95 % small (handler 2 ms), published at an even pace with pipelined
confirms. Per round, in an order rotated every round, two modes run one after the other against
a throwaway vhost with ``rmqkit declare``-d queues (topology below), each under a real
``rmqkit consume`` (one worker process):

``one-queue``  both kinds in ``single.work``, prefetch (= handler slots) 8;
``lanes``      small jobs in ``lanes.work`` (prefetch 4), large ones published straight to its
               lane ``lanes.work.lane.large`` (prefetch 4): the same 8 slots, split.

At this load the large jobs need about 5 slots on average (10 a second x 0.5 s): one queue with
8 slots is often full of them, and a small job then waits behind large ones; with the lane the
large jobs only ever hold the lane's 4 slots (the lane builds a backlog of its own), and the work
queue's 4 slots stay free for the small ones. Latency is handler end minus the publish time
written in the body (the publisher and the consumer share the machine's clock), for every small
job; the report gives p50/p99/max per mode and round, the medians over the rounds and the ratio
of the p99s (acceptance: one-queue / lanes >= 10). Every round checks that each job was handled
exactly once and that the queues are empty afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import rmqkit
from bench import common

TOPOLOGY = """
[queues."single.work"]
retry_delays = ["1s"]
prefetch = 8

[queues."lanes.work"]
retry_delays = ["1s"]
prefetch = 4

[queues."lanes.work".lanes.large]
header = { "x-lane" = "large" }
prefetch = 4
"""
MODES = {
    # mode: (queue consumed, where small jobs go, where large jobs go)
    "one-queue": ("single.work", "single.work", "single.work"),
    "lanes": ("lanes.work", "lanes.work", "lanes.work.lane.large"),
}
LARGE_SHARE, LARGE_S, SMALL_S = 0.05, 0.5, 0.002


# --- the handler (runs in the rmqkit consume worker) ----------------------------------------------
async def handle(message: rmqkit.Message) -> None:
    """Sleep the job's time, then append (kind, sent, end) to BENCH_LANES_OUT."""
    body = json.loads(message.body)
    await asyncio.sleep(body["sleep"])
    line = json.dumps({"id": message.message_id, "kind": body["kind"], "sent": body["sent"]})
    line = line[:-1] + f', "end": {time.time()!r}}}\n'
    fd = os.open(os.environ["BENCH_LANES_OUT"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


# --- one mode of one round ------------------------------------------------------------------------
async def _publish(url: str, mode: str, rate: float, seconds: float, seed: int) -> int:
    import aio_pika

    _, small_q, large_q = MODES[mode]
    rng = random.Random(seed)
    total = int(rate * seconds)
    conn = await aio_pika.connect(url)
    try:
        channel = await conn.channel()
        start = time.monotonic()
        pending: list[Any] = []
        for i in range(total):
            due = start + i / rate
            if (wait := due - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            large = rng.random() < LARGE_SHARE
            body = {
                "kind": "large" if large else "small",
                "sleep": LARGE_S if large else SMALL_S,
                "sent": time.time(),
            }
            pending.append(
                channel.default_exchange.publish(
                    aio_pika.Message(
                        json.dumps(body).encode(),
                        message_id=f"{mode}-{i}",
                        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                        headers={"x-lane": "large"} if large else {},
                    ),
                    routing_key=large_q if large else small_q,
                )
            )
            if len(pending) >= 20:  # confirms pipelined, the pace kept
                await asyncio.gather(*pending)
                pending = []
        await asyncio.gather(*pending)
        return total
    finally:
        await conn.close()


def _consumers(vhost: str, queue: str) -> int:
    found = common.api("GET", f"/queues/{quote(vhost, safe='')}/{quote(queue, safe='')}")
    return int(found.get("consumers") or 0)


def run_mode(
    vhost: str, url: str, topology: Path, mode: str, args: argparse.Namespace, seed: int
) -> dict[str, Any]:
    queue = MODES[mode][0]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "handled.jsonl"
        env = common.cli_env(url)
        env["BENCH_LANES_OUT"] = str(out)
        env["RMQKIT_MANAGEMENT_URL"] = common.MGMT_URL
        log = (Path(tmp) / "consume.log").open("w")
        cmd = [common.rmqkit_exe(), "consume", "bench.lanes:handle", "--queue", queue]
        proc = subprocess.Popen(
            [*cmd, "--topology", str(topology)], cwd=common.ROOT, env=env, stdout=log, stderr=log
        )
        try:
            deadline = time.monotonic() + 30
            while _consumers(vhost, queue) < 1 and time.monotonic() < deadline:
                time.sleep(0.3)
            time.sleep(0.5)
            total = asyncio.run(_publish(url, mode, args.rate, args.seconds, seed))
            deadline = time.monotonic() + args.seconds * 4 + 60
            rows: list[dict[str, Any]] = []
            while time.monotonic() < deadline:
                rows = _rows(out)
                if len(rows) >= total:
                    break
                time.sleep(0.5)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
            log.close()
        names = [queue] + (["lanes.work.lane.large"] if mode == "lanes" else [])
        left = asyncio.run(common.depths(url, names))
        ids = [r["id"] for r in rows]
        small = sorted(r["end"] - r["sent"] for r in rows if r["kind"] == "small")
        large = sorted(r["end"] - r["sent"] for r in rows if r["kind"] == "large")
        return {
            "mode": mode,
            "published": total,
            "handled": len(rows),
            "handled_twice": len(ids) - len(set(ids)),
            "left_in_queues": left,
            "small": _stats(small),
            "large": _stats(large),
        }


def _rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _stats(latencies: list[float]) -> dict[str, Any]:
    if not latencies:
        return {"count": 0}

    def q(p: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(len(latencies) * p))] * 1000, 1)

    return {"count": len(latencies), "p50_ms": q(0.5), "p99_ms": q(0.99), "max_ms": q(1.0)}


def invalid(sample: dict[str, Any]) -> str | None:
    """Why a sample does not count: not every job handled, one handled twice, jobs left."""
    if sample["handled"] != sample["published"]:
        return f"handled {sample['handled']} of {sample['published']}"
    if sample["handled_twice"]:
        return f"{sample['handled_twice']} handled twice"
    if any(sample["left_in_queues"].values()):
        return f"left in queues: {sample['left_in_queues']}"
    return None


def summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    valid = [s for s in samples if invalid(s) is None]
    out: dict[str, Any] = {}
    for mode in MODES:
        mine = [s for s in valid if s["mode"] == mode]
        if mine:
            out[mode] = {
                key: statistics.median(s["small"][key] for s in mine)
                for key in ("p50_ms", "p99_ms", "max_ms")
            }
            out[mode]["rounds"] = len(mine)
    if "lanes" in out and "one-queue" in out and out["lanes"]["p99_ms"]:
        out["p99_ratio_one_queue_over_lanes"] = round(
            out["one-queue"]["p99_ms"] / out["lanes"]["p99_ms"], 1
        )
    return out


def table(report: dict[str, Any]) -> str:
    lines = ["mode        small p50 ms   small p99 ms   small max ms   rounds"]
    for mode in MODES:
        row = report["summary"].get(mode)
        if row:
            lines.append(
                f"{mode:<11} {row['p50_ms']:>12} {row['p99_ms']:>14} {row['max_ms']:>14}"
                f" {row['rounds']:>8}"
            )
    ratio = report["summary"].get("p99_ratio_one_queue_over_lanes")
    lines.append(f"p99 one-queue / lanes: {ratio}x (acceptance: >= 10x)")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=200.0, help="jobs a second")
    parser.add_argument("--seconds", type=float, default=10.0, help="publishing time per mode")
    parser.add_argument("--json", default=None, help="write the report here (- for stdout)")
    args = parser.parse_args()
    load_before = os.getloadavg()
    vhost, url = common.create_vhost("bench-lanes")
    samples: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            topology = Path(tmp) / "lanes.toml"
            topology.write_text(TOPOLOGY)
            common.wait_for_broker(url)
            common.declare(topology, url)
            modes = list(MODES)
            for round_ in range(args.rounds):
                order = modes[round_ % 2 :] + modes[: round_ % 2]
                for mode in order:
                    sample = run_mode(vhost, url, topology, mode, args, seed=round_)
                    sample["round"] = round_
                    sample["invalid"] = invalid(sample)
                    samples.append(sample)
                    small = sample["small"]
                    print(
                        f"round {round_} {mode:<9} small p50 {small.get('p50_ms')} ms "
                        f"p99 {small.get('p99_ms')} ms max {small.get('max_ms')} ms; large p99 "
                        f"{sample['large'].get('p99_ms')} ms"
                        + (f" INVALID: {sample['invalid']}" if sample["invalid"] else ""),
                        flush=True,
                    )
    finally:
        common.delete_vhost(vhost)
    report = {
        "benchmark": "lanes",
        "command": common.command_line("bench.lanes"),
        "load": {
            "rate_per_s": args.rate,
            "seconds": args.seconds,
            "large_share": LARGE_SHARE,
            "large_handler_s": LARGE_S,
            "small_handler_s": SMALL_S,
            "slots": {"one-queue": 8, "lanes": "4 + 4"},
        },
        "machine": common.machine_facts(load_before),
        "broker": common.broker_facts(),
        "code": common.code_state(),
        "samples": samples,
        "summary": summarize(samples),
    }
    print(table(report))
    common.write_report(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

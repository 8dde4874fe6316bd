"""`rmqkit parking groups` on N parked messages, beside `parking stats` and a raw aio-pika browse.

Run from the repository root (a broker from docker-compose or scripts/broker-up)::

    .venv/bin/python -m bench.parking_groups --rounds 3 --messages 100000 --json out.json

What it does: creates a throwaway vhost, declares the parking benchmark's one-queue topology,
parks N messages once (bench.parking_bench's fill: 1 KB bodies, the headers the consumer writes,
512 header templates over four distinct failures, each failure's message with varying numbers
and ids; with the ``rmqkit-fingerprint`` header today's consumer writes, or with ``--legacy``
without it, as parked before fingerprints), then per round, in an order rotated every round,
times three contenders, each a process of its own from start to exit:

* ``groups``: ``rmqkit parking groups bench.work.parking --json`` (checks ``matched == N`` and
  that the four failures make exactly four groups);
* ``stats``: ``rmqkit parking stats bench.work.parking --json`` (checks the count);
* ``raw``: a plain aio-pika loop that receives all N without acking, in passes of at most
  60,000 each closed to requeue them (what a browse must at least do: every message over the
  wire once), in a child interpreter.

After each run the queue must hold N again (nothing consumed). Prints the medians of the rounds
and the ratios to ``stats`` and ``raw``; ``--json`` writes every sample. docs/benchmarks.md,
section "Failure groups", has the results.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench.parking_bench import TOPOLOGY_TOML, _fill
from bench.parking_contenders import ERRORS, PARKING

CONTENDERS = ("groups", "stats", "raw")
LIMIT_S = 10.0  # what `groups` on 100,000 parked messages must answer within


async def _raw_browse(url: str, n: int) -> None:
    """Receive all ``n`` without acking, in passes of at most 60,000 (prefetch is 16-bit; a
    quorum queue caps an unlimited one at 2,000, and nothing is acked to free it): each pass
    on a channel of its own, closed once its messages are in, so the broker requeues them
    (behind the rest, on 3.x: the next pass gets the next ones). What rmqkit's browse does,
    without anything else."""
    import aio_pika

    conn = await aio_pika.connect(url)
    try:
        remaining = n
        while remaining > 0:
            size = min(remaining, 60_000)
            channel = await conn.channel()
            await channel.set_qos(prefetch_count=size)
            queue = await channel.get_queue(PARKING, ensure=False)
            seen = 0
            async with queue.iterator(no_ack=False) as messages:
                async for _ in messages:
                    seen += 1
                    if seen == size:
                        break
            await channel.close()
            remaining -= size
    finally:
        await conn.close()


def _run(contender: str, url: str, n: int) -> dict[str, Any]:
    env = common.cli_env(url)
    if contender == "raw":
        cmd = [sys.executable, "-m", "bench.parking_groups", "--worker-raw", url, str(n)]
    else:
        cmd = [common.rmqkit_exe(), "parking", contender, PARKING, "--json"]
    started = time.perf_counter()
    done = subprocess.run(
        cmd, cwd=common.ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    seconds = time.perf_counter() - started
    sample: dict[str, Any] = {"contender": contender, "seconds": seconds, "rc": done.returncode}
    if contender == "groups":
        report = json.loads(done.stdout)
        sample["matched"] = report["matched"]
        sample["groups"] = len(report["groups"])
        sample["ok"] = done.returncode == 0 and (report["matched"], len(report["groups"])) == (
            n,
            len(ERRORS),
        )
    elif contender == "stats":
        sample["ok"] = done.returncode in (0, 1, 2) and str(n) in done.stdout
    else:
        sample["ok"] = done.returncode == 0
    if not sample["ok"]:
        sample["stderr"] = done.stderr[-2000:]
    return sample


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", dest="json_out")
    parser.add_argument(
        "--legacy",
        action="store_true",
        help="park without the rmqkit-fingerprint header (as parked before fingerprints: "
        "each message's is computed from its stored traceback)",
    )
    parser.add_argument("--worker-raw", nargs=2, metavar=("URL", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker_raw:
        asyncio.run(_raw_browse(args.worker_raw[0], int(args.worker_raw[1])))
        return 0
    n = args.messages
    load_before = os.getloadavg()
    vhost, url = common.create_vhost("rmqkit-bench-groups")
    samples: list[dict[str, Any]] = []
    try:
        topology = Path(common.ROOT) / "bench" / ".groups-topology.toml"
        topology.write_text(TOPOLOGY_TOML)
        try:
            common.declare(topology, url)
        finally:
            topology.unlink()
        rate = asyncio.run(_fill(url, n, fingerprints=not args.legacy))
        how = "without fingerprint headers" if args.legacy else "with fingerprint headers"
        print(f"parked {n} messages {how} ({rate:,.0f}/s)", flush=True)
        for rnd in range(args.rounds):
            order = CONTENDERS[rnd % 3 :] + CONTENDERS[: rnd % 3]
            for contender in order:
                sample = _run(contender, url, n)
                held = asyncio.run(common.wait_depths(url, {PARKING: n}))
                sample["round"] = rnd + 1
                sample["depth_after"] = held
                samples.append(sample)
                print(
                    f"round {rnd + 1} {contender:6} {sample['seconds']:6.2f} s"
                    + ("" if sample["ok"] else f"  FAILED: {sample.get('stderr', '')[-300:]}"),
                    flush=True,
                )
    finally:
        common.delete_vhost(vhost)
    medians = {
        c: statistics.median(s["seconds"] for s in samples if s["contender"] == c and s["ok"])
        for c in CONTENDERS
        if any(s["contender"] == c and s["ok"] for s in samples)
    }
    ratios = {
        f"groups/{c}": medians["groups"] / medians[c]
        for c in ("stats", "raw")
        if "groups" in medians and c in medians
    }
    print(f"medians (s): {json.dumps({c: round(v, 2) for c, v in medians.items()})}")
    print(f"ratios: {json.dumps({k: round(v, 2) for k, v in ratios.items()})}")
    within = medians.get("groups", float("inf")) < LIMIT_S
    print(f"groups on {n:,} parked messages under {LIMIT_S:.0f} s: {'yes' if within else 'NO'}")
    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": common.command_line("bench.parking_groups"),
        "params": {"messages": n, "rounds": args.rounds, "legacy": args.legacy},
        "machine": common.machine_facts(load_before),
        "broker": common.broker_facts(),
        "versions": common.versions(),
        "medians_s": medians,
        "ratios": ratios,
        "samples": samples,
    }
    common.write_report(report, args.json_out)
    return 0 if within and all(s["ok"] for s in samples) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Delay ladder benchmark (issue 15): quorum rungs against classic rungs, same run.

Run from the repository root (the broker from docker-compose or scripts/broker-up)::

    .venv/bin/python -m bench.delay_ladder --messages 5000 --rate 1000 --unit-ms 10 \\
        --max-delay-ms 5000 --rounds 2 --json out.json

docs/delay.md, section "Costs", has the results. Per round and per ladder kind (the order
rotated every round), in a throwaway vhost: declare a ladder (``Ladder.for_max_delay``) with an
exit into a topic exchange bound to one quorum work queue; publish N messages with delays drawn
uniformly from [unit, max] (seeded) at ``--rate`` messages/s through one confirming channel, each
with its own message id; consume the work queue and record when each id arrives. Reported per
kind: messages lost (must be 0), duplicates, the error (arrival - publish - delay) min / median /
p99 / max in ms, the mean number of hops, and the broker's CPU seconds for the whole run (from
/proc, the broker on this machine) with the share of the machine others used meanwhile
(``foreign_share``: a high one means the numbers were slowed down by someone else).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import time
from typing import TYPE_CHECKING, Any, cast

from bench import common

if TYPE_CHECKING:
    from rmqkit.delay.ladder import QueueType


async def _settle(arrived: dict[str, list[float]], count: int, timeout_s: float) -> None:
    """Poll (a benchmark's coarse wait: 100 ms steps) until ``count`` ids arrived or the
    timeout, then half a second more for duplicates."""
    deadline = time.monotonic() + timeout_s
    while len(arrived) < count and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)


async def _one(url: str, kind: QueueType, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    from rmqkit.broker.codec import Properties
    from rmqkit.broker.session import session
    from rmqkit.delay import Ladder, declare_ladder
    from rmqkit.settings import load_settings

    ladder = Ladder.for_max_delay(
        args.max_delay_ms, prefix=f"bench-{kind}", unit_ms=args.unit_ms, queue_type=kind
    )
    work = f"bench.work.{kind}"
    rng = random.Random(seed)
    delays = {
        f"{kind}-{i}": rng.randint(args.unit_ms, args.max_delay_ms) for i in range(args.messages)
    }
    sent: dict[str, float] = {}
    arrived: dict[str, list[float]] = {}
    hops: list[int] = []
    async with session(load_settings(url=url)) as s:
        await s.declare(
            [{"exchange": "bench.in", "exchange_type": "topic", "durable": True}],
            [{"queue": work, "durable": True, "arguments": {"x-queue-type": "quorum"}}],
            [{"queue": work, "exchange": "bench.in", "routing_key": f"{kind}.#", "label": work}],
        )
        await declare_ladder(s, ladder, targets=[("bench.in", "")])
        consumer = await s.channel()
        await consumer.qos(1000)

        async def on_delivery(delivery: Any) -> None:
            arrived.setdefault(delivery.header.properties.message_id, []).append(time.monotonic())
            await consumer.ack(delivery.delivery.delivery_tag)

        await consumer.consume(work, on_delivery)
        channel = await s.channel(confirms=True)
        pending = []
        started = time.monotonic()
        for i, (message_id, delay) in enumerate(delays.items()):
            due = started + i / args.rate
            if (ahead := due - time.monotonic()) > 0:
                await asyncio.sleep(ahead)
            plan = ladder.plan(delay, "bench.in", f"{kind}.x")
            hops.append(plan.hops)
            sent[message_id] = time.monotonic()
            pending.append(
                await channel.publisher.publish(
                    b"x" * 256,
                    exchange=plan.exchange,
                    routing_key=plan.routing_key,
                    properties=Properties(
                        message_id=message_id, delivery_mode=2, headers=plan.headers
                    ),
                )
            )
        outcomes = await asyncio.gather(*pending)
        publish_s = time.monotonic() - started
        await _settle(arrived, len(delays), args.max_delay_ms / 1000 + 30)
    errors = sorted(
        (times[0] - sent[m]) * 1000 - delays[m] for m, times in arrived.items() if m in sent
    )
    return {
        "kind": kind,
        "messages": len(delays),
        "not_confirmed": sum(1 for o in outcomes if o.name != "CONFIRMED"),
        "lost": len(set(delays) - set(arrived)),
        "duplicates": sum(len(t) - 1 for t in arrived.values()),
        "publish_rate": round(len(delays) / publish_s),
        "mean_hops": round(statistics.mean(hops), 2),
        "error_ms": {
            "min": round(errors[0], 1),
            "median": round(statistics.median(errors), 1),
            "p99": round(errors[max(0, int(len(errors) * 0.99) - 1)], 1),
            "max": round(errors[-1], 1),
        }
        if errors
        else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--rate", type=float, default=1000.0, help="publishes per second")
    parser.add_argument("--unit-ms", type=int, default=10)
    parser.add_argument("--max-delay-ms", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--kinds", default="quorum,classic")
    parser.add_argument("--json", default=None, help="write the report here (- for stdout)")
    args = parser.parse_args()
    load_before = os.getloadavg()
    kinds = [cast("QueueType", kind) for kind in args.kinds.split(",")]
    runs = []
    for round_no in range(args.rounds):
        order = kinds[round_no % len(kinds) :] + kinds[: round_no % len(kinds)]
        for kind in order:
            vhost, url = common.create_vhost("bench-delay")
            try:
                with common.CpuWatch() as watch:
                    result = asyncio.run(_one(url, kind, args, seed=round_no))
            finally:
                common.delete_vhost(vhost)
            result |= {
                "round": round_no,
                "seconds": round(watch.seconds, 2),
                "broker_cpu_s": round(watch.broker_cpu_s, 2),
                "foreign_share": round(watch.foreign_share, 2),
            }
            print(result, flush=True)
            runs.append(result)
    report = {
        "command": common.command_line("bench.delay_ladder"),
        "machine": common.machine_facts(load_before),
        "broker": common.broker_facts(),
        "code": common.code_state(),
        "runs": runs,
    }
    common.write_report(report, args.json)


if __name__ == "__main__":
    main()

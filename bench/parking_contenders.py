"""The contenders of bench/parking_bench.py, and the parked messages they work on.

Each contender but ``rmqkit-cli`` runs in a worker process of its own (``parking_bench.py --worker
NAME``: its own interpreter and event loop), times itself and prints one JSON line;
``rmqkit-cli`` is the CLI itself, timed by the orchestrator around the process (``run_cli_list``).

Replay group (each worker times itself; connection set-up included for rmqkit only):

``naive``            aio-pika, one message at a time: ``queue.get()`` → build the replay copy →
                     ``default_exchange.publish(mandatory=True)`` (waits for its confirm) →
                     ``message.ack()``. Runs on ``--naive-messages`` (default 3,000): at its rate
                     50,000 per round would not fit the time budget; compared per message.
``rmqkit-replay``    ``rmqkit.parking.replay.replay_parked(settings, "bench.work.parking",
                     ParkedFilter(), routing_key="bench.target")``, timed around the whole call
                     (connect, management API check, browse, confirms, acks, returns).
``aio-pika-publish`` the raw confirmed-publish rate: N replay copies (same body, same headers as
                     a replay writes) published to ``bench.target`` with ``mandatory=True`` through
                     a sliding window of 1,000 unconfirmed publishes (rmqkit's PUBLISH_WINDOW).
                     Publishes only: it reads and acks nothing.
``aiormq-replay``    (``--raw-replay``) a hand-written pipelined replay on aiormq: consume the
                     whole queue, publish each copy with confirms through the same window, ack
                     each original after its confirm: the same broker work as rmqkit's replay,
                     without its checks, filters, typed codec and reporting.

List group:

``rmqkit-list``      ``list_parked(settings, queue, ParkedFilter(), on_message)`` where on_message
                     writes ``json.dumps(message.summary())`` + newline to /dev/null, as the CLI's
                     ``--json`` does; timed around the call.
``rmqkit-cli``       ``rmqkit parking list bench.work.parking --json`` as a subprocess (RMQKIT_URL
                     set to the vhost), stdout to a file whose lines are counted; timed by the
                     orchestrator around the process, so Python start-up and imports are included
                     (``rmqkit --version`` is timed too, to show what start-up alone costs).
``aio-pika-consume`` a raw aio-pika consume of the same queue: ``queue.consume(callback)`` with the
                     prefetch rmqkit's browse uses (the whole queue, up to 60,000), counting
                     deliveries, then ``nack(multiple=True, requeue=True)`` of the last one, so it
                     leaves the queue as rmqkit does; timed from connect to the nack.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench import common

WORK = "bench.work"
PARKING = "bench.work.parking"
TARGET = "bench.target"
BODY_BYTES = 1024
WINDOW = 1000  # unconfirmed publishes in flight: fill, aio-pika-publish (= rmqkit PUBLISH_WINDOW)
FILL_TEMPLATES = 512  # distinct header sets (reason, error, failure times) among the parked
MAX_PREFETCH = 60_000  # rmqkit.parking.browse.MAX_WINDOW
REPLAY_GROUP = ("naive", "rmqkit-replay", "aio-pika-publish")
RAW_REPLAY = "aiormq-replay"  # opt-in (--raw-replay): what a hand-written pipelined replay gets
LIST_GROUP = ("rmqkit-list", "rmqkit-cli", "aio-pika-consume")
CONTENDERS = (*REPLAY_GROUP, RAW_REPLAY, *LIST_GROUP)
WORKER_TIMEOUT_S = 300.0

# --- the parked messages ------------------------------------------------------------------------

ERRORS = (
    # (reason, error type, error message): what the consumer writes (rmqkit.consumer.decision)
    ("exhausted", "myapp.payments.GatewayTimeout", "payment gateway did not answer within 10s"),
    ("permanent", "myapp.errors.InvalidOrder", "order 4711: unknown SKU 'ZX-9000-B' in line 3"),
    ("undecodable", "json.decoder.JSONDecodeError", "Expecting value: line 1 column 1 (char 0)"),
    ("exhausted", "ConnectionResetError", "[Errno 104] Connection reset by peer"),
)
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/srv/app/.venv/lib/python3.11/site-packages/rmqkit/consumer/runner.py", line 412, '
    "in _run_handler\n    await asyncio.wait_for(self._handler(delivery), timeout)\n"
    '  File "/srv/app/myapp/handlers.py", line 88, in handle_order\n'
    "    await payments.charge(order)\n"
    '  File "/srv/app/myapp/payments.py", line 141, in charge\n'
    "    raise GatewayTimeout(f'payment gateway did not answer within {timeout}s')\n"
)


def _body(i: int) -> bytes:
    """A 1 KB JSON order (the size is exact)."""
    head = json.dumps({"order_id": i, "customer": f"c-{i % 9973:05d}", "lines": [], "note": ""})
    pad = BODY_BYTES - len(head)
    return head.replace('"note": ""', '"note": "' + "x" * pad + '"').encode()


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parked_headers(i: int, now: datetime, *, fingerprints: bool = False) -> dict[str, Any]:
    """Headers of a message rmqkit's consumer parked (spread over the last two days);
    ``fingerprints``: with the failure fingerprint today's consumer writes."""
    reason, etype, emsg = ERRORS[i % len(ERRORS)]
    last = now - timedelta(seconds=(i * 37) % 172_800)
    headers: dict[str, Any] = {
        "rmqkit-attempt": 3 if reason == "exhausted" else 1,
        "rmqkit-origin-queue": WORK,
        "rmqkit-original-exchange": "orders",
        "rmqkit-original-routing-key": "order.created",
        "rmqkit-first-failed-at": _iso(last - timedelta(seconds=6)),
        "rmqkit-last-failed-at": _iso(last),
        "rmqkit-error-type": etype,
        "rmqkit-error-message": emsg,
        "rmqkit-host": f"worker-{i % 4}",
        "rmqkit-pid": 4000 + i % 4,
        "rmqkit-park-reason": reason,
    }
    if reason == "exhausted":  # parked from a retry copy: the tier headers stay
        headers["rmqkit-retry-tier"] = 0
        headers["rmqkit-retry-delay-ms"] = 1000
    if reason != "undecodable":
        headers["rmqkit-traceback"] = TRACEBACK
    if fingerprints:
        from rmqkit.fingerprint import fingerprint

        traceback = headers.get("rmqkit-traceback")
        headers["rmqkit-fingerprint"] = fingerprint(reason, etype, emsg, traceback).id
    return headers


def replay_copy_headers(headers: dict[str, Any], now: datetime) -> dict[str, Any]:
    """What rmqkit.parking.replay.replay_headers makes of them (the broker's x- headers dropped)."""
    out = {k: v for k, v in headers.items() if not k.startswith("x-")}
    out["rmqkit-attempt"] = 0
    previous = out.get("rmqkit-replay-count")
    out["rmqkit-replay-count"] = (previous if isinstance(previous, int) else 0) + 1
    out["rmqkit-replayed-at"] = _iso(now)
    return out


BODIES = [_body(i) for i in range(64)]  # the parked bodies, in turn


# --- worker side (one contender, in its own process) ----------------------------------------------


def _timing(started: float, cpu_started: float, first: float | None) -> dict[str, Any]:
    return {
        "seconds": time.perf_counter() - started,
        "cpu_seconds": time.process_time() - cpu_started,
        # from the start of the timed window to the first message: connect, checks, set-up
        "setup_seconds": (first - started) if first is not None else None,
        "rss_kb_end": common.rss_kb(),
    }


async def _worker_naive(url: str, n: int) -> dict[str, Any]:
    import aio_pika
    from pamqp.commands import Basic

    conn = await aio_pika.connect(url)
    try:
        channel = await conn.channel(publisher_confirms=True)
        queue = await channel.get_queue(PARKING, ensure=True)
        exchange = channel.default_exchange
        moved = 0
        started, cpu_started = time.perf_counter(), time.process_time()
        while moved < n:
            got = await queue.get(no_ack=False, fail=False)
            if got is None:
                break
            copy = aio_pika.Message(
                got.body,
                headers=replay_copy_headers(dict(got.headers), datetime.now(UTC)),
                content_type=got.content_type,
                content_encoding=got.content_encoding,
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                priority=got.priority,
                correlation_id=got.correlation_id,
                reply_to=got.reply_to,
                message_id=got.message_id,
                timestamp=got.timestamp,
                type=got.type,
                app_id=got.app_id,
            )
            confirm = await exchange.publish(copy, routing_key=TARGET, mandatory=True)
            if not isinstance(confirm, Basic.Ack):
                raise RuntimeError(f"not confirmed: {confirm!r}")
            await got.ack()
            moved += 1
        result = _timing(started, cpu_started, started)
    finally:
        await conn.close()
    return {**result, "done": moved}


async def _worker_rmqkit_replay(url: str, n: int) -> dict[str, Any]:
    from rmqkit.parking.model import ParkedFilter
    from rmqkit.parking.replay import replay_parked
    from rmqkit.settings import load_settings

    settings = load_settings(url=url)
    first: float | None = None

    def progress(seen: int, total: int) -> None:
        nonlocal first
        if first is None:
            first = time.perf_counter()

    started, cpu_started = time.perf_counter(), time.process_time()
    report = await replay_parked(
        settings, PARKING, ParkedFilter(), routing_key=TARGET, progress=progress
    )
    result = _timing(started, cpu_started, first)
    return {**result, "done": report.moved, "report": report.as_dict("replayed")}


async def _worker_aiopika_publish(url: str, n: int) -> dict[str, Any]:
    import aio_pika
    from pamqp.commands import Basic

    now = datetime.now(UTC)
    run = uuid.uuid4().hex[:8]
    # the header tables of the parked messages, as a replay receives them (built before the
    # timed window: a replay gets them decoded from the delivery)
    parked = [parked_headers(i, now) for i in range(FILL_TEMPLATES)]
    conn = await aio_pika.connect(url)
    try:
        channel = await conn.channel(publisher_confirms=True)
        exchange = channel.default_exchange
        window = asyncio.Semaphore(WINDOW)
        confirmed = 0
        failures: list[BaseException] = []

        async def one(i: int) -> None:
            nonlocal confirmed
            try:
                message = aio_pika.Message(
                    BODIES[i % len(BODIES)],
                    headers=replay_copy_headers(parked[i % FILL_TEMPLATES], now),
                    content_type="application/json",
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    message_id=f"{run}-{i}",
                    timestamp=now,
                )
                confirm = await exchange.publish(message, routing_key=TARGET, mandatory=True)
                if not isinstance(confirm, Basic.Ack):
                    raise RuntimeError(f"not confirmed: {confirm!r}")
                confirmed += 1
            except BaseException as exc:
                failures.append(exc)
            finally:
                window.release()

        tasks = set()
        started, cpu_started = time.perf_counter(), time.process_time()
        for i in range(n):
            await window.acquire()
            task = asyncio.create_task(one(i))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        while tasks:
            await asyncio.gather(*tasks)
        result = _timing(started, cpu_started, started)
        if failures:
            raise RuntimeError(f"{len(failures)} publishes failed, e.g. {failures[0]!r}")
    finally:
        await conn.close()
    return {**result, "done": confirmed}


def _devnull() -> Any:
    return open(os.devnull, "w")  # the caller uses it as a context manager


async def _worker_rmqkit_list(url: str, n: int) -> dict[str, Any]:
    from rmqkit.parking.model import ParkedFilter, ParkedMessage
    from rmqkit.parking.ops import list_parked
    from rmqkit.settings import load_settings

    settings = load_settings(url=url)
    first: float | None = None
    last = 0.0
    count = 0
    with _devnull() as out:

        def on_message(message: ParkedMessage) -> None:  # what `list --json` does per message
            nonlocal first, last, count
            out.write(json.dumps(message.summary(), default=str) + "\n")
            count += 1
            last = time.perf_counter()
            if first is None:
                first = last

        started, cpu_started = time.perf_counter(), time.process_time()
        stats = await list_parked(settings, PARKING, ParkedFilter(), on_message)
        result = _timing(started, cpu_started, first)
    return {
        **result,
        "done": count,
        "to_last_message_seconds": last - started,
        "browse": {"seen": stats.seen, "kept": stats.kept, "queue_count": stats.queue_count},
    }


async def _worker_aiopika_consume(url: str, n: int) -> dict[str, Any]:
    import aio_pika

    count = 0
    last_message: aio_pika.abc.AbstractIncomingMessage | None = None
    all_in = asyncio.Event()
    first: float | None = None
    last = 0.0
    started, cpu_started = time.perf_counter(), time.process_time()
    conn = await aio_pika.connect(url)
    try:
        channel = await conn.channel()
        await channel.set_qos(prefetch_count=min(n, MAX_PREFETCH))
        queue = await channel.get_queue(PARKING, ensure=True)

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            nonlocal count, last_message, first, last
            count += 1
            last_message = message
            last = time.perf_counter()
            if first is None:
                first = last
            if count >= n:
                all_in.set()

        tag = await queue.consume(on_message)
        await asyncio.wait_for(all_in.wait(), timeout=WORKER_TIMEOUT_S)
        await queue.cancel(tag)
        assert last_message is not None
        await last_message.nack(multiple=True, requeue=True)
        result = _timing(started, cpu_started, first)
    finally:
        await conn.close()
    return {**result, "done": count, "to_last_message_seconds": last - started}


async def _worker_aiormq_replay(url: str, n: int) -> dict[str, Any]:
    """A hand-written pipelined replay on aiormq (what rmqkit is built on): consume the whole
    queue (prefetch N), publish each copy with confirms through a window of 1,000, ack each
    original after its copy's confirm; no filters, no typed codec, no progress, no checks."""
    import aiormq
    from pamqp import commands as spec

    now = datetime.now(UTC)
    started, cpu_started = time.perf_counter(), time.process_time()
    conn = await aiormq.connect(url)
    try:
        consumer = await conn.channel()
        publisher = await conn.channel(publisher_confirms=True)
        await consumer.basic_qos(prefetch_count=min(n, MAX_PREFETCH))
        inbox: asyncio.Queue[Any] = asyncio.Queue()

        async def on_delivery(message: Any) -> None:
            inbox.put_nowait(message)

        window = asyncio.Semaphore(WINDOW)
        confirmed = 0
        first: float | None = None

        async def send(message: Any) -> None:
            nonlocal confirmed
            props = message.header.properties
            try:
                copy = spec.Basic.Properties(
                    content_type=props.content_type,
                    headers=replay_copy_headers(dict(props.headers or {}), now),
                    delivery_mode=2,
                    message_id=props.message_id,
                    timestamp=props.timestamp,
                )
                result = await publisher.basic_publish(
                    message.body, routing_key=TARGET, properties=copy, mandatory=True
                )
            finally:
                window.release()
            if not isinstance(result, spec.Basic.Ack):
                raise RuntimeError(f"not confirmed: {result!r}")
            await consumer.basic_ack(message.delivery.delivery_tag)
            confirmed += 1

        ok = await consumer.basic_consume(PARKING, on_delivery, no_ack=False)
        tasks: set[asyncio.Task[None]] = set()
        for _ in range(n):
            message = await inbox.get()
            if first is None:
                first = time.perf_counter()
            await window.acquire()
            task = asyncio.create_task(send(message))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        while tasks:
            await asyncio.gather(*tasks)
        assert ok.consumer_tag is not None
        await consumer.basic_cancel(ok.consumer_tag)
        await consumer.close()
        result = _timing(started, cpu_started, first)
    finally:
        await conn.close()
    return {**result, "done": confirmed}


WORKERS = {
    "naive": _worker_naive,
    RAW_REPLAY: _worker_aiormq_replay,
    "rmqkit-replay": _worker_rmqkit_replay,
    "aio-pika-publish": _worker_aiopika_publish,
    "rmqkit-list": _worker_rmqkit_list,
    "aio-pika-consume": _worker_aiopika_consume,
}


def worker_main(args: argparse.Namespace) -> int:
    url = common.with_vhost(common.BASE_URL, args.vhost)
    result = common.run_profiled(WORKERS[args.worker](url, args.messages), args.cprofile)
    result.update(contender=args.worker, messages=args.messages)
    print(json.dumps(result), flush=True)
    return 0


# --- rmqkit-cli: run by the orchestrator ------------------------------------------------------


def run_cli_list(url: str, n: int, log_dir: Path, tag: str, profile: str | None) -> dict[str, Any]:
    """`rmqkit parking list QUEUE --json` end to end; stdout to a file, its lines counted."""
    out_path = log_dir / f"{tag}.ndjson"
    cmd = [common.rmqkit_exe(), "parking", "list", PARKING, "--json"]
    if profile == "py-spy":
        cmd = common.py_spy(cmd, log_dir / f"{tag}.collapsed.txt")
    with out_path.open("w") as out, (log_dir / f"{tag}.log").open("w") as log:
        proc, seconds, cpu_seconds = common.run_timed(
            cmd,
            cwd=common.ROOT,
            env=common.cli_env(url),
            stdout=out,
            stderr=log,
            timeout=WORKER_TIMEOUT_S,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"rmqkit parking list failed (exit {proc.returncode}), see {log_dir}")
    with out_path.open("rb") as out:
        count = sum(1 for _ in out)
        out.seek(0)
        keys = sorted(json.loads(out.readline())) if count else []
    out_path.unlink()  # ~1.5 KB a line
    return {
        "contender": "rmqkit-cli",
        "messages": n,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "done": count,
        "ndjson_keys": keys,
    }

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

Replay group (each worker times itself; connection set-up included for rmqkit only):

``naive``            aio-pika, one message at a time: ``queue.get()`` → build the replay copy →
                     ``default_exchange.publish(mandatory=True)`` (waits for its confirm) →
                     ``message.ack()``. Runs on ``--naive-messages`` (default 3,000): at its rate
                     50,000 per round would not fit the time budget; compared per message.
``rmqkit-replay``    ``rmqkit.parking.ops.replay_parked(settings, "bench.work.parking",
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
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
WORK = "bench.work"
PARKING = "bench.work.parking"
TARGET = "bench.target"
TOPOLOGY_TOML = f"""\
# written by bench/parking_bench.py into a temporary directory
[queues."{WORK}"]
retry_delays = ["1s"]
max_attempts = 3
parking = "{PARKING}"
"""
BODY_BYTES = 1024
WINDOW = 1000  # unconfirmed publishes in flight: fill, aio-pika-publish (= rmqkit PUBLISH_WINDOW)
FILL_WINDOW = 5000  # the fill is not measured: as fast as the broker takes it
FILL_TEMPLATES = 512  # distinct header sets (reason, error, failure times) among the parked
MAX_PREFETCH = 60_000  # rmqkit.parking.browse.MAX_WINDOW
BASE_URL = os.environ.get("RMQKIT_BENCH_URL", "amqp://guest:guest@127.0.0.1:5672/")
MGMT_URL = os.environ.get("RMQKIT_BENCH_MANAGEMENT_URL", "http://127.0.0.1:15672")
MGMT_AUTH = ("guest", "guest")
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


def parked_headers(i: int, now: datetime) -> dict[str, Any]:
    """Headers of a message rmqkit's consumer parked (spread over the last two days)."""
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
    return headers


def replay_copy_headers(headers: dict[str, Any], now: datetime) -> dict[str, Any]:
    """What rmqkit.parking.ops.replay_headers makes of them (the broker's x- headers dropped)."""
    out = {k: v for k, v in headers.items() if not k.startswith("x-")}
    out["rmqkit-attempt"] = 0
    previous = out.get("rmqkit-replay-count")
    out["rmqkit-replay-count"] = (previous if isinstance(previous, int) else 0) + 1
    out["rmqkit-replayed-at"] = _iso(now)
    return out


# --- worker side (one contender, in its own process) ----------------------------------------------


def _rss_kb() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _timing(started: float, cpu_started: float, first: float | None) -> dict[str, Any]:
    return {
        "seconds": time.perf_counter() - started,
        "cpu_seconds": time.process_time() - cpu_started,
        # from the start of the timed window to the first message: connect, checks, set-up
        "setup_seconds": (first - started) if first is not None else None,
        "rss_kb_end": _rss_kb(),
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
    from rmqkit.parking.ops import replay_parked
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
    return {**result, "done": report.replayed, "report": report.as_dict()}


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
                    _BODIES[i % len(_BODIES)],
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


_BODIES = [_body(i) for i in range(64)]


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
    url = with_vhost(BASE_URL, args.vhost)
    coro = WORKERS[args.worker](url, args.messages)
    if args.cprofile:
        import cProfile

        with cProfile.Profile() as profile:
            result = asyncio.run(coro)
        profile.dump_stats(args.cprofile)
    else:
        result = asyncio.run(coro)
    result.update(contender=args.worker, messages=args.messages)
    print(json.dumps(result), flush=True)
    return 0


# --- orchestrator side ----------------------------------------------------------------------------


def with_vhost(url: str, vhost: str) -> str:
    """``url`` pointed at ``vhost`` (as rmqkit.settings.with_vhost, without importing rmqkit)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + quote(vhost, safe=""), "", ""))


def _api(method: str, path: str, **kwargs: Any) -> Any:
    import httpx

    response = httpx.request(method, MGMT_URL + "/api" + path, auth=MGMT_AUTH, timeout=30, **kwargs)
    response.raise_for_status()
    return response.json() if response.content else None


async def _fill(url: str, n: int) -> float:
    """Park ``n`` messages (persistent, pipelined confirmed publishes); returns msg/s.

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
            headers=parked_headers(i, now),
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
                        _BODIES[i % len(_BODIES)],
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


async def _wait_counts(
    url: str,
    expected: dict[str, int],
    timeout_s: float = 90.0,
    stable_s: float | None = None,
    watch_s: float = 0.0,
) -> dict[str, int]:
    """Poll the depths until they are ``expected`` (then ``watch_s`` longer, for late changes),
    or ``timeout_s`` passed, or (if given) they have not changed for ``stable_s``; returns the
    last ones. Acks and returns reach a quorum queue asynchronously, returns sometimes many
    seconds later and all at once."""
    import aiormq

    conn = await aiormq.connect(url)
    try:
        channel = await conn.channel()
        now = time.monotonic()
        until, last, changed, reached = now + timeout_s, None, now, False
        while True:
            counts = {}
            for name in expected:
                ok = await channel.queue_declare(name, passive=True)
                counts[name] = int(ok.message_count or 0)
            now = time.monotonic()
            if counts != last:
                last, changed = counts, now
            if counts == expected and not reached:
                reached, until = True, min(until, now + watch_s)
            if (counts == expected and now >= until) or now > until:
                return counts
            if stable_s is not None and not reached and now - changed > stable_s:
                return counts
            await asyncio.sleep(0.1)
    finally:
        await conn.close()


def _worker_cmd(contender: str, vhost: str, n: int) -> list[str]:
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        contender,
        "--vhost",
        vhost,
        "--messages",
        str(n),
    ]


def _profiled(cmd: list[str], profile: str | None, log_dir: Path, tag: str) -> list[str]:
    if profile == "py-spy":
        spy = Path(sys.executable).with_name("py-spy")
        out = str(log_dir / f"{tag}.collapsed.txt")
        return [str(spy), "record", "--rate", "250", "--format", "raw", "-o", out, "--", *cmd]
    return cmd


def _run_worker(
    contender: str, vhost: str, n: int, log_dir: Path, tag: str, profile: str | None
) -> dict[str, Any]:
    cmd = _worker_cmd(contender, vhost, n)
    if profile == "cprofile":
        cmd += ["--cprofile", str(log_dir / f"{tag}.prof")]
    cmd = _profiled(cmd, profile, log_dir, tag)
    log_path = log_dir / f"{tag}.log"
    with log_path.open("w") as log:
        proc = subprocess.run(
            cmd,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            timeout=WORKER_TIMEOUT_S + 60,
            check=False,
        )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = log_path.read_text()[-2000:]
        raise RuntimeError(f"{contender} worker failed (exit {proc.returncode}):\n{tail}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _cli_env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RMQKIT_")}
    env["RMQKIT_URL"] = url
    return env


def _rmqkit_exe() -> str:
    exe = Path(sys.executable).with_name("rmqkit")
    return str(exe) if exe.exists() else "rmqkit"


def _run_cli_list(url: str, n: int, log_dir: Path, tag: str, profile: str | None) -> dict[str, Any]:
    """`rmqkit parking list QUEUE --json` end to end; stdout to a file, its lines counted."""
    out_path = log_dir / f"{tag}.ndjson"
    cmd = _profiled([_rmqkit_exe(), "parking", "list", PARKING, "--json"], profile, log_dir, tag)
    with out_path.open("w") as out, (log_dir / f"{tag}.log").open("w") as log:
        cpu_before = _children_cpu()
        started = time.perf_counter()
        proc = subprocess.run(
            cmd, cwd=ROOT, env=_cli_env(url), stdout=out, stderr=log, timeout=WORKER_TIMEOUT_S
        )
        seconds = time.perf_counter() - started
        cpu_seconds = _children_cpu() - cpu_before
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


def _children_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _startup_seconds(url: str, times: int = 3) -> float:
    """Median wall time of `rmqkit --version`: interpreter start-up and the CLI's imports."""
    runs = []
    for _ in range(times):
        started = time.perf_counter()
        subprocess.run(
            [_rmqkit_exe(), "--version"], env=_cli_env(url), check=True, stdout=subprocess.DEVNULL
        )
        runs.append(time.perf_counter() - started)
    return statistics.median(runs)


def _delete_vhost(vhost: str) -> None:
    for _ in range(10):
        try:
            _api("DELETE", f"/vhosts/{quote(vhost, safe='')}")
            return
        except Exception:
            time.sleep(1)
    print(f"could not delete vhost {vhost!r}: delete it by hand", file=sys.stderr)


def profile_top(path: Path, limit: int = 18) -> str:
    """The hottest functions of a py-spy collapsed-stack file, by self and inclusive share."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        raw = stack.split(";")
        if any("_find_and_load" in f for f in raw):
            continue  # importing: start-up costs
        frames = [_short_frame(f) for f in raw]
        total += count
        own[frames[-1]] = own.get(frames[-1], 0) + count
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + count
    if not total:
        return f"{path}: no samples"
    lines = [f"{path.name}: {total} samples (imports excluded)", "  self%  function"]
    for frame, count in sorted(own.items(), key=lambda kv: -kv[1])[:limit]:
        lines.append(f"  {100 * count / total:5.1f}  {frame}")
    lines.append("  incl%  function (rmqkit frames)")
    ours = [(f, c) for f, c in inclusive.items() if "rmqkit/" in f.split(" (", 1)[-1]]
    for frame, count in sorted(ours, key=lambda kv: -kv[1])[:limit]:
        lines.append(f"  {100 * count / total:5.1f}  {frame}")
    return "\n".join(lines)


def _short_frame(frame: str) -> str:
    name, _, where = frame.partition(" (")
    where = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("site-packages/", "/main/"):
        if marker in where:
            where = where.split(marker, 1)[1]
    return f"{name} ({where})"


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("rmqkit", "aio-pika", "aiormq", "pamqp"):
        with contextlib.suppress(PackageNotFoundError):
            found[name] = version(name)
    return found


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


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


def _wait_for_broker(timeout_s: float = 180.0) -> None:
    """Until the management API and AMQP answer again (a restart by someone else)."""
    import socket

    until = time.monotonic() + timeout_s
    while time.monotonic() < until:
        time.sleep(2)
        try:
            _api("GET", "/overview")
            host = urlsplit(BASE_URL).hostname or "127.0.0.1"
            with socket.create_connection((host, urlsplit(BASE_URL).port or 5672), timeout=2):
                pass
            time.sleep(3)  # let the queues elect their leaders
            return
        except Exception:
            continue
    raise RuntimeError("the broker did not come back")


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
        asyncio.run(_wait_counts(url, {PARKING: n, TARGET: 0}))
    tag = f"r{rnd + 1}-{contender}" + (f"-retry{attempt}" if attempt else "")
    profile = args.profile if contender in args.profile_only else None
    if contender == "rmqkit-cli":
        result = _run_cli_list(url, n, log_dir, tag, profile)
    else:
        result = _run_worker(contender, vhost, n, log_dir, tag, profile)
    result["round"] = rnd + 1
    result["attempt"] = attempt
    # Wait for the expected depths. A replay: the target has all, nothing is left parked (a
    # parked original whose ack the broker dropped comes back as ready, possibly late: wait
    # for the depths to stay put for 15 s). A list: everything is back as ready.
    if contender in (*REPLAY_GROUP, RAW_REPLAY):
        expected = {PARKING: 0, TARGET: n}
        left = asyncio.run(_wait_counts(url, expected, stable_s=15.0, watch_s=3.0))
    else:
        expected = {PARKING: n, TARGET: 0}
        left = asyncio.run(_wait_counts(url, expected, 90.0 if result["done"] == n else 5.0))
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
    for group in (replay_group, LIST_GROUP):
        chosen = [c for c in group if not args.only or c in args.only]
        if chosen:
            groups.append(chosen)
    vhost = f"rmqkit-bench-parking-{uuid.uuid4().hex[:6]}"
    url = with_vhost(BASE_URL, vhost)
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="rmqkit-parking-bench-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    samples: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    fills: list[float] = []
    started = time.monotonic()
    load_before = os.getloadavg()
    startup: float | None = None
    vpath = quote(vhost, safe="")
    _api("PUT", f"/vhosts/{vpath}", json={})
    try:
        perms = {"configure": ".*", "write": ".*", "read": ".*"}
        _api("PUT", f"/permissions/{vpath}/guest", json=perms)
        topology = log_dir / "parking-bench-topology.toml"
        topology.write_text(TOPOLOGY_TOML)
        subprocess.run(
            [_rmqkit_exe(), "declare", str(topology)],
            cwd=ROOT,
            env=_cli_env(url),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        target_def = {"durable": True, "arguments": {"x-queue-type": "quorum"}}
        _api("PUT", f"/queues/{vpath}/{TARGET}", json=target_def)
        if any("rmqkit-cli" in g for g in groups):
            startup = _startup_seconds(url)
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
                            _wait_for_broker()
                            continue
                        if result["ok"]:
                            samples.append(result)
                            break
                        failures.append(result)
    finally:
        _delete_vhost(vhost)
    summary = _summarize(samples)
    overview = _api("GET", "/overview")
    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(
            [Path(sys.executable).name, "-m", "bench.parking_bench", *sys.argv[1:]]
        ),
        "params": {
            "rounds": args.rounds,
            "messages": args.messages,
            "naive_messages": args.naive_messages,
            "body_bytes": BODY_BYTES,
            "window": WINDOW,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "cpu_model": _cpu_model(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        },
        "broker": {
            "rabbitmq": overview.get("rabbitmq_version"),
            "erlang": overview.get("erlang_version"),
        },
        "versions": _versions(),
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
    for collapsed in sorted(log_dir.glob("*.collapsed.txt")):
        print()
        print(profile_top(collapsed))
    if args.json == "-":
        print(json.dumps(report, indent=2))
    elif args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        print(f"JSON written to {args.json}")
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
        return worker_main(args)
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())

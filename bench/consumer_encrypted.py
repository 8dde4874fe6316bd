"""Consumer throughput with two encrypted fields vs none, same run (issue 16 benchmark).

Run from the repository root (the broker from docker-compose or scripts/broker-up)::

    .venv/bin/python -m bench.consumer_encrypted --rounds 5 --messages 20000 --json out.json

What it does:

1. creates a throwaway vhost, writes a topology with two work queues that differ only in
   ``encrypt = true`` + ``sensitive_fields = ["customer.name", "tax_id"]`` + ``blind_index =
   ["tax_id"]`` (``enc.sealed``; ``enc.plain`` has none of it), declares it with ``rmqkit
   declare`` and makes a key ring with ``rmqkit keys generate --out``;
2. per round, plain and sealed one after the other (the order alternates every round, so a busy
   moment of the shared machine falls on both): fills the queue with N ~320-byte JSON orders
   (persistent, confirmed, pipelined). The sealed queue's bodies go through
   ``rmqkit.outbox.Encryptor(keyring, topology).encrypt`` — what ``rmqkit publish --topology``
   calls — and that encryption is timed (µs per message);
3. starts a real ``rmqkit consume bench.consumer_encrypted:handle --queue Q --topology T
   --prefetch 200`` (one worker process; ``RMQKIT_KEYRING_FILE`` set for both queues, so the only
   difference is the envelopes in the bodies). The handler counts calls and checks that no
   envelope reached it; at the N-th call it writes the worker's wall and CPU time since its first
   call to a file. Then SIGTERM, and the queue, its wait queues and parking must be empty;
4. msg/s = N / that window; medians over the rounds; ratio sealed / plain (target >= 0.8);
   per-field encrypt / decrypt µs from ``bench.crypto_fields.measure`` run in this process, and
   ``decrypt_fields`` alone per sealed body.

The machine's load (``uptime``) is recorded before and after every run and printed.

Options: ``--parse`` (the handler also calls ``message.json()``, as a real handler reads its
body); ``--what-if-orjson`` (not rmqkit as shipped: the worker's ``decrypt_fields`` is replaced
by ``orjson_decrypt_fields`` below, to measure the fix docs/encryption.md proposes; needs orjson
importable, e.g. ``pip install --target DIR orjson`` and ``PYTHONPATH=DIR``). Results and the
analysis: docs/encryption.md, "Consumer throughput with encrypted fields".
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python bench/consumer_encrypted.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common

PLAIN, SEALED = "enc.plain", "enc.sealed"
MODES = {"plain": PLAIN, "sealed": SEALED}
PREFETCH = 200
FIELDS = ["customer.name", "tax_id"]
INDEXED = ["tax_id"]
TOPOLOGY = f"""
# bench/consumer_encrypted.py: two work queues, identical but for the encryption.
[queues."{PLAIN}"]
retry_delays = ["1s"]
max_attempts = 3
prefetch = {PREFETCH}

[queues."{SEALED}"]
retry_delays = ["1s"]
max_attempts = 3
prefetch = {PREFETCH}
encrypt = true
sensitive_fields = {json.dumps(FIELDS)}
blind_index = {json.dumps(INDEXED)}
"""
RUN_TIMEOUT_S = 180.0


# --- the handler (runs in the rmqkit consume worker process) -----------------------------------
_PARSE = os.environ.get("BENCH_ENC_PARSE") == "1"


def orjson_decrypt_fields(body: Any, paths: Any, keyring: Any, *, strict: bool = True) -> Any:
    """What-if (``--what-if-orjson``; not rmqkit code): ``decrypt_fields`` with the body parsed
    and re-serialized by orjson instead of the json module; the envelopes opened by rmqkit's
    own ``open_envelope``. Anything orjson refuses (integers beyond 64 bits, NaN) falls back to
    ``decrypt_fields`` itself."""
    import orjson  # type: ignore[import-not-found,unused-ignore]

    from rmqkit.crypto import decrypt_fields
    from rmqkit.crypto.envelope import open_envelope
    from rmqkit.crypto.fields import _envelopes

    data = bytes(body)
    if paths is not None or not strict or b"rmqkit_enc" not in data:
        return decrypt_fields(body, paths, keyring, strict=strict)
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return decrypt_fields(body, paths, keyring)
    new = _envelopes(parsed, [], lambda path, value: open_envelope(keyring, path, value))
    if new is parsed:
        return body
    try:
        return orjson.dumps(new)
    except orjson.JSONEncodeError:
        return decrypt_fields(body, paths, keyring)


if os.environ.get("BENCH_ENC_WHAT_IF_ORJSON") == "1":  # in the consume worker, before any message
    import rmqkit.consumer.dispatch

    setattr(rmqkit.consumer.dispatch, "decrypt_fields", orjson_decrypt_fields)  # noqa: B010


class _State:
    first_wall = 0.0
    first_cpu = 0.0
    calls = 0
    envelopes_seen = 0


async def handle(message) -> None:  # type: ignore[no-untyped-def]
    """Count the call; at the N-th, write the window's wall and CPU seconds to BENCH_ENC_OUT.

    Unannotated: rmqkit passes its Message (the decrypted body as bytes), no model validation.
    """
    state = _State
    if not state.calls:
        state.first_wall = time.perf_counter()
        state.first_cpu = time.process_time()
    state.calls += 1
    if b"rmqkit_enc" in message.body:  # decryption must have happened before the handler
        state.envelopes_seen += 1
    if _PARSE:  # --parse: read the body as a real handler does
        message.json()
    if state.calls == int(os.environ["BENCH_ENC_N"]):
        result = {
            "seconds": time.perf_counter() - state.first_wall,
            "cpu_seconds": time.process_time() - state.first_cpu,
            "handler_calls": state.calls,
            "envelopes_seen": state.envelopes_seen,
            "worker_pid": os.getpid(),
            "decrypt_function": _decrypt_in_use(),
        }
        # once, at the end of the window (os.write: no pathlib in a coroutine)
        # (written aside, then renamed: the orchestrator never reads half a file)
        dest = os.environ["BENCH_ENC_OUT"]
        fd = os.open(dest + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, json.dumps(result).encode())
        finally:
            os.close(fd)
        os.replace(dest + ".tmp", dest)


def _decrypt_in_use() -> str:
    """The name of the function the consumer decrypts with (the what-if check)."""
    import rmqkit.consumer.dispatch

    return str(getattr(rmqkit.consumer.dispatch, "decrypt_fields").__name__)  # noqa: B009


# --- orchestrator ---------------------------------------------------------------------------------
def order_body(i: int, run: str) -> bytes:
    """A ~320-byte order; personal data in customer.name and tax_id."""
    return json.dumps(
        {
            "order_id": f"ord-{run}-{i:06d}",
            "status": "paid",
            "customer": {"name": f"Ada Lovelace {i}", "email": "ada@example.org", "country": "TR"},
            "tax_id": f"{12345678901 + i}",
            "lines": [
                {"sku": "A-1", "qty": 2, "price": 19.9},
                {"sku": "B-7", "qty": 1, "price": 5.0},
            ],
            "total": 44.8,
            "currency": "EUR",
            "created_at": "2026-12-01T20:00:00Z",
        }
    ).encode()


def bodies(mode: str, n: int, topology: Path, keyring_file: Path) -> tuple[list[bytes], float]:
    """N bodies for ``mode``, through the Encryptor `rmqkit publish --topology` uses; the µs per
    message that took (for plain: the Encryptor finding nothing to encrypt)."""
    from rmqkit.crypto import load_keyring
    from rmqkit.publishing.routing import Encryptor
    from rmqkit.topology import load_topology

    encryptor = Encryptor(
        keyring=load_keyring(keyring_file, None), topology=load_topology(topology)
    )
    run = uuid.uuid4().hex[:6]
    raw = [order_body(i, run) for i in range(n)]
    started = time.perf_counter()
    out = [encryptor.encrypt("", MODES[mode], body) for body in raw]
    per_msg_us = (time.perf_counter() - started) / n * 1e6
    if mode == "sealed" and (b"rmqkit_enc" not in out[0] or b"Ada Lovelace" in out[0]):
        raise RuntimeError("the sealed bodies are not encrypted: check the topology")
    if mode == "plain" and out[0] != raw[0]:
        raise RuntimeError("the plain bodies were changed")
    return out, per_msg_us


async def fill(url: str, queue: str, payloads: list[bytes]) -> None:
    """Publish ``payloads`` to ``queue``: persistent, confirmed, pipelined 1,000 at a time."""
    import aiormq
    from pamqp import commands as spec

    run = uuid.uuid4().hex[:8]
    conn = await aiormq.connect(url)
    try:
        channel = await conn.channel(publisher_confirms=True)
        for first in range(0, len(payloads), 1000):
            confirms = await asyncio.gather(
                *(
                    channel.basic_publish(
                        payloads[i],
                        routing_key=queue,
                        properties=spec.Basic.Properties(
                            delivery_mode=2,
                            message_id=f"{run}-{i}",
                            content_type="application/json",
                        ),
                    )
                    for i in range(first, min(len(payloads), first + 1000))
                )
            )
            if not all(isinstance(c, spec.Basic.Ack) for c in confirms):
                raise RuntimeError("a fill publish was not confirmed")
    finally:
        await conn.close()


def queue_names(topology: Path, queue: str) -> list[str]:
    from rmqkit.topology import load_topology
    from rmqkit.topology.expand import wait_queue_names

    spec = load_topology(topology)
    waits = [name for tier in wait_queue_names(spec, queue) for name, _ in tier]
    return [queue, *waits, spec.parking_name(queue)]


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def consume(
    mode: str,
    url: str,
    topology: Path,
    keyring_file: Path,
    n: int,
    log_path: Path,
    parse: bool,
    what_if_orjson: bool = False,
) -> dict[str, Any]:
    """One `rmqkit consume` draining the pre-filled queue of ``mode``; the handler's result."""
    queue = MODES[mode]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        env = common.cli_env(url)
        env.update(
            BENCH_ENC_OUT=str(out),
            BENCH_ENC_N=str(n),
            RMQKIT_KEYRING_FILE=str(keyring_file),
            BENCH_ENC_PARSE="1" if parse else "0",
            BENCH_ENC_WHAT_IF_ORJSON="1" if what_if_orjson else "0",
            RMQKIT_MANAGEMENT_URL=common.MGMT_URL,
        )
        cmd = [
            common.rmqkit_exe(), "consume", "bench.consumer_encrypted:handle",
            "--queue", queue, "--topology", str(topology), "--prefetch", str(PREFETCH),
        ]  # fmt: skip
        with log_path.open("w") as log, common.CpuWatch() as watch:
            proc = subprocess.Popen(cmd, cwd=common.ROOT, env=env, stdout=log, stderr=log)
            try:
                deadline = time.monotonic() + RUN_TIMEOUT_S
                while not out.exists():
                    if proc.poll() is not None:
                        raise RuntimeError(
                            f"rmqkit consume exited {proc.returncode}: "
                            + log_path.read_text()[-1500:]
                        )
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{mode}: not done after {RUN_TIMEOUT_S:.0f}s")
                    time.sleep(0.05)
                time.sleep(0.2)  # let the last batched ack go out before SIGTERM
                result: dict[str, Any] = json.loads(out.read_text())
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
        result["exit_code"] = proc.returncode
        result["foreign_cpu_share"] = round(watch.foreign_share, 3)
        result["broker_cpu_s"] = round(watch.broker_cpu_s, 2)
        return result


def invalid(sample: dict[str, Any]) -> str | None:
    if sample.get("envelopes_seen"):
        return f"{sample['envelopes_seen']} bodies reached the handler still encrypted"
    if any(sample.get("left_in_queues", {}).values()):
        return f"left in queues: {sample['left_in_queues']}"
    if sample.get("exit_code") not in (0, None):
        return f"rmqkit consume exited {sample['exit_code']}"
    return None


def summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for mode in MODES:
        runs = [s for s in samples if s["mode"] == mode and not invalid(s)]
        if not runs:
            continue
        rates = [s["messages"] / s["seconds"] for s in runs]
        cpu = [s["cpu_seconds"] / s["messages"] * 1e6 for s in runs]
        summary[mode] = {
            "runs": len(runs),
            "msg_per_s_median": round(statistics.median(rates)),
            "msg_per_s_all": [round(r) for r in rates],
            "cpu_us_per_msg_median": round(statistics.median(cpu), 1),
            "cpu_us_per_msg_all": [round(c, 1) for c in cpu],
            "encrypt_us_per_msg_median": round(
                statistics.median(s["encrypt_us_per_msg"] for s in runs), 2
            ),
            "foreign_cpu_share_max": max(s["foreign_cpu_share"] for s in runs),
        }
    if "plain" in summary and "sealed" in summary:
        plain, sealed = summary["plain"], summary["sealed"]
        summary["ratio_sealed_vs_plain"] = round(
            sealed["msg_per_s_median"] / plain["msg_per_s_median"], 3
        )
        # per round (same round = the same few seconds of the shared machine)
        by_round: dict[int, dict[str, float]] = {}
        cpu_by_round: dict[int, dict[str, float]] = {}
        for s in samples:
            if not invalid(s):
                by_round.setdefault(s["round"], {})[s["mode"]] = s["messages"] / s["seconds"]
                cpu_by_round.setdefault(s["round"], {})[s["mode"]] = (
                    s["cpu_seconds"] / s["messages"] * 1e6
                )
        summary["ratio_per_round"] = [
            round(r["sealed"] / r["plain"], 3)
            for _, r in sorted(by_round.items())
            if "sealed" in r and "plain" in r
        ]
        # Paired: each round's two runs share the machine's state of that minute, so the
        # median of the rounds' own ratios (and CPU differences) is what a drifting, shared
        # machine disturbs least; reported beside the ratio of the medians.
        if summary["ratio_per_round"]:
            summary["ratio_per_round_median"] = round(
                statistics.median(summary["ratio_per_round"]), 3
            )
            summary["extra_cpu_us_per_round_median"] = round(
                statistics.median(
                    r["sealed"] - r["plain"]
                    for r in cpu_by_round.values()
                    if "sealed" in r and "plain" in r
                ),
                1,
            )
        summary["extra_cpu_us_per_msg"] = round(
            sealed["cpu_us_per_msg_median"] - plain["cpu_us_per_msg_median"], 1
        )
        summary["target_met"] = summary["ratio_sealed_vs_plain"] >= 0.8
    return summary


def crypto_costs(n: int, rounds: int, topology: Path, keyring_file: Path) -> dict[str, Any]:
    """Per-field encrypt/decrypt µs (bench.crypto_fields) and decrypt_fields alone on the
    sealed bodies this benchmark publishes."""
    from bench.crypto_fields import measure, per_op_us
    from rmqkit.crypto import decrypt_fields, load_keyring

    results: dict[str, Any] = {"crypto_fields": measure(n, rounds)}
    ring = load_keyring(keyring_file, None)
    sealed, _ = bodies("sealed", 1000, topology, keyring_file)
    it = itertools.cycle(sealed)
    results["decrypt_fields, one sealed bench body"] = per_op_us(
        lambda: decrypt_fields(next(it), None, ring), n, rounds
    )
    plain, _ = bodies("plain", 1000, topology, keyring_file)
    it2 = itertools.cycle(plain)
    results["decrypt_fields, one plain bench body (fast path)"] = per_op_us(
        lambda: decrypt_fields(next(it2), None, ring), n, rounds
    )
    try:
        import orjson  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
    except ImportError:
        pass
    else:  # the what-if, in this process
        it3 = itertools.cycle(sealed)
        results["what-if: orjson_decrypt_fields, one sealed bench body"] = per_op_us(
            lambda: orjson_decrypt_fields(next(it3), None, ring), n, rounds
        )
    cf = results["crypto_fields"]
    results["per_field_us"] = {
        "encrypt": cf["field small"]["encrypt"]["median_us"],
        "encrypt_blind_indexed": cf["field small + index"]["encrypt"]["median_us"],
        "decrypt": cf["field small"]["decrypt"]["median_us"],
        "body_2_fields_encrypt_per_field": round(
            cf["body 2 fields"]["encrypt"]["median_us"] / 2, 2
        ),
        "body_2_fields_decrypt_per_field": round(
            cf["body 2 fields"]["decrypt"]["median_us"] / 2, 2
        ),
    }
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--crypto-n", type=int, default=5000, help="ops per crypto round")
    parser.add_argument("--json", help="write the full report here ('-': stdout)")
    parser.add_argument(
        "--parse",
        action="store_true",
        help="the handler parses the body (message.json()), as a real one reads it",
    )
    parser.add_argument(
        "--what-if-orjson",
        action="store_true",
        help="what-if, not rmqkit as shipped: the consumer decrypts with orjson_decrypt_fields "
        "(needs orjson importable, e.g. PYTHONPATH)",
    )
    parser.add_argument("--log-dir", help="rmqkit consume logs here (default: a temp dir)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="rmqkit-bench-enc-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    print(f"load: {uptime()}", flush=True)
    started = time.monotonic()
    samples: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    vhost, url = common.create_vhost("rmqkit-bench-enc")
    with tempfile.TemporaryDirectory() as tmp:
        topology = Path(tmp) / "topology.toml"
        topology.write_text(TOPOLOGY)
        keyring_file = Path(tmp) / "keyring.json"
        subprocess.run(
            [common.rmqkit_exe(), "keys", "generate", "--out", str(keyring_file)],
            check=True, stdout=subprocess.DEVNULL, env=common.cli_env(url),
        )  # fmt: skip
        try:
            common.declare(topology, url)
            for rnd in range(1, args.rounds + 1):
                order = ["plain", "sealed"] if rnd % 2 else ["sealed", "plain"]
                for mode in order:
                    names = queue_names(topology, MODES[mode])
                    try:
                        payloads, enc_us = bodies(mode, args.messages, topology, keyring_file)
                        asyncio.run(fill(url, MODES[mode], payloads))
                        del payloads
                        load = uptime()
                        result = consume(
                            mode, url, topology, keyring_file, args.messages,
                            log_dir / f"r{rnd}-{mode}.log", args.parse, args.what_if_orjson,
                        )  # fmt: skip
                        left = asyncio.run(common.depths(url, names))
                    except Exception as exc:
                        line = f"{type(exc).__name__}: {exc}".splitlines()[0]
                        print(f"round {rnd} {mode:<6} FAILED ({line})", flush=True)
                        failures.append({"round": rnd, "mode": mode, "error": line})
                        common.wait_for_broker(url)
                        continue
                    result.update(
                        round=rnd,
                        mode=mode,
                        messages=args.messages,
                        encrypt_us_per_msg=round(enc_us, 2),
                        left_in_queues={k: v for k, v in left.items() if v},
                        uptime_before=load,
                    )
                    result["invalid"] = invalid(result)
                    samples.append(result)
                    rate = args.messages / result["seconds"]
                    print(
                        f"round {rnd} {mode:<6} {rate:>8,.0f} msg/s  cpu "
                        f"{result['cpu_seconds'] / args.messages * 1e6:6.1f} µs/msg  "
                        f"others {result['foreign_cpu_share']:.0%}  "
                        f"[{load.split('load average: ')[-1]}]"
                        + (f"  INVALID ({result['invalid']})" if result["invalid"] else ""),
                        flush=True,
                    )
        finally:
            common.delete_vhost(vhost)
        costs = crypto_costs(args.crypto_n, 5, topology, keyring_file)
    summary = summarize(samples)
    report = {
        "benchmark": "consumer_encrypted",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": common.command_line("bench.consumer_encrypted"),
        "params": {
            "rounds": args.rounds,
            "messages": args.messages,
            "prefetch": PREFETCH,
            "handler_parses_body": args.parse,
            "what_if_orjson": args.what_if_orjson,
            "body_bytes_plain": len(order_body(0, "abcdef")),
            "fields": FIELDS,
            "blind_index": INDEXED,
            "topology": TOPOLOGY,
        },
        "machine": common.machine_facts(load_before),
        "uptime_after": uptime(),
        "broker": common.broker_facts(),
        "versions": common.versions(("rmqkit", "aiormq", "pamqp", "cryptography")),
        "code": common.code_state(("rmqkit",)),
        "total_seconds": round(time.monotonic() - started),
        "summary": summary,
        "crypto": costs,
        "samples": samples,
        "failed_runs": failures,
        "logs": str(log_dir),
    }
    print()
    for mode in MODES:
        s = summary.get(mode)
        if s:
            print(
                f"{mode:<7} runs {s['runs']}  median {s['msg_per_s_median']:>7,} msg/s  "
                f"cpu {s['cpu_us_per_msg_median']:6.1f} µs/msg  "
                f"all {', '.join(f'{r:,}' for r in s['msg_per_s_all'])}"
            )
    if "ratio_sealed_vs_plain" in summary:
        print(
            f"ratio sealed/plain {summary['ratio_sealed_vs_plain']:.2f} (target >= 0.80: "
            f"{'met' if summary['target_met'] else 'NOT met'}); per round "
            f"{summary['ratio_per_round']}; extra CPU {summary['extra_cpu_us_per_msg']} µs/msg"
        )
        if "ratio_per_round_median" in summary:
            print(
                f"paired (median over rounds): ratio {summary['ratio_per_round_median']:.2f}, "
                f"extra CPU {summary['extra_cpu_us_per_round_median']} µs/msg"
            )
    pf = costs["per_field_us"]
    print(
        f"per field: encrypt {pf['encrypt']} µs ({pf['encrypt_blind_indexed']} blind-indexed), "
        f"decrypt {pf['decrypt']} µs; whole 2-field body per field: encrypt "
        f"{pf['body_2_fields_encrypt_per_field']} / decrypt {pf['body_2_fields_decrypt_per_field']}"
        f" µs; decrypt_fields per sealed bench body "
        f"{costs['decrypt_fields, one sealed bench body']['median_us']} µs"
    )
    print(f"load after: {report['uptime_after']}")
    common.write_report(report, args.json)
    return 0 if summary.get("sealed") and summary.get("plain") else 1


if __name__ == "__main__":
    sys.exit(main())

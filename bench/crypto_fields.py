"""Field-level encryption cost (issue 16): encrypt and decrypt per field, in µs.

    .venv/bin/python -m bench.crypto_fields [--rounds 9] [--n 20000] [--json out.json]

No broker: this measures rmqkit.crypto alone, in this process. Each case is timed over ``--n``
operations per round; the report gives the median of ``--rounds`` rounds (and the spread), so a
busy moment on the shared machine shows as spread instead of moving the median.

Cases:
- ``field small``: one field, a 12-character string ("Ada Lovelace"): seal (AES-256-GCM, the
  envelope) and open (check, decrypt, parse) of the value alone;
- ``field small + index``: the same with a blind index (one HMAC-SHA256 more on encrypt);
- ``field 1 KB``: one field holding a 1,024-character string;
- ``body 2 fields``: a ~300-byte order body as bytes, ``encrypt_fields`` of two fields (one
  blind-indexed) and ``decrypt_fields(paths=None)`` — what publish and consume pay per message,
  JSON parse and dump included; next to it ``json round trip``, the parse + dump the body costs
  without encryption, and ``decrypt, no envelope``, the fast path of a body with nothing in it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.common import code_state, command_line, machine_facts, versions, write_report
from rmqkit.crypto import decrypt_fields, encrypt_fields, generate_keyring
from rmqkit.crypto.envelope import open_envelope, seal

ORDER = {
    "order_id": "ord-000123",
    "status": "paid",
    "customer": {"name": "Ada Lovelace", "email": "ada@example.org", "country": "TR"},
    "tax_id": "12345678901",
    "lines": [{"sku": "A-1", "qty": 2, "price": 19.9}, {"sku": "B-7", "qty": 1, "price": 5.0}],
    "total": 44.8,
    "currency": "EUR",
    "created_at": "2026-12-01T20:00:00Z",
}
PATHS = ["customer.name", "tax_id"]
INDEXED = ["tax_id"]


def per_op_us(fn: Callable[[], Any], n: int, rounds: int) -> dict[str, float]:
    """Median (and min/max) over ``rounds`` of the µs per call of ``fn``, ``n`` calls a round."""
    fn()  # warm caches (the AESGCM object, parsed paths)
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - started) / n * 1e6)
    return {
        "median_us": round(statistics.median(samples), 2),
        "min_us": round(min(samples), 2),
        "max_us": round(max(samples), 2),
    }


def measure(n: int, rounds: int) -> dict[str, dict[str, dict[str, float]]]:
    ring = generate_keyring()
    results: dict[str, dict[str, dict[str, float]]] = {}
    for label, value, index in (
        ("field small", "Ada Lovelace", False),
        ("field small + index", "Ada Lovelace", True),
        ("field 1 KB", "x" * 1024, False),
    ):
        envelope = seal(ring, "customer.name", value, index=index)

        def enc(value: Any = value, index: bool = index) -> Any:
            return seal(ring, "customer.name", value, index=index)

        def dec(envelope: dict[str, Any] = envelope) -> Any:
            return open_envelope(ring, "customer.name", envelope)

        results[label] = {
            "encrypt": per_op_us(enc, n, rounds),
            "decrypt": per_op_us(dec, n, rounds),
        }
    body = json.dumps(ORDER).encode()
    sealed = encrypt_fields(body, PATHS, INDEXED, ring)
    results["body 2 fields"] = {
        "encrypt": per_op_us(lambda: encrypt_fields(body, PATHS, INDEXED, ring), n, rounds),
        "decrypt": per_op_us(lambda: decrypt_fields(sealed, None, ring), n, rounds),
    }
    results["json round trip"] = {
        "parse+dump": per_op_us(lambda: json.dumps(json.loads(body)).encode(), n, rounds),
    }
    results["decrypt, no envelope"] = {
        "decrypt": per_op_us(lambda: decrypt_fields(body, None, ring), n, rounds),
    }
    return results


def table(results: dict[str, dict[str, dict[str, float]]]) -> str:
    lines = [f"{'case':<22} {'operation':<11} {'median µs':>10} {'min':>8} {'max':>8}"]
    for case, ops in results.items():
        for op, r in ops.items():
            lines.append(
                f"{case:<22} {op:<11} {r['median_us']:>10.2f} {r['min_us']:>8.2f} "
                f"{r['max_us']:>8.2f}"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--n", type=int, default=20000, help="operations per round")
    parser.add_argument("--json", dest="dest", help="write the report here (- for stdout)")
    args = parser.parse_args()
    load = os.getloadavg()
    results = measure(args.n, args.rounds)
    print(table(results))
    report = {
        "benchmark": "crypto_fields",
        "command": command_line("bench.crypto_fields"),
        "n": args.n,
        "rounds": args.rounds,
        "machine": machine_facts(load),
        "versions": versions(("rmqkit", "cryptography")),
        "code": code_state(("rmqkit/crypto",)),
        "results": results,
    }
    write_report(report, args.dest)


if __name__ == "__main__":
    main()

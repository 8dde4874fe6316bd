"""The errors of a first hour with rmqkit, each with its exact text, against the real broker.

- a queue's name given as the exchange: the error names the default exchange (``''``, the
  queue's name as the routing key) and the exchanges bound to the queue, not just "no
  exchange";
- a routing key that no binding matches: the returned messages' error lists the exchange's
  bindings (management API), or says the key routes nowhere when the API does not answer;
- Ctrl-C during a long `publish`: published and confirmed so far (the confirmed ones are on
  the queue), and how to resume — ``--skip N`` keeps the line numbers, so the resumed run's
  derived ids are a full run's and the queue ends with every line exactly once;
- `status --watch` ends on Ctrl-C with exit 0 and nothing on stderr.

(The malformed URL of the same first hour needs no broker: tests/unit/test_url_errors.py.)
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aio_pika

from rmqkit.publishing.ids import IdSource
from rmqkit.settings import with_vhost
from tests import broker

DEAD_API = "http://127.0.0.1:1"  # nothing listens: "the management API did not answer"


def _payments(fresh_vhost: Callable[[], str]) -> str:
    """A vhost with exchange 'payments' (direct) bound to queue 'payments.work' by 'pay'."""
    vhost = fresh_vhost()
    v = broker.q(vhost)
    broker.api("PUT", f"/queues/{v}/payments.work", json={"durable": True}).raise_for_status()
    broker.api(
        "PUT", f"/exchanges/{v}/payments", json={"type": "direct", "durable": True}
    ).raise_for_status()
    broker.api(
        "POST", f"/bindings/{v}/e/payments/q/payments.work", json={"routing_key": "pay"}
    ).raise_for_status()
    return vhost


def _error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert lines and lines[-1].startswith("rmqkit: error: "), stderr
    return lines[-1].removeprefix("rmqkit: error: ")


# --- a queue's name given as the exchange --------------------------------------------------------
def test_a_queue_name_as_the_exchange_names_the_ways_to_the_queue(
    fresh_vhost: Callable[[], str],
) -> None:
    vhost = _payments(fresh_vhost)
    result = broker.cli("publish", "payments.work", "x", "--body", "a", vhost=vhost)
    assert result.returncode == 65, result.stderr
    assert _error_line(result.stderr) == (
        f"no exchange 'payments.work' in vhost '{vhost}', but a queue of that name exists — "
        "publish to it through the default exchange, the queue's name as the routing key: "
        "rmqkit publish '' payments.work; or through the exchange bound to it: 'payments' "
        "(routing key 'pay')"
    )
    assert len(result.stderr.strip().splitlines()) == 1
    # the advice works: through '' the message reaches the queue, and nothing else was sent
    assert broker.depths(vhost, ["payments.work"]) == {"payments.work": 0}
    advised = broker.cli("publish", "", "payments.work", "--body", "a", vhost=vhost)
    assert advised.returncode == 0, advised.stderr
    assert broker.depths(vhost, ["payments.work"]) == {"payments.work": 1}


def test_without_the_management_api_a_passive_declare_still_finds_the_queue(
    fresh_vhost: Callable[[], str],
) -> None:
    vhost = _payments(fresh_vhost)
    result = broker.cli(
        "publish",
        "payments.work",
        "x",
        "--body",
        "a",
        vhost=vhost,
        env={"RMQKIT_MANAGEMENT_URL": DEAD_API},
    )
    assert result.returncode == 65, result.stderr
    assert _error_line(result.stderr) == (
        f"no exchange 'payments.work' in vhost '{vhost}', but a queue of that name exists — "
        "publish to it through the default exchange, the queue's name as the routing key: "
        "rmqkit publish '' payments.work (the exchanges bound to it are not listed: the "
        "management API did not answer)"
    )


def test_a_name_that_is_neither_says_so(fresh_vhost: Callable[[], str]) -> None:
    vhost = _payments(fresh_vhost)
    result = broker.cli("publish", "paymnets", "x", "--body", "a", vhost=vhost)
    assert result.returncode == 65, result.stderr
    assert _error_line(result.stderr) == (
        f"no exchange 'paymnets' in vhost '{vhost}' (nor a queue of that name) — check the "
        "name, or declare it (`rmqkit declare`)"
    )


# --- a routing key no binding matches ------------------------------------------------------------
def test_a_wrong_routing_key_lists_the_exchange_bindings(fresh_vhost: Callable[[], str]) -> None:
    vhost = _payments(fresh_vhost)
    v = broker.q(vhost)
    broker.api("PUT", f"/queues/{v}/payments.refunds", json={"durable": True}).raise_for_status()
    broker.api(
        "POST", f"/bindings/{v}/e/payments/q/payments.refunds", json={"routing_key": "refund"}
    ).raise_for_status()
    result = broker.cli(
        "publish", "payments", "paid", "--body", "a", "--message-id", "m-1", vhost=vhost
    )
    assert result.returncode == 65, result.stderr
    assert result.stderr.splitlines()[0] == "published 1, confirmed 0, returned 1, nacked 0"
    assert _error_line(result.stderr) == (
        "1 message(s) were unroutable and were returned, e.g. message_id m-1: routing key "
        "'paid' matches no binding of exchange 'payments'; its bindings: 'pay' → queue "
        "'payments.work', 'refund' → queue 'payments.refunds' — publish with one of those "
        "routing keys, or bind a queue for this one"
    )
    # returned, not misrouted: neither bound queue holds it
    assert broker.depths(vhost, ["payments.work", "payments.refunds"]) == {
        "payments.work": 0,
        "payments.refunds": 0,
    }


def test_a_wrong_routing_key_without_the_api_routes_nowhere(
    fresh_vhost: Callable[[], str],
) -> None:
    vhost = _payments(fresh_vhost)
    result = broker.cli(
        "publish",
        "payments",
        "paid",
        "--body",
        "a",
        "--message-id",
        "m-1",
        vhost=vhost,
        env={"RMQKIT_MANAGEMENT_URL": DEAD_API},
    )
    assert result.returncode == 65, result.stderr
    assert _error_line(result.stderr) == (
        "1 message(s) were unroutable and were returned, e.g. message_id m-1: routing key "
        "'paid' routes nowhere on exchange 'payments' (its bindings are not listed: the "
        "management API did not answer) — check the routing key and bindings (`rmqkit plan`)"
    )


def test_the_default_exchange_with_no_such_queue(fresh_vhost: Callable[[], str]) -> None:
    vhost = _payments(fresh_vhost)
    result = broker.cli(
        "publish", "", "payments.wrk", "--body", "a", "--message-id", "m-1", vhost=vhost
    )
    assert result.returncode == 65, result.stderr
    assert _error_line(result.stderr) == (
        "1 message(s) were unroutable and were returned, e.g. message_id m-1: the default "
        "exchange routes a message to the queue its routing key names, and no queue is named "
        "'payments.wrk' — check the queue's name (`rmqkit status` lists them)"
    )


# --- Ctrl-C during a long publish ----------------------------------------------------------------
TOTAL = 40_000
SETTLED = re.compile(
    r"^interrupted: (\d+) message\(s\) published, (\d+) confirmed \(on their queues\); the last "
    r"sent was line (\d+) of the input — "
)
WAITING = re.compile(
    r"^interrupted: (\d+) message\(s\) published, (\d+) confirmed \(on their queues\); (\d+) "
    r"sent without a confirm \(lines (\d+)-(\d+)\), which may be on the queue — "
)


def _publish_and_interrupt(vhost: str, source: Path, *args: str) -> tuple[int, str]:
    """`rmqkit publish '' payments.work ARGS < source`, Ctrl-C once the queue holds some."""
    with source.open("rb") as stdin:
        process = subprocess.Popen(
            [sys.executable, "-m", "rmqkit", "publish", "", "payments.work", *args],
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=broker.cli_env(vhost),
        )
        try:
            deadline = time.monotonic() + 60
            while (broker.depths(vhost, ["payments.work"])["payments.work"] or 0) < 2000:
                assert process.poll() is None, process.communicate()
                assert time.monotonic() < deadline, "nothing was published in 60 s"
                time.sleep(0.05)
            process.send_signal(signal.SIGINT)
            _out, err = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
    return process.returncode, err


async def _ids(vhost: str, queue: str, expected: int) -> list[str]:
    """The message_ids of every message on ``queue`` (taken off it), fast: one consumer."""
    conn = await aio_pika.connect(with_vhost(broker.BASE_URL, vhost))
    ids: list[str] = []
    try:
        channel = await conn.channel()
        await channel.set_qos(prefetch_count=2000)
        source = await channel.get_queue(queue, ensure=False)
        async with source.iterator(no_ack=True) as messages:
            while len(ids) < expected:
                try:
                    message = await asyncio.wait_for(messages.__anext__(), timeout=5)
                except TimeoutError:
                    break
                ids.append(str(message.message_id))
        return ids
    finally:
        await conn.close()


def test_ctrl_c_says_what_was_confirmed_and_skip_resumes_without_a_copy(
    fresh_vhost: Callable[[], str], tmp_path: Path
) -> None:
    vhost = _payments(fresh_vhost)
    source = tmp_path / "orders.txt"
    lines = [f'{{"order": {n}}}' for n in range(1, TOTAL + 1)]
    source.write_text("".join(line + "\n" for line in lines))

    code, err = _publish_and_interrupt(vhost, source)
    assert code == 130, err
    summary, error = err.strip().splitlines()
    line = error.removeprefix("rmqkit: error: ")
    depth = broker.depths(vhost, ["payments.work"])["payments.work"]
    assert depth is not None
    settled = SETTLED.match(line)
    if settled:  # every message in flight was confirmed within the grace: the usual case
        published, confirmed, last = (int(g) for g in settled.groups())
        assert published == confirmed == last == depth < TOTAL
        skip = last
        assert line == (
            f"interrupted: {published} message(s) published, {confirmed} confirmed (on their "
            f"queues); the last sent was line {last} of the input — to resume, run the same "
            f"command on the same input with --skip {last} (the lines after it keep their "
            f"numbers, so their message_ids); a rerun of the whole input instead sends those "
            f"{confirmed} again under the same message_ids, which a consumer deduplicating by "
            "message_id drops"
        )
    else:
        waiting = WAITING.match(line)
        assert waiting, line
        published, confirmed, unconfirmed, first, last = (int(g) for g in waiting.groups())
        assert confirmed <= depth <= published == last and unconfirmed == published - confirmed
        skip = first - 1
        assert line.endswith(
            f"to resume, run the same command on the same input with --skip {skip} (the lines "
            "after it keep their numbers, so their message_ids); those are sent again under "
            "the same message_ids, which a consumer deduplicating by message_id drops"
        )
    assert summary == f"published {published}, confirmed {confirmed}, returned 0, nacked 0"

    # Resume as told: the queue ends with every line, and with the ids a full run gives
    with source.open("rb") as stdin:
        resumed = subprocess.run(
            [sys.executable, "-m", "rmqkit", "publish", "", "payments.work", "--skip", str(skip)],
            stdin=stdin,
            capture_output=True,
            text=True,
            env=broker.cli_env(vhost),
            timeout=300,
            check=False,
        )
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stderr.startswith(f"published {TOTAL - skip}, confirmed {TOTAL - skip},")
    ids = broker.run(_ids(vhost, "payments.work", TOTAL + 1))
    derive = IdSource("", "payments.work")
    full_run = {derive.message_id(n, line.encode(), None) for n, line in enumerate(lines, 1)}
    if settled:
        assert len(ids) == TOTAL  # none lost, none twice
    assert set(ids) == full_run  # every line, under the id a full run gives it


def test_skip_goes_with_stdin_only(fresh_vhost: Callable[[], str]) -> None:
    vhost = _payments(fresh_vhost)
    result = broker.cli("publish", "", "payments.work", "--body", "a", "--skip", "1", vhost=vhost)
    assert result.returncode == 64
    assert result.stderr == (
        "rmqkit: error: --skip skips lines of stdin; it does not go with --body\n"
    )


# --- status --watch ------------------------------------------------------------------------------
def test_status_watch_ends_on_ctrl_c_with_exit_0(fresh_vhost: Callable[[], str]) -> None:
    vhost = _payments(fresh_vhost)
    process = subprocess.Popen(
        [sys.executable, "-m", "rmqkit", "status", "--watch", "--json", "--interval", "300ms"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=broker.cli_env(vhost),
    )
    try:
        assert process.stdout is not None
        first: Any = process.stdout.readline()
        assert '"payments.work"' in first
        process.send_signal(signal.SIGINT)
        _out, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    assert err == ""


# --- Ctrl-C during declare -----------------------------------------------------------------------
INTERRUPTED_DECLARE = re.compile(
    r"^interrupted: (\d+) of the topology's (\d+) objects exist, not yet declared: (.+) "
    r"\(e\.g\. (\w+) '([^']+)'\) — rerun `rmqkit declare (\S+)`: it is idempotent, it declares "
    r"only what is missing$"
)


def _wide_topology(path: Path, work_queues: int) -> Path:
    """A topology whose declare takes some seconds: many policies (one per queue) to PUT."""
    text = '[exchanges.ex]\ntype = "direct"\n' + "".join(
        f'\n[queues."w.{n}"]\nbind = [{{ exchange = "ex", routing_key = "k.{n}" }}]\n'
        'retry_delays = ["1s", "5s"]\n'
        for n in range(work_queues)
    )
    path.write_text(text)
    return path


def test_ctrl_c_during_declare_says_what_exists_and_a_rerun_completes(
    fresh_vhost: Callable[[], str], tmp_path: Path
) -> None:
    file = _wide_topology(tmp_path / "wide.toml", 12)
    for _attempt in range(3):
        vhost = fresh_vhost()
        process = subprocess.Popen(
            [sys.executable, "-m", "rmqkit", "declare", str(file)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=broker.cli_env(vhost),
        )
        try:
            deadline = time.monotonic() + 120
            while process.poll() is None and time.monotonic() < deadline:
                if len(broker.api("GET", f"/policies/{broker.q(vhost)}").json()) >= 2:
                    process.send_signal(signal.SIGINT)
                    break
                time.sleep(0.05)
            _out, err = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
        if process.returncode != 0:  # else it finished before the signal: again, fresh
            break
    assert process.returncode == 130, err
    line = _error_line(err)
    assert len(err.strip().splitlines()) == 1, err
    said = INTERRUPTED_DECLARE.match(line)
    assert said, line
    present, total = int(said.group(1)), int(said.group(2))
    assert said.group(6) == str(file) and 0 < present < total
    # what it says is missing is what `rmqkit plan` finds to create
    shown = broker.cli("plan", str(file), "--json", vhost=vhost, timeout=180)
    assert shown.returncode == 2, shown.stderr
    created = [c for c in json.loads(shown.stdout)["changes"] if c["action"] == "create"]
    assert len(created) == total - present
    counts: dict[str, int] = {}
    for change in created:
        counts[change["kind"]] = counts.get(change["kind"], 0) + 1
    singular = {"policies": "policy", "queues": "queue", "bindings": "binding"}
    told = {}
    for part in said.group(3).split(", "):
        n, kind = part.split(" ")
        told[singular.get(kind, kind.removesuffix("s"))] = int(n)
    assert told == counts
    # rerunning, as told, completes it
    again = broker.cli("declare", str(file), vhost=vhost, timeout=180)
    assert again.returncode == 0, again.stderr
    assert broker.cli("plan", str(file), vhost=vhost, timeout=180).returncode == 0

"""Every runbook in docs/runbooks/ runs, as written, against the real broker (issue 14).

Each test sets up its incident in a vhost of its own, runs the runbook's ``console runbook:NAME``
blocks through tests/runbooks_harness.py (exit codes and output excerpts as the Markdown shows
them), and then checks what the broker holds. The runbooks' names (``topologies/orders.toml``,
``orders.work``, ``myapp.handlers:handle``) exist in each test's working directory; the topology
there is the worked example with small numbers (1 s / 2 s retries, delivery limit 2) so the module
stays within its CI budget. What is simulated is said per test.
"""

from __future__ import annotations

import contextlib
import re
import textwrap
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from rmqkit.settings import with_vhost
from rmqkit.topology import declare_topology, load_topology
from tests import broker
from tests.ports import closed_port
from tests.runbooks_harness import RUNBOOKS, Runbook, blocks

pytestmark = pytest.mark.semantics("4.3")

WORK = "orders.work"
PARKING = "orders.work.parking"

TOPOLOGY = """\
[exchanges.orders]
type = "topic"

[queues."orders.work"]
bind = [{ exchange = "orders", routing_key = "order.*" }]
retry_delays = ["1s", "2s"]
max_attempts = 3
delivery_limit = 2
max_length = 1000
prefetch = 10
"""

# The handler as deployed during the incident: some orders kill the worker process.
CRASHING = """\
import os

import rmqkit


async def handle(message: rmqkit.Message) -> None:
    order = message.json()
    if order.get("crash"):
        os._exit(1)
"""

FIXED = """\
import rmqkit


async def handle(message: rmqkit.Message) -> None:
    message.json()
"""


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """The operator's directory: the topology file and the handler package the runbooks name."""
    (tmp_path / "topologies").mkdir()
    (tmp_path / "topologies" / "orders.toml").write_text(TOPOLOGY)
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "handlers.py").write_text(FIXED)
    return tmp_path


@pytest.fixture
def declared(fresh_vhost: Callable[[], str], workdir: Path) -> str:
    """A fresh vhost with the working directory's topology declared (the library call)."""
    vhost = fresh_vhost()
    topology = load_topology(workdir / "topologies" / "orders.toml")
    broker.run(declare_topology(broker.settings_for(vhost), topology))
    return vhost


@pytest.fixture
def runbook(workdir: Path, declared: str) -> Iterator[Callable[[str], Runbook]]:
    """Open a runbook with RMQKIT_URL on the test's vhost; background commands stopped after."""
    opened: list[Runbook] = []

    def open_(name: str) -> Runbook:
        opened.append(Runbook(name, workdir, broker.cli_env(declared)))
        return opened[-1]

    yield open_
    for book in opened:
        book.stop()


def _headers(error_type: str, message: str, failed: str) -> dict[str, Any]:
    """The headers the consumer writes when it parks a message (reason permanent)."""
    return {
        "rmqkit-park-reason": "permanent",
        "rmqkit-error-type": error_type,
        "rmqkit-error-message": message,
        "rmqkit-origin-queue": WORK,
        "rmqkit-original-exchange": "orders",
        "rmqkit-original-routing-key": "order.created",
        "rmqkit-attempt": 1,
        "rmqkit-first-failed-at": failed,
        "rmqkit-last-failed-at": failed,
    }


def _park(
    vhost: str, ids: list[str], error_type: str, message: str, age: timedelta = timedelta()
) -> dict[str, Any]:
    """Put messages into the parking lane as the consumer parks them; returns their headers."""
    failed = (datetime.now(UTC) - age).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    headers = _headers(error_type, message, failed)
    messages = [(i, f'{{"id": "{i}"}}'.encode()) for i in ids]
    broker.publish_with_ids(vhost, "", PARKING, messages, headers=lambda _: headers)
    return headers


def _depth(vhost: str, queue: str) -> int:
    depth = broker.depths(vhost, [queue])[queue]
    assert depth is not None
    return depth


def _drained_ids(vhost: str, queue: str) -> list[str]:
    return sorted(str(m["message_id"]) for m in broker.drain(vhost, queue))


def test_every_runbook_is_indexed_and_has_steps() -> None:
    index = (RUNBOOKS / "README.md").read_text()
    pages = sorted(p.name for p in RUNBOOKS.glob("*.md") if p.name != "README.md")
    assert len(pages) == 8
    for page in pages:
        assert f"]({page})" in index, f"{page} is not in docs/runbooks/README.md"
        assert blocks(page), f"{page} has no runnable block"
        assert page.removesuffix(".md").replace("-", "_") in _TESTED, f"{page} has no test"


_TESTED = {
    "queue_backing_up",
    "poison_storm",
    "replay_after_fix",
    "node_loss",
    "memory_alarm",
    "consumer_crash_loop",
    "parking_export_import",
    "topology_rotation",
}


@contextlib.contextmanager
def _trickle(vhost: str) -> Iterator[None]:
    """Publish an order every 0.2 s to the work queue until the block ends."""
    stop = threading.Event()

    def publish() -> None:
        n = 0
        while not stop.wait(0.2):
            broker.publish_with_ids(vhost, "orders", "order.created", [(f"late-{n}", b"{}")])
            n += 1

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)


def test_queue_backing_up(declared: str, runbook: Callable[[str], Runbook]) -> None:
    """30 orders wait and no consumer is attached; the runbook's consumers drain them."""
    ids = [f"order-{i}" for i in range(30)]
    broker.publish_with_ids(declared, "orders", "order.created", [(i, b"{}") for i in ids])
    book = runbook("queue-backing-up.md")
    book.run("look")
    with _trickle(declared):  # producers keep publishing while doctor samples
        book.run("doctor")
    book.run("start")
    book.run("verify")
    assert book.stop() == [0]  # SIGTERM: graceful stop
    assert _depth(declared, WORK) == 0 and _depth(declared, PARKING) == 0


def test_poison_storm(declared: str, runbook: Callable[[str], Runbook]) -> None:
    """25 parked by one bug (20 in the last minutes, 5 two hours ago); simulated by publishing
    them into the parking lane with the headers the consumer writes when it parks."""
    _park(
        declared, [f"new-{i}" for i in range(20)], "myapp.errors.PriceMissing", "order has no price"
    )
    _park(
        declared,
        [f"old-{i}" for i in range(5)],
        "myapp.errors.PriceMissing",
        "order has no price",
        age=timedelta(hours=2),
    )
    book = runbook("poison-storm.md")
    book.run("check")
    book.run("rate")
    book.run("sample")
    assert _depth(declared, PARKING) == 25  # nothing in the runbook removes a message


def test_replay_after_fix(declared: str, runbook: Callable[[str], Runbook]) -> None:
    """12 parked by the fixed bug and 3 declined cards; replay the 12 through an interruption."""
    fixed = [f"price-{i:02}" for i in range(12)]
    _park(declared, fixed, "myapp.errors.PriceMissing", "order has no price")
    _park(declared, ["card-0", "card-1", "card-2"], "myapp.errors.CardDeclined", "declined")
    book = runbook("replay-after-fix.md")
    book.run("groups")
    book.run("dry-run")
    assert _depth(declared, WORK) == 0
    book.run("canary")
    assert _depth(declared, WORK) == 2
    book.run("interrupted")
    book.run("left")
    book.run("resume")
    book.run("verify")
    assert _drained_ids(declared, WORK) == fixed  # each exactly once
    assert _drained_ids(declared, PARKING) == ["card-0", "card-1", "card-2"]


def test_consumer_crash_loop(
    declared: str, workdir: Path, runbook: Callable[[str], Runbook]
) -> None:
    """One order kills the worker every time; the broker's delivery limit (2) parks it."""
    (workdir / "myapp" / "handlers.py").write_text(CRASHING)
    orders = [("boom", b'{"id": "boom", "crash": true}')]
    orders += [(f"ok-{i}", f'{{"id": "ok-{i}"}}'.encode()) for i in range(4)]
    broker.publish_with_ids(declared, "orders", "order.created", orders)
    book = runbook("consumer-crash-loop.md")
    book.run("consume")
    book.run("parked")
    parked = broker.cli_json_lines("parking", "list", PARKING, "--json", vhost=declared)
    assert [(m["message_id"], m["reason"]) for m in parked] == [("boom", "delivery_limit")]
    book.run("show", MESSAGE_ID="boom")
    assert book.stop() == [0]
    log = book.background_output(0)
    assert "died (exit 1)" in log and "restarting in" in log, log
    (workdir / "myapp" / "handlers.py").write_text(FIXED)  # the fix is deployed
    book.run("consume")
    book.run("replay")
    drained = broker.wait_for(
        lambda: broker.depths(declared, [WORK, PARKING]) == {WORK: 0, PARKING: 0}, timeout_s=30
    )
    assert drained, broker.depths(declared, [WORK, PARKING])
    assert book.stop() == [0]


def test_parking_export_import(declared: str, runbook: Callable[[str], Runbook]) -> None:
    ids = [f"order-{i}" for i in range(10)]
    headers = _park(declared, ids, "myapp.errors.PriceMissing", "order has no price")
    book = runbook("parking-export-import.md")
    book.run("export")
    book.run("emptied")
    assert _depth(declared, PARKING) == 0
    book.run("exists")
    book.run("import")
    book.run("again")
    book.run("resume")
    book.run("verify")
    after = broker.drain(declared, PARKING)
    assert sorted(str(m["message_id"]) for m in after) == ids  # each exactly once
    for message in after:  # round-tripped: body and rmqkit's headers as parked
        assert message["body"] == f'{{"id": "{message["message_id"]}"}}'.encode()
        kept = {k: v for k, v in message["headers"].items() if not k.startswith("x-")}
        assert kept == headers


def test_topology_rotation(declared: str, workdir: Path, runbook: Callable[[str], Runbook]) -> None:
    """Version 2 of the file adds a 5 s retry tier and raises max_length to 2000."""
    path = workdir / "topologies" / "orders.toml"
    path.write_text(TOPOLOGY.replace('["1s", "2s"]', '["1s", "2s", "5s"]').replace("1000", "2000"))
    book = runbook("topology-rotation.md")
    book.run("plan")
    assert "orders.work.wait.5s" not in broker.queue_names(declared)
    book.run("declare")
    book.run("verify")
    assert "orders.work.wait.5s" in broker.queue_names(declared)
    policy = broker.api("GET", f"/policies/{broker.q(declared)}/rmqkit.orders.work").json()
    assert policy["definition"]["max-length"] == 2000


def test_node_loss(declared: str, runbook: Callable[[str], Runbook]) -> None:
    """Single node: the lost node is a port nothing listens on, the survivor the test broker."""
    broker.publish_with_ids(
        declared, "orders", "order.created", [(f"o-{i}", b"{}") for i in range(5)]
    )
    lost = with_vhost(f"amqp://guest:guest@127.0.0.1:{closed_port()}/", declared)
    placeholders = {
        "LOST_NODE_URL": lost,
        "SURVIVING_NODE_URL": with_vhost(broker.BASE_URL, declared),
    }
    book = runbook("node-loss.md")
    book.run("lost", **placeholders)
    assert _depth(declared, WORK) == 5
    book.run("failover", **placeholders)
    book.run("state", **placeholders)
    book.run("plan", **placeholders)
    bodies = sorted(m["body"] for m in broker.drain(declared, WORK))
    assert bodies == sorted([b"{}"] * 5 + [b'{"id": "canary-failover"}'])


_WATERMARK = re.compile(r"Memory high watermark setting: ([0-9.]+) of available memory")


def _mem_alarm() -> bool:
    nodes = broker.api("GET", "/nodes").json()
    return any(node.get("mem_alarm") for node in nodes)


@pytest.mark.own_node  # the alarm blocks every publisher of the node
def test_memory_alarm(declared: str, runbook: Callable[[str], Runbook]) -> None:
    """A real memory alarm (watermark lowered to 1 MB), restored in a finally. Only on a node
    named by RMQKIT_TEST_RABBITMQCTL (scripts/broker-up --version 4.0|4.3 --env): an alarm blocks
    every publisher of the node, so never on the shared default one."""
    if not broker.RABBITMQCTL:
        pytest.skip("needs a node of its own (RMQKIT_TEST_RABBITMQCTL): an alarm blocks all")
    found = _WATERMARK.search(broker.rabbitmqctl("status").stdout)
    if found is None:
        pytest.skip("the node's watermark is not a fraction of memory: would not restore it")
    book = runbook("memory-alarm.md")
    broker.rabbitmqctl("set_vm_memory_high_watermark", "absolute", "1000000", check=True)
    try:
        assert broker.wait_for(_mem_alarm, timeout_s=20), "no memory alarm"
        book.run("blocked")
        book.run("status")
    finally:
        broker.rabbitmqctl("set_vm_memory_high_watermark", found[1], check=True)
    assert broker.wait_for(lambda: not _mem_alarm(), timeout_s=20), "alarm not cleared"
    book.run("cleared")
    bodies = [m["body"] for m in broker.drain(declared, WORK)]
    assert b'{"id": "canary-after"}' in bodies


def test_runbook_format_is_parsed_as_documented() -> None:
    text = textwrap.dedent(
        """\
        $ rmqkit plan topologies/orders.toml \\
            --json
        (exit 2)
        …
        create    queue    orders.work
        (until it shows, up to 5s)
        $ rmqkit consume myapp.handlers:handle --queue orders.work &
        """
    )
    from tests.runbooks_harness import _parse

    plan, consume = _parse(text)
    assert plan.command == "rmqkit plan topologies/orders.toml  --json"
    assert (plan.exit_code, plan.until_s, plan.expect) == (2, 5.0, ["create queue orders.work"])
    assert consume.background and not plan.background

"""Fault scenarios on a 3-node cluster of the suite's own (tests/faults/cluster.py).

Every scenario publishes ids it generates itself (`rmqkit publish --ndjson`, one message_id per
line), runs `rmqkit consume` with an idempotent handler (tests/faults/idempotent_handlers.py)
against all three nodes (RMQKIT_URL lists them), injects its fault, and ends with the ledger
(tests/faults/ledger.py): every id processed, parked or still queued — zero unaccounted — and no
side effect applied twice. Counts: 2,000 messages by default; 100,000 with RMQKIT_SOAK=1 or
--soak (RMQKIT_FAULT_COUNT overrides both). The ledger tables print at the end of the run.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.faults.cluster import (
    NAMES,
    ROOT,
    Cluster,
    ClusterConsumer,
    ClusterUnavailable,
    poll,
    q,
)
from tests.faults.idempotent_handlers import clear_switch, set_switch
from tests.faults.ledger import Ledger, LedgerReport, check

# CI leaves these out when scripts/cluster-proven records that they passed on the same trees
pytestmark = pytest.mark.cluster

T = TypeVar("T")
SOAK = os.environ.get("RMQKIT_SOAK") == "1"
N = int(os.environ.get("RMQKIT_FAULT_COUNT", 100_000 if SOAK else 2_000))
WORK, PARKING, EXCHANGE, KEY = "jobs.work", "jobs.work.parking", "jobs", "job"
# tests/topologies/jobs.toml with a delivery limit that repeated kills cannot exhaust: every
# return of an unacked message counts toward it on 3.10, and a message in flight during several
# faults would otherwise be parked (accounted for, but not processed).
TOPOLOGY = """
[exchanges.jobs]
type = "direct"

[queues."jobs.work"]
bind = [{ exchange = "jobs", routing_key = "job" }]
retry_delays = ["1s", "2s"]
max_attempts = 4
delivery_limit = 50
prefetch = 50
"""
CONSUMER = ("--processes", "2", "--prefetch", "20", "--grace", "20s")
SCALE_TIMEOUT = max(1.0, N / 2_000)  # waits grow with the count
# Messages handled with the brake on before each kill or forced close (``Scenario.reach``).
# Unbraked, a consumer here handles the whole 2,000-message backlog in under a second when the
# CPUs are free — faster than the test can land five kills; braked it does at most 80 a second
# (2 workers, prefetch 20, 0.5 s each), so the fault lands mid-batch on a fast machine too.
BRAKED_LEAD = 2_000
# How long to wait for another run's cluster (one per host) before skipping: the wait counts
# toward the first scenario's pytest timeout (300 s), with the cluster start and the scenario.
LOCK_WAIT_S = 150


@dataclass(frozen=True)
class Job:
    message_id: str
    kind: str
    body: Any  # a dict (JSON) or a str (sent as is: not JSON for poison)

    def line(self) -> str:
        return json.dumps({"message_id": self.message_id, "body": self.body})


def jobs(n: int, kind: str, **fields: Any) -> list[Job]:
    out = []
    for _ in range(n):
        message_id = uuid.uuid4().hex
        out.append(Job(message_id, kind, {"id": message_id, **fields}))
    return out


def stable(read: Callable[[], int], timeout_s: float = 30, interval_s: float = 1.0) -> int:
    """A reading that came back the same twice in a row, ``interval_s`` apart."""
    deadline = time.monotonic() + timeout_s
    last = read()
    while time.monotonic() < deadline:
        time.sleep(interval_s)
        value = read()
        if value == last and value >= 0:
            return value
        last = value
    return last


class Scenario:
    """One scenario: its vhost on the cluster, its ledger, its consumers and publishers."""

    def __init__(self, cluster: Cluster, vhost: str, tmp: Path, name: str) -> None:
        self.cluster = cluster
        self.vhost = vhost
        self.tmp = tmp
        self.name = name
        self.ledger = Ledger(tmp / "ledger.db", name)
        self.topology = tmp / "jobs.toml"
        self.topology.write_text(TOPOLOGY)
        self.consumers: list[ClusterConsumer] = []
        self.background: list[subprocess.Popen[str]] = []
        self.started = time.monotonic()
        self.wait_queues: list[str] = []
        self.copies = 0  # parked messages (an id parked twice counts twice)
        self.timeline: list[str] = []
        self._publishing: dict[int, int] = {}  # pid → messages, of background publishers
        self.restarts: list[threading.Thread] = []
        self.restart_errors: list[BaseException] = []
        self.last_seen = ""  # what the last management read saw (in a timed-out wait's message)

    # --- plumbing ------------------------------------------------------------------------------
    def env(self, first: str | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RMQKIT_")}
        env["RMQKIT_URL"] = self.cluster.urls(self.vhost, first)
        env["RMQKIT_MANAGEMENT_URL"] = self.cluster.nodes[first or "rmqa"].mgmt
        env["RMQKIT_CONNECT_TIMEOUT_S"] = "3"
        return env

    def cli(
        self, *args: str, first: str | None = None, stdin: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "rmqkit", *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=self.env(first),
            cwd=ROOT,
            timeout=timeout,
            check=False,
        )

    def cli_background(
        self, *args: str, first: str | None = None, stdin: str | None = None
    ) -> subprocess.Popen[str]:
        source = subprocess.DEVNULL
        if stdin is not None:
            path = self.tmp / f"stdin-{uuid.uuid4().hex[:8]}.ndjson"
            path.write_text(stdin)
            source = path.open("rb")  # type: ignore[assignment]
        proc = subprocess.Popen(
            [sys.executable, "-m", "rmqkit", *args],
            stdin=source,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env(first),
            cwd=ROOT,
        )
        self.background.append(proc)
        return proc

    def declare(self) -> None:
        # On node a: RMQKIT_URL/RMQKIT_MANAGEMENT_URL point at rmqa first.
        result = self.cli("declare", str(self.topology), first="rmqa")
        assert result.returncode == 0, result.stdout + result.stderr
        rows = self.cluster.api("GET", f"/queues/{self.vhost.replace('/', '%2F')}").json()
        self.wait_queues = sorted(r["name"] for r in rows if r["name"].startswith(WORK + ".wait"))
        assert self.wait_queues, rows

    def phase(self, label: str) -> None:
        self.timeline.append(f"{label} {time.monotonic() - self.started:.1f}s")

    def start_app_later(self, node: str, *, killed: bool = False) -> None:
        """Bring ``node`` back in a thread (`rabbitmqctl start_app`, or a new VM for a killed
        node: seconds either way) while the scenario goes on; joined before the next fault
        (``nodes_back``) and before the account."""

        def run() -> None:
            try:
                if killed:
                    self.cluster.restart_node(node)
                else:
                    self.cluster.start_app(node)
            except BaseException as exc:
                self.restart_errors.append(exc)

        thread = threading.Thread(target=run, name=f"start {node}")
        thread.start()
        self.restarts.append(thread)

    def nodes_back(self) -> None:
        for thread in self.restarts:
            thread.join(timeout=180)
        self.restarts = []
        if self.restart_errors:
            raise self.restart_errors[0]
        self.phase("nodes back")

    # --- publishing ----------------------------------------------------------------------------
    def publish(
        self, items: list[Job], *, first: str | None = None, window: int | None = None
    ) -> int:
        """`rmqkit publish --ndjson --json`: every message confirmed (exit 0)."""
        return self.published(self.publish_background(items, first=first, window=window))

    def published(self, publisher: subprocess.Popen[str]) -> int:
        """Wait for a background `rmqkit publish`: exit 0, every message confirmed."""
        try:
            out, err = publisher.communicate(timeout=120 * SCALE_TIMEOUT)
        except subprocess.TimeoutExpired:
            publisher.kill()
            pytest.fail(f"{self.name}: rmqkit publish did not finish")
        count = self._publishing.pop(publisher.pid)
        self.phase(f"published {count}")
        assert publisher.returncode == 0, err
        summary = json.loads(out.strip().splitlines()[-1])
        assert summary["confirmed"] == count, summary
        self.ledger.confirmed_reported += summary["confirmed"]
        return int(summary["confirmed"])

    def publish_background(
        self, items: list[Job], *, first: str | None = None, window: int | None = None
    ) -> subprocess.Popen[str]:
        for job in items:
            self.ledger.add([job.message_id], job.kind)
        args = ["publish", EXCHANGE, KEY, "--ndjson", "--json"]
        if window:
            args += ["--window", str(window)]
        proc = self.cli_background(
            *args, first=first, stdin="\n".join(job.line() for job in items) + "\n"
        )
        self._publishing[proc.pid] = len(items)
        return proc

    # --- consuming -----------------------------------------------------------------------------
    def consume(self, *args: str, first: str | None = None) -> ClusterConsumer:
        consumer = ClusterConsumer(
            self.cluster,
            self.vhost,
            self.ledger.path,
            *(args or CONSUMER),
            first=first,
            topology=self.topology,
        )
        self.consumers.append(consumer)
        return consumer

    def consumer_nodes(self) -> set[str]:
        """Nodes the consumers' connections are on, as the brokers list them (live, not the
        management API's statistics: those lagged and, cached, stayed stale for a minute)."""
        nodes = self.cluster.live_connections(self.vhost, "rmqkit consume")
        self.last_seen = f"consumer connections on {nodes}"
        return set(nodes)

    def listed_on(self, node: str) -> None:
        """Wait until the consumer's connections are all on ``node``."""
        self.wait(lambda: self.consumer_nodes() == {node}, 30, f"the consumer listed on {node}")

    def moved_off(self, node: str) -> set[str]:
        """The consumer's nodes once it has connections and none of them is on ``node``."""
        nodes = self.consumer_nodes()
        return nodes if nodes and node not in nodes else set()

    def brake(self, on: bool) -> None:
        """Hold consumption slow (the handler sleeps) until a fault has landed."""
        (set_switch if on else clear_switch)(self.ledger.path, "brake")

    def processed(self, kind: str | None = None) -> int:
        return self.ledger.processed(self.ledger.ids(kind))

    def depth(self, queue: str, via: str | None = None) -> int:
        try:
            return self.cluster.depths(self.vhost, [queue], via=via)[queue]
        except Exception:
            return -1  # no node answered / queue has no leader yet: not settled

    def wait(self, fn: Callable[[], T], timeout_s: float, what: str) -> T:
        """``fn()`` once it is truthy (polled); the scenario fails after the timeout."""
        self.last_seen = ""
        value = poll(fn, timeout_s * SCALE_TIMEOUT, 0.2)
        if value:
            return value
        logs = "\n".join(f"--- {c.log_path.name}\n{c.output()[-3000:]}" for c in self.consumers)
        pytest.fail(
            f"{self.name}: timed out after {timeout_s * SCALE_TIMEOUT:.0f}s waiting for {what} "
            f"(last: {value!r}{'; ' + self.last_seen if self.last_seen else ''}); "
            f"processed {self.ledger.processed()} of {len(self.ledger.sent)}\n{logs}"
        )

    def wait_processed(self, kind: str | None, count: int, timeout_s: float, what: str) -> None:
        self.wait(lambda: self.processed(kind) >= count, timeout_s, what)

    def reach(self, target: int, timeout_s: float, what: str) -> None:
        """Wait until ``target`` ids are processed, the last BRAKED_LEAD of them with the brake
        on; it stays on, so the consumer is still busy, with a backlog, when the fault lands."""
        if self.processed() < target - BRAKED_LEAD:
            self.brake(False)
            self.wait_processed(None, target - BRAKED_LEAD, timeout_s, what)
        self.brake(True)
        self.wait_processed(None, target, timeout_s, what)

    def settled(self, parked: int = 0) -> bool:
        try:
            counts = self.cluster.depths(self.vhost, [WORK, *self.wait_queues, PARKING])
        except Exception:
            return False
        return counts[PARKING] >= parked and all(v == 0 for k, v in counts.items() if k != PARKING)

    # --- the end -------------------------------------------------------------------------------
    def parked(self) -> dict[str, str | None]:
        result = self.cli("parking", "list", PARKING, "--json", timeout=300 * SCALE_TIMEOUT)
        assert result.returncode == 0, result.stderr
        out: dict[str, str | None] = {}
        self.copies = 0
        for line in result.stdout.splitlines():
            if line.strip():
                row = json.loads(line)
                out[row["message_id"]] = row["reason"]
                self.copies += 1
        return out

    def finish(self, *, expect_parked: dict[str, set[str]] | None = None) -> LedgerReport:
        """Stop the consumers (SIGTERM, exit 0), take the account, check the invariants."""
        self.nodes_back()
        for consumer in self.consumers:
            if consumer.proc.poll() is None:
                code = consumer.stop(timeout=60)
                assert code == 0, f"consumer exited {code}:\n{consumer.output()[-3000:]}"
        parked = self.parked()
        queued: list[str | None] = []
        for queue in (WORK, *self.wait_queues):
            queued += [m for m, _, _ in self.cluster.take_all(self.vhost, queue)]
        self.ledger.note("timeline: " + ", ".join(self.timeline))
        report = self.ledger.account(
            parked, queued, seconds=time.monotonic() - self.started, parked_copies=self.copies
        )
        check(report)
        wanted = expect_parked or {}
        by_reason: dict[str, set[str]] = {}
        for message_id, reason in parked.items():
            by_reason.setdefault(str(reason), set()).add(message_id)
        assert by_reason == wanted, {reason: len(ids) for reason, ids in by_reason.items()} | {
            "expected": {r: len(i) for r, i in wanted.items()}
        }
        return report

    def cleanup(self) -> None:
        for thread in self.restarts:
            thread.join(timeout=180)
        for consumer in self.consumers:
            consumer.kill()
        for proc in self.background:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


# --- fixtures
@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    if os.environ.get("RMQKIT_FAULT_CLUSTER_REUSE") == "1":
        attached = Cluster.attach()
        if attached is not None:
            yield attached  # started by scripts/cluster start; left running
            return
    instance = Cluster()
    try:
        try:
            # Skipped (with the reason) only if this machine cannot run the nodes: no
            # rabbitmq-server, not root, no rabbitmq user, their ports taken by something else,
            # or another run's cluster still up after LOCK_WAIT_S. Any other failure to start
            # fails the run.
            instance.start(lock_timeout_s=LOCK_WAIT_S)
        except ClusterUnavailable as exc:
            pytest.skip(f"3-node fault cluster unavailable: {exc}")
        yield instance
    finally:
        instance.stop()


@pytest.fixture
def sc(cluster: Cluster, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Scenario]:
    healed = cluster.heal()
    name = request.node.name.removeprefix("test_")
    vhost = cluster.create_vhost(name[:24])
    scenario = Scenario(cluster, vhost, tmp_path, name)
    if healed:
        scenario.ledger.note("before the scenario: " + ", ".join(healed))
    try:
        scenario.declare()
        yield scenario
    finally:
        scenario.cleanup()
        cluster.delete_vhost(vhost)


# --- 1. consumer kill -9
def test_consumer_kill_9_five_times(sc: Scenario) -> None:
    """Five SIGKILLs mid-batch: the 1st, 3rd and 5th kill one worker (the supervisor replaces
    it), the 2nd and 4th the whole consumer, supervisor and workers (a new one is started).
    Each kill lands with the brake on (``Scenario.reach``: the backlog not consumed yet), on a
    worker seen handling messages (its pid in the deliveries rows of the last second). What each
    victim died holding is noted; some of it must have been applied but not acked (the brake
    sleeps mostly after the effect), so the idempotency is put to the test."""
    sc.publish(jobs(N, "good"))  # a backlog: every worker holds a full prefetch window
    sc.brake(True)
    consumer = sc.consume()
    kills: list[tuple[str, int, list[int]]] = []  # (what, processed before it, pids killed)
    for k in range(5):
        target = N * (k + 1) // 7
        sc.reach(target, 60, f"{target} processed before kill {k + 1}")

        def busy(c: ClusterConsumer = consumer) -> list[int]:
            pids = sc.ledger.busy_pids()
            return sorted((p for p in c.workers() if p in pids), key=lambda p: -pids[p])

        busiest = sc.wait(busy, 30, f"a worker handling messages before kill {k + 1}")
        at = sc.processed()
        assert at < N, f"kill {k + 1}: the backlog was consumed before it landed"
        if k % 2 == 0:
            victim = busiest[0]
            os.kill(victim, signal.SIGKILL)
            kills.append(("worker", at, [victim]))
            sc.wait(
                lambda c=consumer, v=victim: v not in c.workers() and len(c.workers()) == 2,
                30,
                "the supervisor to replace the killed worker",
            )
        else:
            kills.append(("consumer", at, consumer.workers()))
            consumer.kill()
            consumer = sc.consume()
    sc.brake(False)
    sc.wait_processed(None, N, 120, "every message processed after five kills")
    sc.wait(sc.settled, 30, "work and wait queues empty")
    report = sc.finish()
    # What each victim died holding, from the ledger now that it all came back.
    held = [(what, at, *sc.ledger.left_unsettled(pids)) for what, at, pids in kills]
    report.notes.insert(
        0,
        "kill -9 of: "
        + ", ".join(
            f"{what} at {at} ({unapplied} in its handler, {applied} applied not acked)"
            for what, at, unapplied, applied in held
        ),
    )
    print(f"note: {report.notes[0]}")
    assert report.processed_once + report.processed_twice == N
    assert report.processed_twice > 0, f"no kill found a message applied but not acked: {held}"


# --- 2. restart of the consumer's node
def test_restart_of_the_consumers_node(sc: Scenario) -> None:
    sc.brake(True)
    sc.consume(first="rmqb")
    publisher = sc.publish_background(jobs(N, "good"))
    # The node the consumer is connected to, as the brokers list its connections.
    [node] = sc.wait(sc.consumer_nodes, 30, "the consumer's connections listed")
    sc.published(publisher)
    sc.wait_processed(None, N // 20, 60, "consumption under way")
    sc.cluster.stop_app(node)
    sc.phase(f"stop_app {node}")
    stopped_at = sc.processed()
    try:
        moved = sc.wait(lambda: sc.moved_off(node), 60, "the consumer to reconnect to another node")
        sc.phase("consumer moved")
        sc.brake(False)
        sc.wait_processed(None, min(N, stopped_at + N // 10), 60, "consumption to resume")
    finally:
        sc.brake(False)
        sc.start_app_later(node)
    sc.ledger.note(f"{node} stop_app at {stopped_at} processed; consumer moved to {moved}")
    assert stopped_at < N
    sc.wait_processed(None, N, 120, "every message processed")
    sc.wait(sc.settled, 30, "work and wait queues empty")
    sc.finish()


# --- 3. forced connection close
def test_forced_connection_close(sc: Scenario) -> None:
    sc.publish(jobs(N, "good"))
    sc.brake(True)  # the closes land mid-batch (Scenario.reach)
    consumer = sc.consume()
    closes = []
    for k in range(2):
        sc.reach(N * (k + 1) // 4, 60, f"consumption before close {k + 1}")
        # The management API lists a new connection after its stats interval: poll.
        sc.wait(
            lambda: sc.cluster.close_connections(sc.vhost, "rmqkit consume") > 0,
            30,
            f"forced close {k + 1} of the consumer's connections",
        )
        closes.append(sc.processed())
        assert closes[-1] < N, f"close {k + 1} landed after the backlog was consumed"
    sc.brake(False)
    sc.ledger.note(f"forced closes at {closes} processed")
    sc.wait_processed(None, N, 120, "every message processed")
    sc.wait(sc.settled, 30, "work and wait queues empty")
    output = consumer.output()
    assert "connection lost" in output and "reconnecting" in output, output[-2000:]
    assert "died" not in output  # recovered in-process, not by a supervisor restart

    # For the record: the prefetch the broker applies to the consumers now (cautious mode after
    # a reconnect is prefetch 1; tests/faults/test_consumer_faults.py checks it widens again).
    def prefetch() -> set[int]:
        rows = sc.cluster.api("GET", f"/consumers/{q(sc.vhost)}").json()
        return {int(r.get("prefetch_count", -1)) for r in rows}

    sc.ledger.note(
        f"consumer prefetch at the end (broker's view): {poll(prefetch, 15, 0.5)}; "
        f"'left cautious mode' logged: {'left cautious mode' in output}"
    )
    sc.finish()


# --- 4. the quorum leader's node stopped
def test_leader_node_stopped_during_consumption_and_during_replay(sc: Scenario) -> None:
    good = jobs(N, "good")
    parks = jobs(max(50, N // 10), "parks", permanent_until_fixed=True)
    mixed = good + parks
    random.shuffle(mixed)

    # (a) during consumption: the consumer is connected to the leader's node (its URL first).
    leader = sc.cluster.leader(sc.vhost, WORK)
    sc.brake(True)
    consumer = sc.consume(first=leader)
    publisher = sc.publish_background(mixed)
    sc.listed_on(leader)
    sc.published(publisher)
    sc.wait_processed("good", N // 20, 60, "consumption under way")
    sc.cluster.stop_app(leader)
    sc.phase(f"(a) stop_app {leader}")
    stopped_at = sc.processed()
    try:
        sc.wait(
            lambda: sc.moved_off(leader),
            60,
            "the consumer to fail over to another URL",
        )
        sc.brake(False)
        # The management API's `leader` changes once the election is over: wait for it.
        sc.wait(lambda: sc.cluster.leader(sc.vhost, WORK) != leader, 60, "a new leader elected")
        new_leader = sc.cluster.leader(sc.vhost, WORK)
        assert new_leader != leader
        sc.ledger.note(
            f"(a) leader {leader} stopped at {stopped_at} processed; consumer moved to "
            f"{sc.consumer_nodes()}, new leader {new_leader}"
        )
    finally:
        sc.brake(False)
        sc.start_app_later(leader)
    assert stopped_at < N
    sc.wait_processed("good", N, 120, "every good message processed")
    sc.wait(lambda: sc.depth(PARKING) >= len(parks), 60, "the failing ones parked")

    # (b) during a parking replay: the downstream is fixed, the parked ones go back.
    set_switch(sc.ledger.path, "fixed")
    sc.nodes_back()  # two nodes of three must stay up: wait for the first one's return
    leader = sc.cluster.leader(sc.vhost, WORK)
    other = next(s for s in NAMES if s != leader)
    sc.brake(True)
    # A consumer on the leader's node, to fail over again — before the replay starts: moving it
    # takes seconds (graceful stop, new process, listed by the management API).
    if sc.consumer_nodes() != {leader}:
        assert consumer.stop(timeout=60) == 0
        sc.consume(first=leader)
        sc.listed_on(leader)
    # About twenty seconds of replay: the stop (`rabbitmqctl stop_app`, seconds) lands in it.
    rate = max(10, len(parks) // 20)
    replay = sc.cli_background(
        "parking", "replay", PARKING, "--rate", str(rate), "--json", first=other
    )
    sc.wait_processed("parks", len(parks) // 10, 60, "the replay under way")
    sc.cluster.stop_app(leader)
    sc.phase(f"(b) stop_app {leader}")
    stopped_at = sc.processed("parks")
    # Still replaying once the node is down (or failed by the stop: rerun below).
    replaying = replay.poll() is None or replay.returncode != 0
    try:
        sc.wait(
            lambda: sc.moved_off(leader),
            60,
            "the consumer to fail over during the replay",
        )
        sc.brake(False)
        try:
            out, err = replay.communicate(timeout=120 * SCALE_TIMEOUT)
        except subprocess.TimeoutExpired:
            replay.kill()
            out, err = replay.communicate()
        sc.ledger.note(
            f"(b) leader {leader} stopped mid-replay at {stopped_at} of {len(parks)} replayed "
            f"and processed (replay via {other}): replay exit {replay.returncode} "
            f"{out.strip()} {err.strip()[-300:]}"
        )
    finally:
        sc.brake(False)
        sc.start_app_later(leader)
    assert replaying, f"{leader} stopped after the replay had finished ({stopped_at} processed)"
    sc.phase("replay done")
    if replay.returncode != 0:  # documented as safe to run again: only what is still parked
        again = sc.cli("parking", "replay", PARKING, "--json", first=other, timeout=300)
        sc.ledger.note(f"replay rerun: exit {again.returncode} {again.stdout.strip()}")
        assert again.returncode == 0, again.stderr
    sc.wait_processed(None, N + len(parks), 120, "every message processed after the replay")
    sc.wait(lambda: sc.settled() and sc.depth(PARKING) == 0, 60, "all queues empty")
    sc.finish()


# --- 5. publish during a node loss
CONFIRMED = re.compile(r"(\d+) message\(s\) were confirmed before this")


def test_publish_during_node_loss(sc: Scenario) -> None:
    """The publisher's node (the queue leader's) is killed (SIGKILL of its VM) mid-publish.
    The queue holds only ids that were sent and at least as many as were reported confirmed;
    publishing everything again (same message_ids) ends with each id processed once."""
    items = jobs(N, "good")
    leader = sc.cluster.leader(sc.vhost, WORK)
    others = [s for s in NAMES if s != leader]
    window = 1 if N <= 20_000 else 20  # slow enough for the kill to land mid-publish
    publisher = sc.publish_background(items, first=leader, window=window)
    sc.wait(
        lambda: sc.depth(WORK, via=others[0]) >= N // 10 or publisher.poll() is not None,
        60,
        "publishing under way",
    )
    assert publisher.poll() is None, "the publisher finished before the fault: slow it down"
    sc.cluster.kill_node(leader)
    sc.phase(f"kill -9 {leader}")
    try:
        try:
            out, err = publisher.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            publisher.kill()
            pytest.fail("the publisher hung after its node was lost")
        assert publisher.returncode != 0, out
        match = CONFIRMED.search(err)
        assert match, err
        confirmed = int(match.group(1))
        sc.ledger.confirmed_reported += confirmed
        # Every confirmed message is in the queue, read on a surviving node once a new leader
        # runs: until then a passive declare of a quorum queue answers 0 messages (3.10).
        sc.wait(lambda: sc.cluster.leader(sc.vhost, WORK) != leader, 60, "a new leader elected")
        held = stable(lambda: sc.depth(WORK, via=others[0]))
        sc.ledger.note(
            f"publisher via {leader} (killed): exit {publisher.returncode}, reported "
            f"{confirmed} confirmed, queue held {held} of {N} sent"
        )
        assert confirmed <= held <= N, (confirmed, held)
        sc.consume(first=others[0])
        sc.wait_processed(None, held, 60, "the held messages processed")
        sc.wait(sc.settled, 30, "the queue drained")
        # Every held id is one that was sent (the ledger counts foreign ids too).
        assert sc.processed() == held, (sc.processed(), held)
    finally:
        sc.start_app_later(leader, killed=True)
    # The publisher's advice: publish them again; duplicates carry the same message_id.
    sc.publish(items, first=others[1])
    sc.wait_processed(None, N, 120, "every id processed after the republish")
    sc.wait(sc.settled, 30, "work and wait queues empty")
    report = sc.finish()
    assert report.processed_twice == held  # the republished duplicates, absorbed


# --- 6. memory alarm
def test_memory_alarm_blocks_publishers_consumers_drain(sc: Scenario) -> None:
    before = jobs(N, "before")
    during = jobs(max(100, N // 4), "during")
    sc.brake(True)
    sc.consume(first="rmqa")
    sc.publish(before)
    sc.wait_processed("before", N // 20, 60, "consumption under way")
    sc.cluster.ctl("rmqb", "set_vm_memory_high_watermark", "0.0000001")
    try:
        sc.wait(
            lambda: sc.cluster.nodes_state().get("rmqb", {}).get("mem_alarm"),
            30,
            "the memory alarm on rmqb",
        )
        publisher = sc.publish_background(during, first="rmqc")
        sc.wait(
            lambda: any(
                c.get("state") in ("blocked", "blocking")
                for c in sc.cluster.connections(sc.vhost, "rmqkit publish")
            ),
            30,
            "the publisher's connection blocked",
        )
        at_block = sc.processed("before")
        sc.brake(False)
        # Consumers are not blocked: everything published before the alarm drains.
        sc.wait_processed("before", N, 120, "the consumer to drain during the alarm")
        assert publisher.poll() is None, "the publisher finished during the alarm"
        got_in = sc.processed("during")
        sc.ledger.note(
            f"memory alarm on rmqb: publisher via rmqc blocked at {at_block} processed; "
            f"{N - at_block} drained during the alarm; {got_in} of {len(during)} of the "
            "blocked publisher's got in before the block"
        )
        assert got_in < len(during)
    finally:
        sc.brake(False)
        sc.cluster.ctl("rmqb", "set_vm_memory_high_watermark", "0.4")
    out, err = publisher.communicate(timeout=120 * SCALE_TIMEOUT)
    assert publisher.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1])["confirmed"] == len(during)
    sc.ledger.confirmed_reported += len(during)
    sc.wait_processed(None, N + len(during), 120, "everything processed after the alarm")
    sc.wait(sc.settled, 30, "work and wait queues empty")
    sc.finish()


# --- 7. poison storm
def test_poison_storm(sc: Scenario) -> None:
    good = jobs(N, "good")
    poison = [
        Job(m, "poison", f"not json: {m}") for m in (uuid.uuid4().hex for _ in range(N // 10))
    ]
    mixed = good + poison
    random.shuffle(mixed)
    sc.consume("--processes", "2", "--prefetch", "50")
    sc.published(sc.publish_background(mixed))
    sc.wait_processed("good", N, 120, "every good message processed")
    sc.wait(lambda: sc.depth(PARKING) >= len(poison), 60, "every poison message parked")
    sc.wait(lambda: sc.settled(parked=len(poison)), 30, "work and wait queues empty")
    poison_ids = {job.message_id for job in poison}
    report = sc.finish(expect_parked={"undecodable": poison_ids})
    deliveries = sc.ledger.deliveries()
    looped = {m: n for m, n in deliveries.items() if m in poison_ids and n != 1}
    assert not looped, f"poison delivered more than once: {list(looped.items())[:10]}"
    assert sc.copies == len(poison), "a poison message parked twice"
    assert report.processed_once == N and report.parked == len(poison)

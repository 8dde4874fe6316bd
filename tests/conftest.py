"""Shared fixtures: each integration test module gets its own vhost, deleted afterwards.

Also the lanes lock: .ci/run runs two pytest runs at once, each on its own broker, and sets
RMQKIT_TEST_LANES to a directory both see. A test whose assertions measure time (retry delays,
jitter windows, exits within a grace period) or that is not vetted for running beside another
run takes the lock exclusively, so it runs while the other run is between tests, as in a run of
its own; every other test takes it shared. Unset (a run of its own), nothing is locked.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import TextIO

import pytest

from rmqkit.topology import declare_topology, load_topology
from tests import broker
from tests.consumer_harness import JOBS, ConsumerProcess

ROOT = Path(__file__).resolve().parent.parent

# Modules that may run while the other lane runs a test: checked to assert on what the broker
# or a file holds, never on how long something took. Anything else (unit tests included, and
# any module added later until it is checked and listed here) runs alone.
MAY_OVERLAP = frozenset(
    f"tests.integration.test_{name}"
    for name in [
        "alarms",  # on a node of its own (tests/integration/alarm_node.py), under its own lock
        "backlog_adversarial",
        "broker_versions",
        "browse",
        "cli_conventions",
        "codec_roundtrip",
        "confirms",
        "conflicts_and_errors",
        "consume_encrypted",
        "dedupe_scopes",
        "dedupe_scopes_adversarial",
        "dependency_contract",
        "doctor",
        "doctor_dedupe",
        "encryption_leaks",
        "encryption_shapes_adversarial",
        "export",
        "file_safety",
        "held_backlog",
        "init",
        "key_rotation",
        "newest_death",
        "no_plaintext",
        "oncall",
        "oncall_broker",  # generous waits (30-300 s), asserts on lines and exit codes
        "oncall_hints",
        "outbox",  # asserts on rows and queue contents; its one deadline is 60 s
        "outbox_commit_order",
        "parking",
        "parking_encrypted",
        "parking_operator",
        "parking_transfer",
        "plan_files",
        "publish",
        "publisher_adversarial",
        "publisher_api",
        "quickstart",
        "replay_returns",
        "replay_routing",
        "runbooks",  # documented commands' output; waits of 20-120 s
        "sensitive_model",
        "session",
        "status",
        "status_flow",
        "testing_docs",
        "topology_flow",
        "topology_resolution",
        "topology_resolution_adversarial",
        "zero_delay",
    ]
)


_HELD: list[tuple[TextIO, bool]] = []  # this run's hold of the lanes lock: (file, exclusive)


def _may_overlap(item: pytest.Item) -> bool:
    return getattr(getattr(item, "module", None), "__name__", "") in MAY_OVERLAP


def _take_lanes_lock(where: Path, exclusive: bool) -> None:
    """Shared or exclusive hold of the lanes lock. A turnstile (taken and let go before the
    lock itself) keeps shared holders from starving an exclusive one: once it waits, the
    other lane's next test waits behind it."""
    lanes = (where / "lanes.lock").open("a")
    with (where / "turnstile.lock").open("a") as gate:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(lanes, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    _HELD.append((lanes, exclusive))


def _let_go_of_lanes_lock() -> None:
    while _HELD:
        lanes, _ = _HELD.pop()
        fcntl.flock(lanes, fcntl.LOCK_UN)
        lanes.close()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    """Each test's setup, call and teardown (module fixtures included) under the lanes lock
    (RMQKIT_TEST_LANES): shared for a test that may overlap, let go after it; exclusive for any
    other, kept while the next test needs it too (a run of unit tests waits for the other
    lane once, not once per test). Outermost (tryfirst): waiting is not counted by
    pytest-timeout."""
    where = os.environ.get("RMQKIT_TEST_LANES")
    if not where:
        return (yield)
    exclusive = not _may_overlap(item)
    if _HELD and _HELD[0][1] != exclusive:
        _let_go_of_lanes_lock()
    if not _HELD:
        _take_lanes_lock(Path(where), exclusive)
    try:
        return (yield)
    finally:
        if not (exclusive and nextitem is not None and not _may_overlap(nextitem)):
            _let_go_of_lanes_lock()


# The 4.x lines CI runs besides the default node's 3.10: `pytest.mark.semantics("4.0", "4.3")` on a
# module names those it also runs on, and `--semantics-of 4.3` selects them (.ci/run).
BROKER_LINES = ("4.0", "4.3")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--semantics-of",
        metavar="VERSION",
        choices=BROKER_LINES,
        help="run only the tests marked semantics(..., VERSION, ...): those whose broker"
        " behaviour differs on that RabbitMQ line",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Check every semantics mark names known lines; with --semantics-of, keep their tests."""
    for item in items:
        for mark in item.iter_markers("semantics"):
            if not mark.args or not set(mark.args) <= set(BROKER_LINES):
                raise pytest.UsageError(
                    f"{item.nodeid}: semantics() takes the RabbitMQ lines it runs on, of"
                    f" {', '.join(BROKER_LINES)}; got {mark.args!r}"
                )
    version = config.getoption("--semantics-of")
    if not version:
        return
    kept, left = [], []
    for item in items:
        lines = {line for mark in item.iter_markers("semantics") for line in mark.args}
        (kept if version in lines else left).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept


# Below this many open files a node holding the suite's vhosts and queues stops completing AMQP
# handshakes (connections wait in file_handle_cache for minutes): 1024, the common soft limit, is
# too few.
FEW_FILES = 4096


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Say at the start, not as a handshake timeout an hour in, when the broker the integration
    tests use may have too few open files."""
    if not any("/integration/" in str(item.path) for item in session.items):
        return
    try:
        nodes = broker.api("GET", "/nodes?columns=name,fd_total").json()
    except Exception:  # no broker yet: the tests' own fixtures say so
        return
    few = [n for n in nodes if isinstance(n.get("fd_total"), int) and n["fd_total"] < FEW_FILES]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for node in few:
        line = (
            f"warning: broker node {node['name']} may open only {node['fd_total']} files; with many"
            " vhosts it stops answering handshakes. Restart it with a higher limit (systemd:"
            " LimitNOFILE=65536; otherwise `ulimit -n 65536` before rabbitmq-server)."
        )
        if reporter is not None:
            reporter.write_line(line, yellow=True)


@pytest.fixture(scope="module")
def vhost(request: pytest.FixtureRequest) -> Iterator[str]:
    """A vhost for this test module alone (tests in other modules cannot see its objects)."""
    name = broker.create_vhost(request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_"))
    yield name
    broker.delete_vhost(name)


@pytest.fixture
def fresh_vhost(request: pytest.FixtureRequest) -> Iterator[Callable[[], str]]:
    """Factory for extra empty vhosts within one test; all are deleted when it ends."""
    made: list[str] = []

    def make() -> str:
        made.append(broker.create_vhost(request.node.name[:20].replace("[", "-").strip("-]")))
        return made[-1]

    yield make
    for name in made:
        broker.delete_vhost(name)


@pytest.fixture
def orders_file() -> Path:
    return ROOT / "topologies" / "orders.toml"


@pytest.fixture
def jobs_vhost(fresh_vhost: Callable[[], str]) -> str:
    """A fresh vhost with tests/topologies/jobs.toml declared (the consumer tests' topology).

    Declared in-process, the library call `rmqkit declare` makes (test_declare.py runs the
    command itself): a CLI start costs 1-2 s, and some 60 tests across the CI runs use this."""
    vhost = fresh_vhost()
    broker.run(declare_topology(broker.settings_for(vhost), load_topology(JOBS)))
    return vhost


@pytest.fixture
def consumers() -> Iterator[list[ConsumerProcess]]:
    """Consumer processes a test starts; any still running are killed when it ends."""
    started: list[ConsumerProcess] = []
    yield started
    for consumer in started:
        consumer.kill()

"""Shared fixtures: each integration test module gets its own vhost, deleted afterwards.

Markers (pyproject.toml) say where a test may run: ``timing`` and ``own_node`` tests run alone, in
the serial tail of .ci/run; the rest run on xdist workers, beside another broker's run;
``semantics(...)`` names the 4.x lines a test also runs on (``--semantics-of``, below).
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from rmqkit.topology import declare_topology, load_topology
from tests import broker
from tests.consumer_harness import JOBS, ConsumerProcess

ROOT = Path(__file__).resolve().parent.parent

# Property tests run beside the fault suite and other brokers' lanes on a 2-core machine: how
# long an example takes to generate or run says nothing about correctness there, so neither
# Hypothesis's per-example deadline nor its "generation is slow" check applies (a test's own
# @settings still sets the rest). A generation-slow failure was seen at load 13.
settings.register_profile("rmqkit", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("rmqkit")

# The 4.x lines CI runs besides the default node's 3.10: `pytest.mark.semantics("4.0", "4.3")` on a
# module names those it also runs on, and `--semantics-of 4.3` selects them (.ci/run).
BROKER_LINES = ("4.0", "4.3")


def pytest_configure(config: pytest.Config) -> None:
    """Let the CLI processes the tests start be interrupted by SIGINT.

    A background job of a shell without job control (CI's lanes, ``cmd &`` in a script) starts
    with SIGINT ignored, and an ignored signal stays ignored across exec: every ``rmqkit`` child
    would inherit it, asyncio.run would install no Ctrl-C handler, and the tests that send SIGINT
    (status --watch, publish, parking replay) would wait for a process that never ends. Python's
    own handler here means children start with the default disposition again.
    """
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


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

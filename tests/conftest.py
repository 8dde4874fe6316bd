"""Shared fixtures: each integration test module gets its own vhost, deleted afterwards."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rmqkit.topology import declare_topology, load_topology
from tests import broker
from tests.consumer_harness import JOBS, ConsumerProcess

ROOT = Path(__file__).resolve().parent.parent


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

from __future__ import annotations

from pathlib import Path

import pytest

from rmqkit.errors import ExitCode, TopologyFileError
from rmqkit.topology.model import key_path, load_topology, parse_topology

ROOT = Path(__file__).resolve().parents[2]


def test_the_worked_example_loads() -> None:
    topology = load_topology(ROOT / "topologies" / "orders.toml")
    queue = topology.model.queues["orders.work"]
    assert queue.retry_delays == [1000, 5000, 30000, 120000]
    assert (queue.max_attempts, queue.delivery_limit, queue.max_length, queue.prefetch) == (
        5,
        10,
        100000,
        200,
    )
    assert topology.parking_name("orders.work") == "orders.work.parking"
    assert topology.model.exchanges["orders"].type == "topic"


def _error(text: str) -> TopologyFileError:
    with pytest.raises(TopologyFileError) as info:
        parse_topology(text, "t.toml")
    assert info.value.exit_code == ExitCode.DATA == 65
    return info.value


def test_malformed_toml_names_the_line() -> None:
    err = _error('[exchanges.orders]\ntype = "topic"\n[queues."orders.work"\n')
    assert err.line == 3 and str(err).startswith("t.toml:3: malformed TOML")


def test_unknown_key_names_the_key_path_and_line() -> None:
    err = _error('[exchanges.orders]\ntype = "topic"\n\n[queues."a.b"]\nretry_delay = ["1s"]\n')
    assert err.key == 'queues."a.b".retry_delay'
    assert err.line == 5
    assert "unknown key" in str(err)


def test_bad_duration() -> None:
    err = _error('[queues.w]\nretry_delays = ["1s", "5 parsecs"]\n')
    assert err.key == "queues.w.retry_delays[1]"
    assert "5 parsecs" in str(err) and err.line == 2


def test_binding_to_an_undeclared_exchange() -> None:
    err = _error('[queues.w]\nbind = [{ exchange = "nope", routing_key = "x" }]\n')
    assert err.key == "queues.w.bind[0].exchange"
    assert "nope" in str(err) and err.line == 2


def test_builtin_exchanges_need_no_declaration() -> None:
    topology = parse_topology('[queues.w]\nbind = [{ exchange = "amq.topic" }]\n', "t.toml")
    assert topology.model.queues["w"].bind[0].exchange == "amq.topic"


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[queues.w]\nretry_delays = ["1s", "1000ms"]\n', "queues.w.retry_delays"),
        ("[queues.w]\nmax_attempts = 0\n", "queues.w.max_attempts"),
        ('[exchanges.e]\ntype = "fanin"\n', "exchanges.e.type"),
        ('[queues.w]\n[queues.v]\nparking = "w"\n', "queues.v.parking"),
        (
            '[[bindings]]\nsource = "amq.direct"\ndestination = "nowhere"\n',
            "bindings[0].destination",
        ),
        ("[queues.w]\nretry_delays = [5]\n", "queues.w.retry_delays[0]"),
    ],
)
def test_invalid_files_name_the_key(text: str, key: str) -> None:
    assert _error(text).key == key


def test_missing_file() -> None:
    with pytest.raises(TopologyFileError, match="no such file"):
        load_topology("/nonexistent/x.toml")


def test_key_path_quotes_dotted_names() -> None:
    assert key_path(("queues", "orders.work", "bind", 0, "exchange")) == (
        'queues."orders.work".bind[0].exchange'
    )


def test_a_work_queue_without_retry_delays_gets_the_default_ladder() -> None:
    """Issue 15: a file that left out retry_delays parked every message on its first transient
    failure; now it retries through 1s, 10s, 1m, 5m, and `plan` says it is the default."""
    from rmqkit.topology.expand import expand, wait_queue_names
    from rmqkit.topology.schema import DEFAULT_RETRY_DELAYS_MS

    topology = parse_topology("[queues.w]\n", "t.toml")
    assert topology.model.queues["w"].retry_delays == [1_000, 10_000, 60_000, 300_000]
    assert tuple(topology.model.queues["w"].retry_delays) == DEFAULT_RETRY_DELAYS_MS
    tiers = wait_queue_names(topology, "w")
    assert [slots[-1][0] for slots in tiers] == [
        "w.wait.1s",
        "w.wait.10s",
        "w.wait.1m",
        "w.wait.5m",
    ]
    [work] = expand(topology).work_queues
    assert work.default_retries and work.text().startswith(
        "w: retries 1s, 10s, 1m, 5m (the default ladder), max_attempts 5;"
    )


def test_an_explicit_empty_retry_delays_means_no_retries() -> None:
    from rmqkit.topology.expand import expand, wait_queue_names

    topology = parse_topology("[queues.w]\nretry_delays = []\n", "t.toml")
    assert topology.model.queues["w"].retry_delays == []
    assert wait_queue_names(topology, "w") == []
    assert {q.role for q in expand(topology).queues} == {"work", "parking"}
    [work] = expand(topology).work_queues
    assert not work.default_retries and "no retries" in work.text()

"""A zero delay, however it is spelled, means no delay (docs/topology.md, docs/delay.md).

``delay = "0m"``, ``"0.0s"`` and ``"0ms"`` in a topology file declare the queues without a delay
ladder, and ``rmqkit publish --delay 0m`` publishes straight into the work queue: the message is
there at once (AMQP passive declare, immediate). Negative and garbage durations are still refused,
each with one line on stderr and nothing declared or published. The code before refused every
zero but the exact spellings ``0``/``0s``/``0ms`` (``--delay``) and every zero in a file.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import broker

pytestmark = [pytest.mark.broker, pytest.mark.semantics("4.3")]

# One work queue per zero spelling, no retry tiers (fewer queues), all bound to one exchange.
ZEROS = {"zd.m": "0m", "zd.f": "0.0s", "zd.ms": "0ms"}
QUEUES = ["zd.plain", *ZEROS]


def topology_text(delays: dict[str, str]) -> str:
    """A file with an exchange ``zd`` and a work queue per entry (``delay`` as given)."""
    lines = ['[exchanges.zd]\ntype = "direct"\n']
    for name in QUEUES:
        lines.append(
            f'[queues."{name}"]\nbind = [{{ exchange = "zd", routing_key = "{name}" }}]\n'
            "retry_delays = []\n" + (f'delay = "{delays[name]}"\n' if name in delays else "")
        )
    return "\n".join(lines)


@pytest.fixture(scope="module")
def zero_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("zero") / "zero.toml"
    path.write_text(topology_text(ZEROS))
    return path


@pytest.fixture(scope="module")
def plain(vhost: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The same queues declared from a file without delays (for ``--delay`` alone)."""
    path = tmp_path_factory.mktemp("plain") / "plain.toml"
    path.write_text(topology_text({}))
    result = broker.cli("declare", str(path), vhost=vhost)
    assert result.returncode == 0, result.stdout + result.stderr
    return vhost


@pytest.fixture(scope="module")
def declared(plain: str, zero_file: Path) -> Iterator[str]:
    result = broker.cli("declare", str(zero_file), vhost=plain)
    assert result.returncode == 0, result.stdout + result.stderr
    yield plain


def _one_line_error(result: object) -> str:
    stderr: str = result.stderr  # type: ignore[attr-defined]
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def test_a_file_with_zero_delays_declares_its_queues_without_a_delay_ladder(declared: str) -> None:
    names = broker.queue_names(declared)
    assert set(QUEUES) <= names
    # A delay would have brought in the delay ladder's rungs (rmqkit.delay.100ms.NN-…).
    assert not [n for n in names if n.startswith("rmqkit.delay")], sorted(names)
    assert not [
        x["name"]
        for x in broker.api("GET", f"/exchanges/{broker.q(declared)}").json()
        if x["name"].startswith("rmqkit.delay")
    ]


@pytest.mark.parametrize("queue", sorted(ZEROS))
def test_publish_with_the_file_lands_in_the_work_queue_at_once(
    declared: str, zero_file: Path, queue: str
) -> None:
    before = broker.depths(declared, [queue])[queue] or 0
    result = broker.cli(
        "publish", "zd", queue, "--topology", str(zero_file), "--body", "now", vhost=declared
    )
    assert result.returncode == 0, result.stderr
    assert broker.depths(declared, [queue])[queue] == before + 1


@pytest.mark.parametrize("spelled", ["0m", "0.0s", "0ms", "0s"])
def test_publish_delay_zero_lands_in_the_work_queue_at_once(plain: str, spelled: str) -> None:
    declared = plain
    before = broker.depths(declared, ["zd.plain"])["zd.plain"] or 0
    result = broker.cli(
        "publish", "zd", "zd.plain", "--delay", spelled, "--body", spelled, vhost=declared
    )
    assert result.returncode == 0, result.stderr
    assert broker.depths(declared, ["zd.plain"])["zd.plain"] == before + 1
    assert not [n for n in broker.queue_names(declared) if n.startswith("rmqkit.delay")]


@pytest.mark.parametrize(
    ("spelled", "says"), [("-5s", "must not be negative"), ("soon", "use a number with ms")]
)
def test_publish_refuses_negative_and_garbage_delays_in_one_line(
    plain: str, spelled: str, says: str
) -> None:
    declared = plain
    before = broker.depths(declared, ["zd.plain"])["zd.plain"]
    result = broker.cli(
        "publish", "zd", "zd.plain", "--delay", spelled, "--body", "x", vhost=declared
    )
    assert result.returncode == 64, result.stderr
    line = _one_line_error(result)
    assert "--delay" in line and says in line and spelled in line, line
    assert broker.depths(declared, ["zd.plain"])["zd.plain"] == before


@pytest.mark.parametrize(
    ("spelled", "says"), [("-1s", "must not be negative"), ("5 parsecs", "use a number")]
)
def test_a_file_with_a_negative_or_garbage_delay_is_refused_in_one_line(
    tmp_path: Path, spelled: str, says: str, vhost: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(topology_text({"zd.m": spelled}).replace("zd.", "zbad."))
    result = broker.cli("declare", str(path), vhost=vhost)
    assert result.returncode == 65, result.stdout + result.stderr
    line = _one_line_error(result)
    assert "delay" in line and says in line and str(path) in line, line
    assert not [n for n in broker.queue_names(vhost) if n.startswith("zbad.")]

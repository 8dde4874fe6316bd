"""The import contract: layers depend downwards only, and the AMQP client stays in the broker layer.

docs/architecture.md draws the layers: cli → health → parking → consumer → outbox / idempotency →
topology / publish / guard → broker / store / crypto, with settings, errors, headers, durations
and fileout below all of them. A module that imports from a higher layer fails here, naming the
import.

aiormq and pamqp belong to ``rmqkit/broker/`` (issue 11): a module anywhere else that imports
them fails here, naming the module (the session, channel and codec APIs of ``rmqkit.broker``
cover what the other layers need).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "rmqkit"
RANK = {
    "cli": 7,
    "health": 6,
    "parking": 5,
    "consumer": 4,
    "outbox": 3,  # the relay publishes through publish/broker and reads rows through store
    "idempotency": 3,  # the consumer records message ids through it
    "topology": 2,
    # rmqkit.publishing (rmqkit.Publisher, `rmqkit publish`'s engine) publishes through the
    # outbox's edge (lanes, delays, encryption); rmqkit/publish.py re-exports it for the CLI
    "publishing": 4,
    "publish": 4,
    "guard": 2,  # rmqkit.guard: apply_if_newer, on a store transaction
    "broker": 1,
    "store": 1,  # database connections (SQLite, PostgreSQL): beside broker, not above it
    # field-level encryption (issue 16): a pure library that publish, outbox, consumer and
    # parking call; it needs neither the broker nor a store
    "crypto": 1,
    "delay": 2,  # rmqkit.delay: the delay ladder, declared and counted through broker.session
    "testing": 8,  # rmqkit.testing: users' test helpers over the consumer, parking and topology
}
CLIENT = ("aiormq", "pamqp")


def _imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return found


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "rmqkit" and len(parts) > 1 else None


def _modules() -> list[tuple[str, Path]]:
    return [(p.relative_to(PACKAGE).as_posix(), p) for p in sorted(PACKAGE.rglob("*.py"))]


def upward_imports() -> list[str]:
    bad = []
    for name, path in _modules():
        own = name.split("/")[0].removesuffix(".py")
        if own in ("__init__", "__main__"):  # the public API and the entry point see everything
            continue
        for target in _imports(path):
            layer = _layer(target)
            if layer not in RANK:
                continue
            if own not in RANK or RANK[layer] > RANK[own]:
                bad.append(f"rmqkit/{name} imports {target}")
    return bad


def client_imports() -> set[str]:
    return {
        name
        for name, path in _modules()
        if not name.startswith("broker/") and any(t.split(".")[0] in CLIENT for t in _imports(path))
    }


def test_no_module_imports_a_higher_layer() -> None:
    assert upward_imports() == []


def test_aiormq_and_pamqp_stay_in_the_broker_layer() -> None:
    found = sorted(client_imports())
    assert found == [], f"import aiormq/pamqp through rmqkit.broker instead: {found}"

"""The import contract: layers depend downwards only, and the AMQP client stays in the broker layer.

docs/architecture.md draws the layers: cli → health → parking → consumer → outbox / idempotency →
topology / publish / guard → broker / store / crypto, with settings, errors, headers, durations
and fileout below all of them. A module that imports from a higher layer fails here, naming the
import.

The AMQP client libraries (aio_pika, aiormq, pamqp) belong to ``rmqkit/broker/``: a module
anywhere else that imports one fails here, naming the module (the session, channel and codec APIs
of ``rmqkit.broker`` cover what the other layers need). Relative imports are resolved to the
absolute module they name before either rule is applied.
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
    # rmqkit.publishing (rmqkit.Publisher, `rmqkit publish`'s engine) owns the publishing edge
    # (publishing/routing.py: lanes, delays, encryption) that the outbox's relay and add() use
    # too, so it sits beside the outbox; rmqkit/publish.py re-exports it for the CLI
    "publishing": 3,
    "publish": 3,
    "guard": 2,  # rmqkit.guard: apply_if_newer, on a store transaction
    "broker": 1,
    "store": 1,  # database connections (SQLite, PostgreSQL): beside broker, not above it
    # field-level encryption (issue 16): a pure library that publish, outbox, consumer and
    # parking call; it needs neither the broker nor a store
    "crypto": 1,
    "delay": 2,  # rmqkit.delay: the delay ladder, declared and counted through broker.session
    "deploy": 3,  # `rmqkit deploy`: manifests from a topology (reads it through a Protocol)
    "testing": 8,  # rmqkit.testing: users' test helpers over the consumer, parking and topology
}
CLIENT = ("aio_pika", "aiormq", "pamqp")


def _absolute(module: str, level: int, name: str | None, package: str) -> str:
    """The absolute module a ``from`` import names: ``from ..x import y`` in package ``a.b``
    is ``a.x`` (``from . import y`` is ``a.b.y``: the name may be a submodule)."""
    if level == 0:
        return name or ""
    base = package.split(".")
    if level > len(base):  # above the top package: Python refuses it; count it as foreign
        return name or ""
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)


def _imports(path: Path, module: str, package: str) -> list[str]:
    """Every module ``path`` (the module ``module`` in ``package``) imports, absolute,
    relative ones resolved; imports under ``if TYPE_CHECKING:`` count too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level and node.module is None:  # from . import a, b
                base = _absolute(module, node.level, None, package)
                found.extend(f"{base}.{alias.name}" for alias in node.names)
            else:
                found.append(_absolute(module, node.level, node.module, package))
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return found


def _layer(module: str, top: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == top and len(parts) > 1 else None


def _modules(root: Path) -> list[tuple[str, Path, list[str]]]:
    """(path relative to ``root``, file, its imports) for every module of the package ``root``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        name = path.relative_to(root).as_posix()
        dotted = [root.name, *name.removesuffix(".py").split("/")]
        if dotted[-1] == "__init__":
            dotted.pop()
            package = ".".join(dotted)
        else:
            package = ".".join(dotted[:-1])
        found.append((name, path, _imports(path, ".".join(dotted), package)))
    return found


def upward_imports(root: Path = PACKAGE) -> list[str]:
    """``"rmqkit/a.py imports rmqkit.b"`` for each import of a higher (or unranked) layer."""
    bad = []
    for name, _path, targets in _modules(root):
        own = name.split("/")[0].removesuffix(".py")
        if own in ("__init__", "__main__"):  # the public API and the entry point see everything
            continue
        for target in targets:
            layer = _layer(target, root.name)
            if layer not in RANK:
                continue
            if own not in RANK or RANK[layer] > RANK[own]:
                bad.append(f"{root.name}/{name} imports {target}")
    return bad


def client_imports(root: Path = PACKAGE) -> set[str]:
    """The modules outside ``broker/`` that import an AMQP client library."""
    return {
        name
        for name, _path, targets in _modules(root)
        if not name.startswith("broker/") and any(t.split(".")[0] in CLIENT for t in targets)
    }


def test_no_module_imports_a_higher_layer() -> None:
    assert upward_imports() == []


def test_the_amqp_clients_stay_in_the_broker_layer() -> None:
    found = sorted(client_imports())
    assert found == [], f"import aio_pika/aiormq/pamqp through rmqkit.broker instead: {found}"


# The checker itself, on a synthetic package: each rule must be able to fail.


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "rmqkit"
    for name, text in {"__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in {p.parent for p in root.rglob("*.py")}:
        (folder / "__init__.py").touch()
    return root


def test_the_checker_fails_on_an_aio_pika_import_outside_the_broker(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "broker/amqp.py": "import aio_pika\n",
            "consumer/message.py": "from aio_pika.abc import AbstractIncomingMessage\n",
            "topology/apply.py": "import aio_pika.abc\n",
            "consumer/logs.py": 'QUIET = ("aio_pika",)\n',  # a logger's name is no import
        },
    )
    assert sorted(client_imports(root)) == ["consumer/message.py", "topology/apply.py"]


def test_the_checker_fails_on_every_client_library(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {"a/one.py": "import aiormq\n", "a/two.py": "from pamqp import commands\n"},
    )
    assert sorted(client_imports(root)) == ["a/one.py", "a/two.py"]


def test_the_checker_fails_on_a_relative_upward_import(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "topology/plan.py": "from ..consumer.dispatch import Dispatcher\n",
            "topology/apply.py": "from . import plan\nfrom .plan import x\n",  # same layer
            "topology/__init__.py": "from .apply import y\n",
            "broker/session.py": "from .. import parking\n",
            "consumer/dispatch.py": "from ..broker.session import Session\n",  # downward
        },
    )
    assert sorted(upward_imports(root)) == [
        "rmqkit/broker/session.py imports rmqkit.parking",
        "rmqkit/topology/plan.py imports rmqkit.consumer.dispatch",
    ]


def test_the_checker_applies_the_client_rule_to_relative_imports(tmp_path: Path) -> None:
    # a relative import is resolved before the rules see it: ``from ..broker import x`` is
    # rmqkit.broker (fine), and a relative import never names a client library
    root = _package(tmp_path, {"consumer/a.py": "from ..broker import session\n"})
    assert client_imports(root) == set()
    assert upward_imports(root) == []


def test_the_checker_fails_on_an_absolute_upward_import(tmp_path: Path) -> None:
    root = _package(tmp_path, {"broker/a.py": "from rmqkit.cli.main import app\n"})
    assert upward_imports(root) == ["rmqkit/broker/a.py imports rmqkit.cli.main"]

"""The dependency contract, without a broker: the return-handling probe, the one module that
touches aiormq/pamqp internals, and pyproject.toml / constraints/lowest.txt agreeing with it.

On the old code (7cb9a46) this module fails at import: there is no ``rmqkit.broker.internals``
and no probe; ``ConfirmedPublisher`` only checked ``hasattr``, which aiormq 7.2.0 passes.
"""

from __future__ import annotations

import ast
import asyncio
import functools
import tomllib
from pathlib import Path
from typing import Any

import aiormq
import pamqp
import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from rmqkit.broker import confirms, internals
from rmqkit.errors import ConfigError, ExitCode, UnsupportedDependency

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "rmqkit"
INTERNALS = PACKAGE / "broker" / "internals.py"


# --- the behaviour check ------------------------------------------------------------------------
def test_the_probe_passes_on_the_installed_versions() -> None:
    assert confirms.probe_return_handling() is None
    confirms.check_return_handling()  # and the once-per-process check does not raise


def _bypass_the_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    """What aiormq 7.2.0 does to rmqkit: its reader never calls the instance override."""
    monkeypatch.setattr(internals, "install_return_hook", lambda channel, hook: None)
    monkeypatch.setattr(confirms, "_probe_result", [])  # forget this process's earlier result


def test_the_probe_fails_when_returns_bypass_the_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    _bypass_the_hook(monkeypatch)
    problem = confirms.probe_return_handling()
    assert problem is not None and "counted confirmed" in problem, problem


def test_a_publisher_refuses_to_exist_when_returns_bypass_the_hook(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _bypass_the_hook(monkeypatch)

    async def make() -> None:
        channel = await internals.open_probe_channel()
        try:
            confirms.ConfirmedPublisher(channel)
        finally:
            await internals.close_probe_channel(channel)

    with pytest.raises(UnsupportedDependency) as caught:
        asyncio.run(make())
    error = caught.value
    assert isinstance(error, ConfigError) and error.exit_code == ExitCode.CONFIG == 78
    text = str(error)
    assert "\n" not in text
    for name, version in internals.installed_versions().items():
        assert f"{name} {version}" in text  # what is installed ...
        assert f"'{name}{internals.SUPPORTED[name]}'" in text  # ... and what to install
    assert "lose returned messages" in text


def test_the_refusal_is_remembered_for_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    _bypass_the_hook(monkeypatch)
    for _ in range(2):
        with pytest.raises(UnsupportedDependency):
            confirms.check_return_handling()
    assert confirms._probe_result and confirms._probe_result[0] is not None


def test_the_probe_fails_when_a_return_is_not_matched(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hook that is called but reads the message wrong is a failure too, not a pass."""
    real = internals.install_return_hook

    def misreading(channel: Any, hook: internals.ReturnHook) -> None:
        async def reads_another_key(frame: Any, message: Any) -> None:
            frame.routing_key = "elsewhere"
            await hook(frame, message)

        real(channel, reads_another_key)

    monkeypatch.setattr(internals, "install_return_hook", misreading)
    assert confirms.probe_return_handling() is not None


# --- one module for the internals ---------------------------------------------------------------
CLIENTS = ("aiormq", "pamqp")
# aiormq internals without an underscore, used by ConfirmedPublisher.
INTERNAL_ATTRIBUTES = frozenset(
    {"confirmations", "write_queue", "Returning", "max_content_size", "message_id_delivery_tag"}
)


@functools.cache
def _client_private_names() -> frozenset[str]:
    """Every underscore name aiormq and pamqp define (methods, attributes, mangled names)."""
    names: set[str] = set()
    for module in (aiormq, pamqp):
        for path in Path(module.__file__ or "").parent.rglob("*.py"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    for item in ast.walk(node):
                        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and (
                            item.name.startswith("__") and not item.name.endswith("__")
                        ):
                            names.add(f"_{node.name}{item.name}")  # as Python mangles it
                name = getattr(node, "name", None) or getattr(node, "attr", None)
                if isinstance(node, ast.Name):
                    name = node.id
                if isinstance(name, str) and name.startswith("_") and not name.endswith("__"):
                    names.add(name)
    return frozenset(names)


def _own_private_names(files: list[Path]) -> set[str]:
    """Underscore names rmqkit defines itself (its own private attributes are its business)."""
    names: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
    return {name for name in names if name.startswith("_")}


def private_uses(source: str, client_private: frozenset[str], own: set[str]) -> list[str]:
    """Where ``source`` reaches into aiormq/pamqp internals (line: what)."""
    tree = ast.parse(source)
    client_aliases: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in CLIENTS:
                    client_aliases.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in CLIENTS:
            for alias in node.names:
                client_aliases.add(alias.asname or alias.name)
    found: list[str] = []
    for node in ast.walk(tree):
        where = f"line {getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in CLIENTS:
            found += [f"{where}: imports {a.name}" for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Attribute):
            chain, root = [node.attr], node.value
            while isinstance(root, ast.Attribute):
                chain.append(root.attr)
                root = root.value
            from_client = isinstance(root, ast.Name) and root.id in client_aliases
            if from_client and any(part.startswith("_") for part in chain):
                found.append(f"{where}: {'.'.join(reversed(chain))}")
            elif (node.attr in client_private and node.attr not in own) or (
                node.attr in INTERNAL_ATTRIBUTES
            ):
                found.append(f"{where}: .{node.attr}")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value in client_private
            and node.value not in own
        ):
            found.append(f"{where}: the name {node.value!r}")
    return found


def _package_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_module_but_internals_touches_aiormq_or_pamqp_internals() -> None:
    client_private = _client_private_names()
    assert {"_on_return_frame", "_read_content", "_unmarshal_header_frame"} <= client_private
    assert "_Channel__get_content_header" in client_private
    files = _package_files()
    own = _own_private_names([path for path in files if path != INTERNALS])
    offenders = {
        str(path.relative_to(ROOT)): uses
        for path in files
        if path != INTERNALS and (uses := private_uses(path.read_text(), client_private, own))
    }
    assert offenders == {}
    # ... and internals.py is where they are (the check would see them).
    assert private_uses(INTERNALS.read_text(), client_private, own)


@pytest.mark.parametrize(
    "snippet",
    [
        # the old confirms.py and pamqp_hook.py (7cb9a46), in miniature
        "async def f(channel):\n    return await channel._read_content(1, 2)\n",
        '_RETURN_HOOK = "_on_return_frame"\n',
        "import pamqp.frame\nx = pamqp.frame._unmarshal_header_frame\n",
        "from pamqp.frame import _unmarshal_header_frame\n",
        "def f(channel):\n    channel.confirmations[1] = None\n",
        "def f(channel):\n    return channel.write_queue\n",
    ],
)
def test_the_check_sees_private_uses(snippet: str) -> None:
    assert private_uses(snippet, _client_private_names(), set())


def test_nothing_publishes_around_the_confirmed_publisher() -> None:
    """basic_publish matches returns by message_id; every publish goes through the probe."""
    for path in _package_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                assert node.func.attr != "basic_publish", f"{path}:{node.lineno}"


# --- the declared ranges ------------------------------------------------------------------------
def _dependencies() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {(r := Requirement(line)).name: r for line in project["dependencies"]}


def test_pyproject_declares_the_supported_ranges() -> None:
    dependencies = _dependencies()
    for name, wanted in internals.SUPPORTED.items():
        assert name in dependencies, f"pyproject.toml does not declare {name}"
        assert str(dependencies[name].specifier) == str(Requirement(name + wanted).specifier)


def test_the_lowest_constraints_are_the_declared_floors() -> None:
    pins: dict[str, str] = {}
    for line in (ROOT / "constraints" / "lowest.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[name] = version
    floors = {}
    for name, requirement in _dependencies().items():
        (floor,) = [s.version for s in requirement.specifier if s.operator == ">="]
        floors[name] = Version(floor)
    assert {name: Version(version) for name, version in pins.items()} == floors
    # the installed versions are inside the declared ranges
    for name, version in internals.installed_versions().items():
        assert _dependencies()[name].specifier.contains(version), (name, version)

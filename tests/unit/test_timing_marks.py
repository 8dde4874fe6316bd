"""Every test that asserts on measured time carries ``@pytest.mark.timing``.

Tests without the mark run in parallel (pytest-xdist) and beside another broker's run, where a
bound on elapsed time fails under load; marked ones run in the serial tail, alone. The check is
syntactic: an ``assert`` whose comparison (<, <=, >, >=) involves a clock reading
(``time.monotonic()``, ``perf_counter()``, ``time.time()``, ``loop.time()``) or a name assigned
from one, directly or through other such names. A comparison with a name containing
``deadline`` is a liveness bound (give up waiting after N seconds), like ``wait_until``'s
timeout, and is not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
CLOCKS = frozenset({"monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns", "time"})
ORDERING = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
Function = ast.FunctionDef | ast.AsyncFunctionDef


def _reads_a_clock(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in CLOCKS
    )


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _timed(node: ast.AST, timed: set[str]) -> bool:
    return any(_reads_a_clock(n) for n in ast.walk(node)) or bool(_names(node) & timed)


def _timed_names(function: Function) -> set[str]:
    """Names assigned (anywhere in the function) from a clock reading or another timed name."""
    timed: set[str] = set()
    grew = True
    while grew:
        grew = False
        for node in ast.walk(function):
            if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign) and node.value:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if _timed(node.value, timed):
                    new = set().union(*(_names(t) for t in targets)) - timed
                    timed |= new
                    grew = grew or bool(new)
    return timed


def time_assertions(function: Function) -> list[int]:
    """Line numbers of the asserts in ``function`` that bound a measured time."""
    timed = _timed_names(function)
    lines = []
    for node in ast.walk(function):
        if not isinstance(node, ast.Assert):
            continue
        for compare in ast.walk(node.test):
            if not isinstance(compare, ast.Compare):
                continue
            if not any(isinstance(op, ORDERING) for op in compare.ops):
                continue
            sides = [compare.left, *compare.comparators]
            if any("deadline" in name.lower() for side in sides for name in _names(side)):
                continue
            if any(_timed(side, timed) for side in sides):
                lines.append(node.lineno)
                break
    return lines


def _is_timing_mark(node: ast.AST) -> bool:
    target = node.func if isinstance(node, ast.Call) else node
    return isinstance(target, ast.Attribute) and target.attr == "timing"


def _module_marked(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            return any(_is_timing_mark(n) for n in ast.walk(node.value))
    return False


def unmarked(source: str) -> list[str]:
    """``name:line`` of each test function in ``source`` that asserts time unmarked."""
    tree = ast.parse(source)
    if _module_marked(tree):
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, Function) and node.name.startswith("test"):
            if any(_is_timing_mark(d) for d in node.decorator_list):
                continue
            found += [f"{node.name}:{line}" for line in time_assertions(node)]
    return found


def test_every_test_that_asserts_time_is_marked_timing() -> None:
    offenders = [
        f"{path.relative_to(TESTS.parent)}::{where}"
        for path in sorted(TESTS.rglob("test_*.py"))
        for where in unmarked(path.read_text())
    ]
    assert not offenders, "add @pytest.mark.timing to: " + ", ".join(offenders)


@pytest.mark.parametrize(
    "body",
    [
        "started = time.monotonic()\n    run()\n    assert time.monotonic() - started < 5",
        "t0 = time.perf_counter()\n    run()\n    took = time.perf_counter() - t0\n"
        "    assert took <= 2.0, took",
        "started = loop.time()\n    elapsed = loop.time() - started\n    gap = elapsed * 2\n"
        "    assert 0.8 <= gap",
    ],
)
def test_the_check_finds_a_bound_on_elapsed_time(body: str) -> None:
    source = f"import time\n\ndef test_x():\n    {body}\n"
    assert unmarked(source) == [f"test_x:{len(source.splitlines())}"]
    marked = source.replace("def test_x", "@pytest.mark.timing\ndef test_x")
    assert unmarked(marked) == []
    module_marked = "pytestmark = [pytest.mark.broker, pytest.mark.timing]\n" + source
    assert unmarked(module_marked) == []


@pytest.mark.parametrize(
    "body",
    [
        "deadline = time.monotonic() + 30\n    while time.monotonic() < deadline:\n"
        "        assert time.monotonic() < deadline, 'gave up'",
        "assert wait_until(lambda: depth() == 0, timeout_s=30)",
        "started = time.monotonic()\n    assert started == started",
        "assert len(items) < 5",
    ],
)
def test_the_check_leaves_liveness_bounds_and_counts_alone(body: str) -> None:
    assert unmarked(f"import time\n\ndef test_x():\n    {body}\n") == []

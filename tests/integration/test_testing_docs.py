"""docs/testing.md's complete example, run as written: every code block that starts with a
``# file: PATH`` line is written to a directory of its own and pytest runs the suite there
(its unit tests with run_handler, its integration test with the rmqkit_broker fixture against
the broker under test)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests import broker

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "testing.md"
BLOCK = re.compile(r"^```(?:python|toml)\n# file: (\S+)\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def example_files() -> dict[str, str]:
    return {path: body for path, body in BLOCK.findall(DOC.read_text(encoding="utf-8"))}


def test_the_documented_example_suite_passes(tmp_path: Path) -> None:
    files = example_files()
    assert {"shop/handlers.py", "tests/test_handlers_unit.py"} <= set(files)
    assert "tests/test_handlers_integration.py" in files
    for path, body in files.items():
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(body, encoding="utf-8")
    before = _fixture_vhosts()
    env = broker.cli_env()  # RMQKIT_URL / RMQKIT_MANAGEMENT_URL: the broker under test
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert re.search(r"\b7 passed\b", result.stdout), result.stdout[-2000:]
    assert _fixture_vhosts() <= before  # the example's vhost went with its test


def _fixture_vhosts() -> set[str]:
    names = {str(v["name"]) for v in broker.api("GET", "/vhosts").json()}
    return {name for name in names if name.startswith("rmqkit-pytest-")}


def test_every_documented_block_is_run() -> None:
    text = DOC.read_text(encoding="utf-8")
    example = text[text.index("## A complete example") :]
    opened = example.count("```python") + example.count("```toml")
    assert opened == len(example_files())

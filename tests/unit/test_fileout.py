"""rmqkit.fileout: no silent overwrite, no half file under the asked name, durable means durable.

The audit of every place that acks after writing elsewhere is tests/unit/test_ack_audit.py."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rmqkit.errors import UsageError
from rmqkit.fileout import OutputError, OutputMode, SafeOutput, output_mode, write_file

ROOT = Path(__file__).resolve().parents[2]


def test_an_existing_file_is_refused_unless_forced_or_appended(tmp_path: Path) -> None:
    path = tmp_path / "out.txt"
    write_file(path, "one\n")
    with pytest.raises(UsageError, match="--force"):
        write_file(path, "two\n")
    assert path.read_text() == "one\n"
    write_file(path, "two\n", OutputMode.APPEND)
    assert path.read_text() == "one\ntwo\n"
    write_file(path, "three\n", OutputMode.FORCE)
    assert path.read_text() == "three\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]
    with pytest.raises(UsageError):
        output_mode(force=True, append=True)


def test_an_error_leaves_no_file_and_an_earlier_one_untouched(tmp_path: Path) -> None:
    path = tmp_path / "out.txt"
    with pytest.raises(RuntimeError), SafeOutput(path) as out:
        out.write("half\n")
        raise RuntimeError("the export failed")
    assert list(tmp_path.iterdir()) == []
    path.write_text("earlier\n")
    with pytest.raises(RuntimeError), SafeOutput(path, OutputMode.FORCE) as out:
        out.write("half\n")
        raise RuntimeError("the export failed")
    assert path.read_text() == "earlier\n" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_published_lines_survive_a_later_error(tmp_path: Path) -> None:
    path = tmp_path / "out.txt"
    out = SafeOutput(path).open()
    out.write("durable\n")
    out.sync(publish=True)
    assert path.read_text() == "durable\n"  # in place before anything acts on it
    out.write("not yet synced\n")
    out.abandon()
    assert path.read_text() == "durable\n"


def test_appending_to_a_cut_line_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "out.txt"
    path.write_text("complete\ncut")
    with pytest.raises(OutputError, match="incomplete line"):
        write_file(path, "more\n", OutputMode.APPEND)
    assert path.read_text() == "complete\ncut"


def test_a_file_size_limit_is_an_output_error_and_keeps_only_durable_lines(
    tmp_path: Path,
) -> None:
    path = tmp_path / "out.txt"
    script = textwrap.dedent(
        f"""
        import resource
        from pathlib import Path
        from rmqkit.fileout import OutputError, SafeOutput
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
        out = SafeOutput(Path({str(path)!r})).open()
        out.write("a" * 99 + "\\n")
        out.sync(publish=True)
        try:
            out.write("b" * 2000 + "\\n")
            out.sync(publish=True)
        except OutputError as exc:
            print(exc.exit_code, exc)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert result.stdout.startswith("74 writing"), result.stdout + result.stderr
    assert path.read_text() == "a" * 99 + "\n"

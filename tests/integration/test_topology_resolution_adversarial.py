"""What an on-call engineer or an attacker can put where `rmqkit consume` looks for its topology,
and where `rmqkit init` writes: broken files, ambiguous ones, files outside the project, symlink
loops and dangling symlinks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rmqkit.topology import declare_topology, parse_topology
from tests import broker
from tests.integration.test_topology_resolution import topology_text

ROOT = Path(__file__).resolve().parents[2]


def consume(vhost: str, cwd: Path, queue: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`rmqkit consume` from ``cwd`` that is expected to refuse at start."""
    full = broker.cli_env(vhost)
    full["PYTHONPATH"] = str(ROOT)
    full.update(env)
    return subprocess.run(
        [sys.executable, "-m", "rmqkit", "consume", "tests.handlers:handle", "-q", queue],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def one_line(out: subprocess.CompletedProcess[str]) -> str:
    line = out.stderr.strip()
    assert "\n" not in line, out.stderr
    return line


def test_a_broken_file_in_topologies_names_file_and_line(vhost: str, tmp_path: Path) -> None:
    (tmp_path / "topologies").mkdir()
    (tmp_path / "topologies" / "bad.toml").write_text('[queues."a.work"]\nmax_attempts = = 3\n')
    out = consume(vhost, tmp_path, "a.work")
    assert out.returncode == 65, out.stderr
    assert "topologies/bad.toml:2" in one_line(out)
    # a key that does not validate: named as file:line too
    (tmp_path / "topologies" / "bad.toml").write_text('[queues."a.work"]\nmax_atempts = 3\n')
    out = consume(vhost, tmp_path, "a.work")
    assert out.returncode == 65 and "topologies/bad.toml:2" in one_line(out), out.stderr


def test_two_files_declaring_the_queue_are_refused_naming_both(vhost: str, tmp_path: Path) -> None:
    (tmp_path / "topologies").mkdir()
    (tmp_path / "topologies" / "a.toml").write_text(topology_text("dup"))
    (tmp_path / "topologies" / "b.toml").write_text(topology_text("dup"))
    out = consume(vhost, tmp_path, "dup.work")
    line = one_line(out)
    assert out.returncode == 78 and "a.toml" in line and "b.toml" in line, out.stderr
    # one file and a symlink to it are one file, not two
    (tmp_path / "topologies" / "b.toml").unlink()
    (tmp_path / "topologies" / "b.toml").symlink_to("a.toml")
    out = consume(vhost, tmp_path, "dup.work")
    assert "several topology files" not in out.stderr, out.stderr


def test_rmqkit_topology_missing_or_not_declaring_the_queue(vhost: str, tmp_path: Path) -> None:
    out = consume(vhost, tmp_path, "e.work", RMQKIT_TOPOLOGY=str(tmp_path / "nope.toml"))
    assert out.returncode == 78 and "RMQKIT_TOPOLOGY" in one_line(out), out.stderr
    other = tmp_path / "other.toml"
    other.write_text(topology_text("other"))
    out = consume(vhost, tmp_path, "e.work", RMQKIT_TOPOLOGY=str(other))
    line = one_line(out)
    assert out.returncode == 78 and "does not declare queue 'e.work'" in line, out.stderr
    # an environment variable wins over a topologies/ file that would have matched
    (tmp_path / "topologies").mkdir()
    (tmp_path / "topologies" / "e.toml").write_text(topology_text("e"))
    assert consume(vhost, tmp_path, "e.work", RMQKIT_TOPOLOGY=str(other)).returncode == 78


def test_project_file_naming_a_file_outside_the_project(vhost: str, tmp_path: Path) -> None:
    (tmp_path / "outside.toml").write_text(topology_text("out"))
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "rmqkit.toml").write_text('topologies = ["../outside.toml"]\n')
    out = consume(vhost, proj, "out.work")
    assert out.returncode == 78 and "outside the project" in one_line(out), out.stderr
    # the same through a symlink inside the project, and an absolute path
    (proj / "inside.toml").symlink_to(tmp_path / "outside.toml")
    (proj / "rmqkit.toml").write_text('topologies = ["inside.toml"]\n')
    out = consume(vhost, proj, "out.work")
    assert out.returncode == 78 and "outside the project" in one_line(out), out.stderr
    (proj / "rmqkit.toml").write_text(f'topologies = ["{tmp_path / "outside.toml"}"]\n')
    assert consume(vhost, proj, "out.work").returncode == 78
    (proj / "rmqkit.toml").write_text("topologies = 3\n")
    assert consume(vhost, proj, "out.work").returncode == 78


def test_symlink_loops(vhost: str, tmp_path: Path) -> None:
    text = topology_text("loop")
    broker.run(declare_topology(broker.settings_for(vhost), parse_topology(text, "loop")))
    (tmp_path / "topologies").mkdir()
    (tmp_path / "topologies" / "x.toml").symlink_to("y.toml")
    (tmp_path / "topologies" / "y.toml").symlink_to("x.toml")
    out = consume(vhost, tmp_path, "loop.work")
    assert out.returncode == 65 and "x.toml" in one_line(out), out.stderr
    # the topologies directory itself a loop: nothing is found there, and the wired queue is
    # refused for want of a file rather than run on defaults
    loopy = tmp_path / "loopy"
    loopy.mkdir()
    (loopy / "topologies").symlink_to("topologies")
    out = consume(vhost, loopy, "loop.work")
    assert out.returncode == 78 and "none was found" in one_line(out), out.stderr
    (loopy / "rmqkit.toml").write_text('topologies = ["topologies/x.toml"]\n')
    out = consume(vhost, loopy, "loop.work")
    assert out.returncode == 78 and "symlink loop" in one_line(out), out.stderr


def test_init_never_follows_a_dangling_symlink(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere" / "planted.py"
    (tmp_path / "elsewhere").mkdir()
    app = tmp_path / "app"
    app.mkdir()
    (app / "shop_handlers.py").symlink_to(target)
    run = [sys.executable, "-m", "rmqkit", "init", "--name", "shop"]
    out = subprocess.run(run, cwd=app, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 64 and "shop_handlers.py" in one_line(out), out.stderr
    assert not target.exists() and sorted(os.listdir(app)) == ["shop_handlers.py"]
    # a topologies directory that is a symlink elsewhere: refused too, nothing written there
    (app / "shop_handlers.py").unlink()
    (app / "topologies").symlink_to(tmp_path / "elsewhere")
    out = subprocess.run(run, cwd=app, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 64 and "topologies" in one_line(out), out.stderr
    assert os.listdir(tmp_path / "elsewhere") == [] and sorted(os.listdir(app)) == ["topologies"]
    # a name that is not a module name is a usage error, before anything is written
    (app / "topologies").unlink()
    bad = [sys.executable, "-m", "rmqkit", "init", "--name", "../x"]
    out = subprocess.run(bad, cwd=app, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 64 and os.listdir(app) == [], out.stderr

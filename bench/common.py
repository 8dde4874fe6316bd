"""Helpers shared by the benchmark scripts (``bench/consume_throughput.py``,
``bench/parking_bench.py``, ``bench/publish_bench.py``): a throwaway vhost through the management
API, `rmqkit declare`, queue depths, worker subprocesses, what else is using the shared machine,
py-spy summaries, the facts (machine, broker, library versions, code) a report records, and
writing or re-summarizing a report.

Nothing here imports rmqkit, aio-pika or httpx at module level: worker processes import their
benchmark module (and so this one), and a raw contender must not pay for rmqkit's imports.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
BASE_URL = os.environ.get("RMQKIT_BENCH_URL", "amqp://guest:guest@127.0.0.1:5672/")
MGMT_URL = os.environ.get("RMQKIT_BENCH_MANAGEMENT_URL", "http://127.0.0.1:15672")
MGMT_AUTH = ("guest", "guest")
_TICK = os.sysconf("SC_CLK_TCK")


# --- broker: vhost, topology, depths ------------------------------------------------------------


def with_vhost(url: str, vhost: str) -> str:
    """``url`` pointed at ``vhost`` (as rmqkit.settings.with_vhost, without importing rmqkit)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + quote(vhost, safe=""), "", ""))


def api(method: str, path: str, **kwargs: Any) -> Any:
    """One management API call (``path`` after ``/api``); the decoded JSON or None."""
    import httpx

    response = httpx.request(method, MGMT_URL + "/api" + path, auth=MGMT_AUTH, timeout=30, **kwargs)
    response.raise_for_status()
    return response.json() if response.content else None


def create_vhost(prefix: str) -> tuple[str, str]:
    """A new vhost ``<prefix>-<random>`` with full permissions for guest; (vhost, its URL)."""
    vhost = f"{prefix}-{uuid.uuid4().hex[:6]}"
    path = quote(vhost, safe="")
    api("PUT", f"/vhosts/{path}", json={})
    try:
        perms = {"configure": ".*", "write": ".*", "read": ".*"}
        api("PUT", f"/permissions/{path}/guest", json=perms)
    except BaseException:
        delete_vhost(vhost)
        raise
    return vhost, with_vhost(BASE_URL, vhost)


def delete_vhost(vhost: str, attempts: int = 60) -> None:
    for _ in range(attempts):  # the broker may be restarting (a fault test elsewhere)
        try:
            api("DELETE", f"/vhosts/{quote(vhost, safe='')}")
            return
        except Exception:
            time.sleep(3)
    print(f"could not delete vhost {vhost!r}: delete it by hand", file=sys.stderr)


def cli_env(url: str) -> dict[str, str]:
    """The environment for an ``rmqkit`` subprocess: no RMQKIT_* of ours, RMQKIT_URL = url."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RMQKIT_")}
    env["RMQKIT_URL"] = url
    env["RMQKIT_MANAGEMENT_URL"] = MGMT_URL  # the node of RMQKIT_BENCH_URL, not :15672's
    return env


def rmqkit_exe() -> str:
    exe = Path(sys.executable).with_name("rmqkit")
    return str(exe) if exe.exists() else "rmqkit"


def declare(topology: Path, url: str) -> None:
    """``rmqkit declare TOPOLOGY`` into the vhost of ``url``."""
    subprocess.run(
        [rmqkit_exe(), "declare", str(topology)],
        cwd=ROOT,
        env=cli_env(url),
        check=True,
        stdout=subprocess.DEVNULL,
    )


async def depths(url: str, names: list[str]) -> dict[str, int]:
    """Ready messages per queue (passive declares)."""
    import aiormq

    conn = await aiormq.connect(url)
    try:
        channel = await conn.channel()
        found = {}
        for name in names:
            ok = await channel.queue_declare(name, passive=True)
            found[name] = int(ok.message_count or 0)
        return found
    finally:
        await conn.close()


async def wait_depths(
    url: str,
    expected: dict[str, int],
    timeout_s: float = 30.0,
    stable_s: float | None = 3.0,
    watch_s: float = 0.0,
) -> dict[str, int]:
    """Poll the depths (passive declares) until they are ``expected`` (then ``watch_s`` longer,
    for late changes), or ``timeout_s`` passed, or (unless None) they have not changed for
    ``stable_s``; the last ones. Acks and returns reach a quorum queue asynchronously, returns
    sometimes many seconds later and all at once."""
    import aiormq

    conn = await aiormq.connect(url)
    try:
        channel = await conn.channel()
        now = time.monotonic()
        until, last, changed, reached = now + timeout_s, None, now, False
        while True:
            counts = {}
            for name in expected:
                ok = await channel.queue_declare(name, passive=True)
                counts[name] = int(ok.message_count or 0)
            now = time.monotonic()
            if counts != last:
                last, changed = counts, now
            if counts == expected and not reached:
                reached, until = True, min(until, now + watch_s)
            if (counts == expected and now >= until) or now > until:
                return counts
            if stable_s is not None and not reached and now - changed > stable_s:
                return counts
            await asyncio.sleep(0.1)
    finally:
        await conn.close()


def wait_for_broker(url: str, max_wait_s: float = 180.0) -> None:
    """After a failure: until the management API and AMQP answer again (someone else may have
    restarted the broker), then a few seconds for the quorum queues to elect their leaders."""
    import aiormq

    async def probe() -> None:
        conn = await aiormq.connect(url)
        await conn.close()

    deadline = time.monotonic() + max_wait_s
    while time.monotonic() < deadline:
        try:
            api("GET", "/overview")
            asyncio.run(probe())
            time.sleep(3)
            return
        except Exception:
            time.sleep(2)
    raise RuntimeError("the broker did not come back")


# --- subprocesses -------------------------------------------------------------------------------


def rss_kb() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def children_cpu() -> float:
    """CPU seconds (user + system) of the reaped children of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def py_spy(cmd: list[str], out: Path, rate: int = 250) -> list[str]:
    """``cmd`` run under ``py-spy record`` writing collapsed stacks to ``out``."""
    spy = Path(sys.executable).with_name("py-spy")
    if not spy.exists():
        raise SystemExit("py-spy is not installed: .venv/bin/pip install -e '.[bench]'")
    return [str(spy), "record", "--rate", str(rate), "--format", "raw", "-o", str(out), "--", *cmd]


def worker_cmd(launch: list[str], contender: str, vhost: str, n: int) -> list[str]:
    """The command line of a benchmark's worker process: ``launch`` (how to start the script,
    without the interpreter) with the worker options every benchmark takes."""
    return [sys.executable, *launch, "--worker", contender, "--vhost", vhost, "--messages", str(n)]


def run_profiled(coro: Coroutine[Any, Any, dict[str, Any]], cprofile: str | None) -> dict[str, Any]:
    """In a worker: ``asyncio.run(coro)``, under cProfile (stats dumped to ``cprofile``) if
    given."""
    if not cprofile:
        return asyncio.run(coro)
    import cProfile

    with cProfile.Profile() as profile:
        result = asyncio.run(coro)
    profile.dump_stats(cprofile)
    return result


def run_timed(
    cmd: list[str], **kwargs: Any
) -> tuple[subprocess.CompletedProcess[Any], float, float]:
    """``subprocess.run(cmd, **kwargs)`` timed: the process, its wall seconds, and its CPU
    seconds (user + system, from RUSAGE_CHILDREN)."""
    cpu_before = children_cpu()
    started = time.perf_counter()
    proc = subprocess.run(cmd, **kwargs)
    return proc, time.perf_counter() - started, children_cpu() - cpu_before


def run_json_worker(
    cmd: list[str], log_path: Path, timeout_s: float, name: str, *, tree: Path | None = None
) -> dict[str, Any]:
    """Run worker ``name`` that prints one JSON line last on stdout (stderr to ``log_path``);
    that line, decoded. ``tree``: run it from that checkout instead (its code first on the
    path), e.g. the code before a change."""
    env = None
    if tree is not None:
        env = {**os.environ, "PYTHONPATH": str(tree)}
    with log_path.open("w") as log:
        proc = subprocess.run(
            cmd,
            cwd=tree or ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            timeout=timeout_s,
        )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = log_path.read_text()[-2000:]
        raise RuntimeError(f"{name} worker failed (exit {proc.returncode}):\n{tail}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def rmqkit_startup(url: str, times: int = 3) -> dict[str, float]:
    """``rmqkit --version``: interpreter start-up and the CLI's imports; medians of wall and
    CPU seconds over ``times`` runs."""
    walls, cpus = [], []
    for _ in range(times):
        _, wall, cpu = run_timed(
            [rmqkit_exe(), "--version"], env=cli_env(url), check=True, stdout=subprocess.DEVNULL
        )
        walls.append(wall)
        cpus.append(cpu)
    return {"seconds": statistics.median(walls), "cpu_seconds": statistics.median(cpus)}


# --- a shared machine: what else is using the CPUs ---------------------------------------------


def system_busy_s() -> float:
    """CPU seconds spent on all CPUs, not idle, since boot (/proc/stat)."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:9]]
    return (sum(values) - values[3] - values[4]) / _TICK  # minus idle and iowait


def broker_pids() -> list[int]:
    """The OS pids of the broker's nodes (management API), else every local beam.smp."""
    with contextlib.suppress(Exception):
        found = [int(n["os_pid"]) for n in api("GET", "/nodes") if n.get("os_pid")]
        if found and all(Path(f"/proc/{pid}").exists() for pid in found):
            return found
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/comm") as comm:
                if comm.read().strip() == "beam.smp":
                    pids.append(int(entry))
    return pids


def cpu_of(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime
    return total


class CpuWatch:
    """Around one run: CPU used by this process's children (the contender), the broker, and
    everyone else. ``foreign_share`` is the others' CPU over the machine's capacity during the
    run: on a shared machine, a run with a high share was slowed down by someone else."""

    def __init__(self) -> None:
        self.broker = broker_pids()  # [] if the broker is not on this machine
        self.seconds = 0.0
        self.broker_cpu_s = 0.0
        self.children_cpu_s = 0.0
        self.foreign_share = 0.0

    def __enter__(self) -> CpuWatch:
        self._t = time.perf_counter()
        self._busy = system_busy_s()
        self._broker = cpu_of(self.broker)
        self._self = resource.getrusage(resource.RUSAGE_SELF)
        self._children = children_cpu()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._t
        busy = system_busy_s() - self._busy
        me = resource.getrusage(resource.RUSAGE_SELF)
        own = (me.ru_utime + me.ru_stime) - (self._self.ru_utime + self._self.ru_stime)
        self.children_cpu_s = children_cpu() - self._children
        self.broker_cpu_s = cpu_of(self.broker) - self._broker
        foreign = max(0.0, busy - own - self.children_cpu_s - self.broker_cpu_s)
        self.foreign_share = foreign / (self.seconds * (os.cpu_count() or 1))


def wait_quiet(max_wait_s: float, busy_below: float = 0.15) -> float:
    """Wait (up to ``max_wait_s``) for a second with the CPUs mostly idle; seconds waited."""
    started = time.monotonic()
    cpus = os.cpu_count() or 1
    while True:
        before = system_busy_s()
        time.sleep(1.0)
        if (system_busy_s() - before) / cpus < busy_below:
            break
        if time.monotonic() - started > max_wait_s:
            print(f"  (machine still busy after {max_wait_s:.0f}s: running anyway)", flush=True)
            break
    return time.monotonic() - started - 1.0


# --- py-spy collapsed stacks --------------------------------------------------------------------


def short_frame(frame: str) -> str:
    """``"f (/x/site-packages/pkg/mod.py:12)"`` → ``"f (pkg/mod.py)"``: one entry per function."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("site-packages/", str(ROOT) + "/"):
        if marker in where:
            where = where.split(marker, 1)[1]
    return f"{name} ({where})"


def profile_top(path: Path, limit: int = 18, ours: str = "rmqkit/", loop_only: bool = False) -> str:
    """The hottest functions of a py-spy collapsed-stack file, by self share, and the frames
    under ``ours`` by inclusive share; samples inside imports are counted apart, and so are,
    with ``loop_only``, those outside the event loop (a worker's start-up and shutdown)."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = imports = outside = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        raw = stack.split(";")
        if any("_find_and_load" in f for f in raw):
            imports += count
            continue
        if loop_only and not any("._run_once (" in f for f in raw):
            outside += count
            continue
        frames = [short_frame(f) for f in raw]
        total += count
        own[frames[-1]] = own.get(frames[-1], 0) + count
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + count
    if not total:
        return f"{path}: no samples"
    if loop_only:
        head = (
            f"{path.name}: {total} samples in the event loop outside imports "
            f"({imports} more in imports, {outside} more outside the loop)"
        )
    else:
        head = f"{path.name}: {total} samples outside imports ({imports} more in imports)"
    lines = [head, "  self%  function"]
    for frame, count in sorted(own.items(), key=lambda kv: -kv[1])[:limit]:
        lines.append(f"  {100 * count / total:5.1f}  {frame}")
    lines.append(f"  incl%  function ({ours} frames)")
    mine = [(f, c) for f, c in inclusive.items() if f.split(" (", 1)[-1].startswith(ours)]
    for frame, count in sorted(mine, key=lambda kv: -kv[1])[:limit]:
        lines.append(f"  {100 * count / total:5.1f}  {frame}")
    return "\n".join(lines)


def print_profiles(log_dir: Path, limit: int = 18, loop_only: bool = False) -> None:
    """The summary (``profile_top``) of every py-spy profile in ``log_dir``."""
    for collapsed in sorted(log_dir.glob("*.collapsed.txt")):
        print()
        print(profile_top(collapsed, limit=limit, loop_only=loop_only))


# --- facts for the report -----------------------------------------------------------------------


def cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def machine_facts(load_before: tuple[float, float, float]) -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        # the broker shares these CPUs; anything else running skews the numbers
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }


def broker_facts() -> dict[str, Any]:
    overview = api("GET", "/overview")
    return {"rabbitmq": overview.get("rabbitmq_version"), "erlang": overview.get("erlang_version")}


def versions(names: tuple[str, ...] = ("rmqkit", "aio-pika", "aiormq", "pamqp")) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in names:
        with contextlib.suppress(PackageNotFoundError):
            found[name] = version(name)
    return found


def code_state(paths: tuple[str, ...] = ("rmqkit",)) -> dict[str, Any]:
    """The commit checked out and the files under ``paths`` that differ from it: the working
    tree is shared, and a benchmark measures what is on disk, not what is committed."""

    def git(*args: str) -> str:
        proc = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return proc.stdout if proc.returncode == 0 else ""

    dirty = git("status", "--porcelain", "--", *paths)
    return {
        "commit": git("rev-parse", "--short", "HEAD").strip() or None,
        "modified": [line[3:] for line in dirty.splitlines() if line.strip()],
    }


def command_line(module: str) -> str:
    """How this benchmark was started, as ``python -m MODULE ARGS`` (the report's "command")."""
    return " ".join([Path(sys.executable).name, "-m", module, *sys.argv[1:]])


# --- the report ---------------------------------------------------------------------------------


def write_report(report: dict[str, Any], dest: str | None) -> None:
    """The report as indented JSON to ``dest`` (``-``: stdout; None: nowhere)."""
    if dest == "-":
        print(json.dumps(report, indent=2))
    elif dest:
        Path(dest).write_text(json.dumps(report, indent=2) + "\n")
        print(f"JSON written to {dest}")


def resummarize(
    path: str,
    dest: str | None,
    summarize: Callable[[list[dict[str, Any]]], dict[str, Any]],
    invalid: Callable[[dict[str, Any]], str | None],
    table: Callable[[dict[str, Any]], str],
) -> int:
    """``--summarize REPORT``: recompute the summary of a saved report and each sample's
    ``invalid``, print the table; with ``dest``, write the report back there."""
    report = json.loads(Path(path).read_text())
    report["summary"] = summarize(report["samples"])
    for sample in report["samples"]:
        sample["invalid"] = invalid(sample)
    print(table(report["summary"]))
    if dest:
        Path(dest).write_text(json.dumps(report, indent=2) + "\n")
    return 0

"""A 3-node RabbitMQ cluster of the fault suite's own: rmqa, rmqb, rmqc @ this host.

Never touches the default node (rabbit@…, AMQP 5672, distribution 25672) that other tests and CI
share: the nodes here have their own names, ports, data directories, config file and plugins file
(../shared/rabbitmq-facts.md, "Starting brokers locally"):

    node   AMQP   distribution  management
    rmqa   5681   25681         15681
    rmqb   5682   25682         15682
    rmqc   5683   25683         15683

Each node gets its own ``rabbitmq.conf``: the system one (/etc/rabbitmq/rabbitmq.conf) adds a
listener on 127.0.0.1:5672, which the default node holds, so a node started with it fails.

Lifecycle: ``Cluster.start()`` takes an exclusive lock (one fault cluster per host at a time),
stops whatever an earlier crashed run left behind (``rabbitmqctl -n rmqX@host stop``, then
SIGKILL of beam processes whose command line or environment names rmqa/rmqb/rmqc — never
``rabbit@``), starts the three nodes, joins b and c to a and enables all feature flags.
``Cluster.stop()`` stops the nodes and removes their directories; it runs from the pytest
fixture's finalizer and from ``atexit``, and is idempotent.

By hand: ``scripts/cluster start|status|stop`` (python -m tests.faults.cluster).

Version: the host's RabbitMQ (3.10) by default. ``RMQKIT_FAULT_CLUSTER_VERSION=4.0`` or ``4.3``
runs the three nodes under chroot from the Debian root `scripts/broker-up --version 4.0|4.3`
builds (and mounts /proc and /dev in: run it first), with that root's own rabbitmq-server and
rabbitmqctl; the nodes' directories are then inside the root (its /var/tmp), the same ports.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import aio_pika
import httpx

from tests.consumer_harness import ROOT, ConsumerProcess
from tests.ports import bindable

HOST = socket.gethostname().split(".")[0]  # `hostname -s`
NAMES = ("rmqa", "rmqb", "rmqc")
AMQP_PORT = {"rmqa": 5681, "rmqb": 5682, "rmqc": 5683}
DIST_OFFSET = 20000
MGMT_PORT = {name: port + 10000 for name, port in AMQP_PORT.items()}
AUTH = ("guest", "guest")
# The Debian root per version, as scripts/_brokers.sh names them (none: the host's RabbitMQ).
SUITES = {"4.0": "trixie", "4.3": "sid"}
VERSION = os.environ.get("RMQKIT_FAULT_CLUSTER_VERSION", "3.10")
CHROOT: Path | None = (
    Path(os.environ.get("RMQKIT_ROOTS", "/var/cache/rmqkit/roots")) / SUITES[VERSION]
    if VERSION in SUITES
    else None
)
# Lock and state on the host whatever the version: one fault cluster per host (same ports).
HOST_DIR = Path(os.environ.get("RMQKIT_CLUSTER_ROOT", "/var/tmp"))
WORK_ROOT = HOST_DIR if CHROOT is None else CHROOT / "var" / "tmp"  # the nodes' directories
LOCK_PATH = HOST_DIR / "rmqkit-fault-cluster.lock"
DIR_PREFIX = "rmqkit-fault-cluster-"
# Written by `scripts/cluster start`: RMQKIT_FAULT_CLUSTER_REUSE=1 runs the suite against that
# cluster (left running) instead of starting one — for iterating on scenarios by hand.
STATE_PATH = HOST_DIR / "rmqkit-fault-cluster.json"
MARKER = "-rmqkit_fault_node"  # an erl argument that names our nodes on the beam command line
T = TypeVar("T")


def inside(path: Path) -> str:
    """``path`` as the nodes see it (relative to the chroot, if they run in one)."""
    return str(path) if CHROOT is None else "/" + str(path.relative_to(CHROOT))


def in_root(command: list[str]) -> list[str]:
    """``command`` run by the nodes' RabbitMQ: the host's, or the version root's under chroot."""
    return command if CHROOT is None else ["chroot", str(CHROOT), *command]


def _root_env(env: dict[str, str]) -> dict[str, str]:
    if CHROOT is not None:  # the root's Elixir CLI wants a UTF-8 locale; C.UTF-8 is built in
        env = {**env, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    return env


class ClusterUnavailable(Exception):
    """The cluster cannot be started here (no rabbitmq-server, not root, a port taken…)."""


def q(name: str) -> str:
    return quote(name, safe="")


def await_node_startup(node_name: str, timeout_s: float) -> str | None:
    """`rabbitmqctl await_startup` on ``node_name``, retried until ``timeout_s`` (it fails at
    once before the node registers with epmd): None once the app runs, else the last output."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        remaining = max(5, int(deadline - time.monotonic()))
        result = rabbitmqctl(
            node_name,
            "await_startup",
            "--timeout",
            str(remaining),
            timeout=remaining + 10,
            check=False,
        )
        if result.returncode == 0:
            return None
        last = (result.stdout + result.stderr).strip()
        time.sleep(0.5)
    return last


def _client_properties(raw: object) -> dict[str, object]:
    """A connection's client properties as `rabbitmqctl list_connections --formatter json`
    gives them: a list of [key, type, value] triples; a connection still in its handshake has
    none yet, and some rows carry them as a plain string: no properties, listed again later."""
    if isinstance(raw, dict):
        return dict(raw)
    if not isinstance(raw, list):
        return {}
    return {
        str(item[0]): item[-1] for item in raw if isinstance(item, list | tuple) and len(item) >= 2
    }


def poll(fn: Callable[[], T], timeout_s: float, interval_s: float = 0.25) -> T:
    """Call ``fn`` until it returns something truthy or ``timeout_s`` passes; its last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = fn()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval_s)


@dataclass(frozen=True)
class Node:
    short: str  # rmqa
    base: Path  # this run's directory (owned by rabbitmq)

    @property
    def name(self) -> str:
        return f"{self.short}@{HOST}"

    @property
    def port(self) -> int:
        return AMQP_PORT[self.short]

    @property
    def mgmt_port(self) -> int:
        return MGMT_PORT[self.short]

    @property
    def mgmt(self) -> str:
        return f"http://127.0.0.1:{self.mgmt_port}"

    def url(self, vhost: str = "/") -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/{q(vhost)}"

    @property
    def dir(self) -> Path:
        return self.base / self.short

    @property
    def pid_file(self) -> Path:
        return self.dir / f"{self.short}.pid"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RABBITMQ_")}
        env.update(
            RABBITMQ_NODENAME=self.name,
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.port + DIST_OFFSET),
            RABBITMQ_MNESIA_BASE=inside(self.dir / "mnesia"),
            RABBITMQ_LOG_BASE=inside(self.dir / "log"),
            RABBITMQ_PID_FILE=inside(self.pid_file),
            RABBITMQ_ENABLED_PLUGINS_FILE=inside(self.dir / "enabled_plugins"),
            RABBITMQ_CONFIG_FILE=inside(self.dir / "rabbitmq.conf"),
            RABBITMQ_CONF_ENV_FILE=inside(self.dir / "rabbitmq-env.conf"),
            RABBITMQ_SERVER_START_ARGS=(
                f"-rabbitmq_management tcp_config [{{port,{self.mgmt_port}}}]"
            ),
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=f"{MARKER} {self.name}",
        )
        return _root_env(env)

    def prepare(self) -> None:
        (self.dir / "mnesia").mkdir(parents=True, exist_ok=True)
        (self.dir / "log").mkdir(parents=True, exist_ok=True)
        (self.dir / "enabled_plugins").write_text("[rabbitmq_management].\n")
        # Sourced by rabbitmq-env as the node's user in place of the default file (which it
        # sources first, as before), after su's PAM limits set the soft open-file limit to 1024:
        # with that few a node holding many vhosts and queues stops completing AMQP handshakes.
        (self.dir / "rabbitmq-env.conf").write_text(
            "[ -f /etc/rabbitmq/rabbitmq-env.conf ] && . /etc/rabbitmq/rabbitmq-env.conf\n"
            'ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true\n'
        )
        (self.dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = {self.port}\n"
            "loopback_users.guest = true\n"
            # Management lists (connections, queue leaders) a little fresher than the 5 s default.
            "collect_statistics_interval = 500\n"
            # No result cache: by default a list query is answered from the result of the last
            # one for 5 times as long as that one took, so one slow query (a loaded machine, a
            # node going down) serves a stale list for many seconds.
            "management.db_cache_multiplier = 0\n"
        )
        _chown_rabbitmq(self.base)


def _chown_rabbitmq(path: Path) -> None:
    # The root's own rabbitmq user (its uid may differ from the host's).
    subprocess.run(in_root(["chown", "-R", "rabbitmq:rabbitmq", inside(path)]), check=True)


def rabbitmqctl(
    node: str, *args: str, timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """``rabbitmqctl -n NODE ARGS`` (never without -n: that would be the shared default node)."""
    assert not node.startswith("rabbit@"), "the fault harness never drives the default node"
    result = subprocess.run(
        in_root(["rabbitmqctl", "-q", "-n", node, *args]),
        env=_root_env(dict(os.environ)),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and result.returncode != 0:
        raise RuntimeError(
            f"rabbitmqctl -n {node} {' '.join(args)} → {result.returncode}: "
            f"{result.stdout.strip()} {result.stderr.strip()}"
        )
    return result


def _our_beams() -> dict[int, str]:
    """Live beam processes that belong to rmqa/rmqb/rmqc (by command line or environment)."""
    found: dict[int, str] = {}
    pattern = re.compile(rb"\b(rmq[abc])@")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            if b"beam" not in cmdline.split(b"\0", 1)[0]:
                continue
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        match = None
        if MARKER.encode() in cmdline:
            match = pattern.search(cmdline)
        if match is None:
            env_name = re.search(rb"(?:^|\0)RABBITMQ_NODENAME=(rmq[abc])@", environ)
            match = env_name
        if match is None:
            continue
        found[int(entry.name)] = match.group(1).decode()
    return found


def cleanup_stale(log: Callable[[str], None] = print) -> None:
    """Stop nodes (and remove directories) left by an earlier run that died without cleanup."""
    beams = _our_beams()
    if beams:
        log(f"fault cluster: stale nodes from an earlier run: {sorted(set(beams.values()))}")
        _stop_nodes(sorted(f"{short}@{HOST}" for short in set(beams.values())))
        poll(lambda: not _our_beams(), timeout_s=15)
        for pid in _our_beams():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        poll(lambda: not _our_beams(), timeout_s=10)
    for old in WORK_ROOT.glob(DIR_PREFIX + "*"):
        shutil.rmtree(old, ignore_errors=True)
    STATE_PATH.unlink(missing_ok=True)  # a cluster left by `scripts/cluster start` is gone


def _stop_nodes(names: list[str]) -> None:
    """`rabbitmqctl -n NODE stop` for each, in parallel; failures ignored (SIGKILL follows)."""

    def stop(name: str) -> None:
        with contextlib.suppress(Exception):
            rabbitmqctl(name, "stop", timeout=60, check=False)

    _parallel([lambda n=name: stop(n) for name in names])


def _parallel(calls: list[Callable[[], None]]) -> None:
    """Run ``calls`` in threads; re-raise the first failure."""
    errors: list[BaseException] = []

    def run(call: Callable[[], None]) -> None:
        try:
            call()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(c,)) for c in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


class Cluster:
    """The three nodes; helpers to fault them and to talk to them (AMQP, management API)."""

    def __init__(self, log: Callable[[str], None] | None = None) -> None:
        self.base = WORK_ROOT / f"{DIR_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.nodes = {short: Node(short, self.base) for short in NAMES}
        self._lock: Any = None
        self._started = False
        self._log = log or (lambda text: print(text, file=sys.stderr, flush=True))
        self.timings: dict[str, float] = {}

    # --- lifecycle -------------------------------------------------------------------------
    def start(self, lock_timeout_s: float = 600) -> Cluster:
        if CHROOT is not None:
            if not (CHROOT / ".rmqkit-root").is_file() or not os.path.ismount(CHROOT / "proc"):
                raise ClusterUnavailable(
                    f"no RabbitMQ {VERSION} root ready at {CHROOT}: "
                    f"run scripts/broker-up --version {VERSION} first"
                )
        elif shutil.which("rabbitmq-server") is None or shutil.which("rabbitmqctl") is None:
            raise ClusterUnavailable("rabbitmq-server/rabbitmqctl not installed")
        if os.geteuid() != 0:
            raise ClusterUnavailable("needs root (nodes run as the rabbitmq user)")
        try:
            subprocess.run(["id", "rabbitmq"], check=True, capture_output=True)
        except subprocess.CalledProcessError:
            raise ClusterUnavailable("no rabbitmq user") from None
        began = time.monotonic()
        self._acquire_lock(lock_timeout_s)
        atexit.register(self.stop)
        cleanup_stale(self._log)
        busy = [
            port
            for node in self.nodes.values()
            for port in (node.port, node.port + DIST_OFFSET, node.mgmt_port)
            if not bindable(port)
        ]
        if busy:
            raise ClusterUnavailable(f"ports in use by something else: {busy}")
        self.base.mkdir(parents=True)
        self._started = True
        for node in self.nodes.values():
            node.prepare()
        _parallel([lambda n=node: self._spawn(n) for node in self.nodes.values()])
        self.timings["spawned_s"] = time.monotonic() - began
        _parallel([lambda s=short: self.await_startup(s) for short in NAMES])
        self.timings["nodes_up_s"] = time.monotonic() - began
        seed = self.nodes["rmqa"].name
        joining = threading.Lock()  # one join_cluster at a time; stop_app/start_app overlap

        def join(short: str) -> None:
            rabbitmqctl(self.nodes[short].name, "stop_app")
            with joining:
                rabbitmqctl(self.nodes[short].name, "join_cluster", seed)
            rabbitmqctl(self.nodes[short].name, "start_app")  # returns once the app runs

        _parallel([lambda s=short: join(s) for short in ("rmqb", "rmqc")])
        self.timings["joined_s"] = time.monotonic() - began
        rabbitmqctl(seed, "enable_feature_flag", "all")
        for node in self.nodes.values():
            self.await_management(node.short)
        members = {name for name, row in self.nodes_state().items() if row.get("running")}
        if members != set(NAMES):
            raise RuntimeError(f"cluster did not form: running nodes {members}")
        self.timings["cluster_formed_s"] = time.monotonic() - began
        self._log(
            f"fault cluster up in {self.timings['cluster_formed_s']:.1f}s "
            f"({', '.join(f'{k} {v:.1f}' for k, v in self.timings.items())}): {self.base}"
        )
        return self

    @classmethod
    def attach(cls) -> Cluster | None:
        """The cluster `scripts/cluster start` left running, if all three nodes are up."""
        try:
            base = Path(json.loads(STATE_PATH.read_text())["base"])
        except (OSError, ValueError, KeyError):
            return None
        if sorted(set(_our_beams().values())) != list(NAMES):
            return None
        cluster = cls()
        cluster.base = base
        cluster.nodes = {short: Node(short, base) for short in NAMES}
        return cluster

    def _acquire_lock(self, timeout_s: float) -> None:
        HOST_DIR.mkdir(parents=True, exist_ok=True)
        WORK_ROOT.mkdir(parents=True, exist_ok=True)
        handle = LOCK_PATH.open("a+")
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    handle.seek(0)
                    holder = handle.read().strip() or "?"
                    handle.close()
                    raise ClusterUnavailable(
                        f"another fault-cluster run (pid {holder}) holds {LOCK_PATH} "
                        f"(waited {timeout_s:.0f}s)"
                    ) from None
                time.sleep(1)
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._lock = handle

    def _spawn(self, node: Node) -> None:
        result = subprocess.run(
            in_root(["rabbitmq-server", "-detached"]),
            env=node.env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"rabbitmq-server -detached for {node.name} → {result.returncode}: "
                f"{result.stdout} {result.stderr}"
            )

    def stop(self) -> None:
        """Stop every node and remove this run's directories (safe to call twice)."""
        if self._started:
            self._started = False
            _stop_nodes([node.name for node in self.nodes.values()])
            poll(lambda: not _our_beams(), timeout_s=20)
            for pid in _our_beams():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            poll(lambda: not _our_beams(), timeout_s=10)
            shutil.rmtree(self.base, ignore_errors=True)
            self._log("fault cluster stopped and removed")
        if self._lock is not None:
            with contextlib.suppress(Exception):
                fcntl.flock(self._lock, fcntl.LOCK_UN)
                self._lock.close()
            self._lock = None

    # --- node control ----------------------------------------------------------------------
    def ctl(self, short: str, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return rabbitmqctl(self.nodes[short].name, *args, **kwargs)

    def await_startup(self, short: str, timeout_s: float = 120) -> None:
        """Wait until the node's app is running: `await_startup`, retried while the node is not
        reachable yet (it fails at once before the node registers with epmd)."""
        node = self.nodes[short]
        last = await_node_startup(node.name, timeout_s)
        if last is None:
            return
        log_tail = ""
        for path in sorted((node.dir / "log").glob("*.log")):
            log_tail += path.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"{node.name} did not start within {timeout_s}s: {last}\n{log_tail}")

    def await_management(self, short: str, timeout_s: float = 60) -> None:
        node = self.nodes[short]

        def ready() -> bool:
            try:
                response = httpx.get(node.mgmt + "/api/overview", auth=AUTH, timeout=5)
            except httpx.HTTPError:
                return False
            return response.status_code == 200

        if not poll(ready, timeout_s, 0.3):
            raise RuntimeError(f"management API of {node.name} not ready in {timeout_s}s")

    def stop_app(self, short: str) -> None:
        self.ctl(short, "stop_app")

    def start_app(self, short: str) -> None:
        self.ctl(short, "start_app")  # returns once the app runs
        self.await_management(short)

    def beam_pid(self, short: str) -> int | None:
        for pid, name in _our_beams().items():
            if name == short:
                return pid
        return None

    def kill_node(self, short: str) -> None:
        """SIGKILL the node's Erlang VM: a node lost without any goodbye."""
        pid = self.beam_pid(short)
        assert pid is not None, f"{short} is not running"
        os.kill(pid, signal.SIGKILL)
        poll(lambda: self.beam_pid(short) is None, timeout_s=15)

    def restart_node(self, short: str) -> None:
        """Start a node that was killed (its data and cluster membership are on disk)."""
        self._spawn(self.nodes[short])
        self.await_startup(short)
        self.await_management(short)

    def nodes_state(self) -> dict[str, dict[str, Any]]:
        """/api/nodes by short name: running, mem_alarm, disk_free_alarm."""
        rows = self.api("GET", "/nodes").json()
        return {str(row["name"]).split("@")[0]: row for row in rows}

    def heal(self) -> list[str]:
        """Bring every node back up and clear alarms a failed scenario may have left."""
        done: list[str] = []
        for short in NAMES:
            if self.beam_pid(short) is None:
                self.restart_node(short)
                done.append(f"restarted {short}")
        try:
            state = self.nodes_state()
        except RuntimeError:
            state = {}
        for short in NAMES:
            row = state.get(short, {})
            if not row.get("running", False):
                self.start_app(short)
                done.append(f"start_app {short}")
            if row.get("mem_alarm"):
                self.ctl(short, "set_vm_memory_high_watermark", "0.4")
                done.append(f"memory watermark reset on {short}")
            if row.get("disk_free_alarm"):
                self.ctl(short, "set_disk_free_limit", "50MB")
                done.append(f"disk limit reset on {short}")
        if any("reset" in step for step in done):
            # An alarm clears at the node's next memory/disk check, not with the command:
            # publishers of the next scenario would block until then.
            def clear() -> bool:
                rows = self.nodes_state().values()
                return not any(r.get("mem_alarm") or r.get("disk_free_alarm") for r in rows)

            if not poll(clear, timeout_s=60, interval_s=0.5):
                raise RuntimeError(f"alarms still raised after {done}: {self.nodes_state()}")
        return done

    # --- URLs, vhosts, management API --------------------------------------------------------
    def url(self, short: str, vhost: str) -> str:
        return self.nodes[short].url(vhost)

    def urls(self, vhost: str, first: str | None = None) -> str:
        """RMQKIT_URL listing every node (``first`` first)."""
        order = [first] if first else []
        order += [s for s in NAMES if s not in order]
        return ",".join(self.nodes[s].url(vhost) for s in order)

    def _api_on(self, node: Node, method: str, path: str, **kwargs: Any) -> httpx.Response | None:
        try:
            return httpx.request(method, node.mgmt + "/api" + path, auth=AUTH, timeout=10, **kwargs)
        except httpx.HTTPError:
            return None

    def api(self, method: str, path: str, *, prefer: str | None = None, **kwargs: Any) -> Any:
        """Call the management API on the first node that answers (a stopped node does not)."""
        order = ([prefer] if prefer else []) + [s for s in NAMES if s != prefer]
        errors = []
        for short in order:
            response = self._api_on(self.nodes[short], method, path, **kwargs)
            if response is None or response.status_code >= 500:
                errors.append(f"{short}: {response.status_code if response else 'down'}")
                continue
            return response
        raise RuntimeError(f"no management API answered {method} {path}: {errors}")

    def create_vhost(self, prefix: str) -> str:
        name = f"fault-{prefix}-{uuid.uuid4().hex[:6]}"
        self.api("PUT", f"/vhosts/{q(name)}", json={}).raise_for_status()
        perms = {"configure": ".*", "write": ".*", "read": ".*"}
        self.api("PUT", f"/permissions/{q(name)}/guest", json=perms).raise_for_status()
        return name

    def delete_vhost(self, name: str) -> None:
        with contextlib.suppress(Exception):
            self.api("DELETE", f"/vhosts/{q(name)}")

    def queue_info(self, vhost: str, queue: str) -> dict[str, Any] | None:
        response = self.api("GET", f"/queues/{q(vhost)}/{q(queue)}")
        return response.json() if response.status_code == 200 else None

    def leader(self, vhost: str, queue: str) -> str:
        """The short name of the node leading quorum queue ``queue`` (management `leader`)."""

        def read() -> str | None:
            info = self.queue_info(vhost, queue) or {}
            leader = info.get("leader") or info.get("node")
            return str(leader).split("@")[0] if leader else None

        found = poll(read, timeout_s=30, interval_s=0.5)
        assert found, f"no leader known for {queue}"
        return found

    def connections(self, vhost: str, name_prefix: str = "") -> list[dict[str, Any]]:
        response = self.api("GET", f"/vhosts/{q(vhost)}/connections")
        rows = response.json() if response.status_code == 200 else []
        return [
            c
            for c in rows
            if str((c.get("client_properties") or {}).get("connection_name", "")).startswith(
                name_prefix
            )
        ]

    def live_connections(self, vhost: str, name_prefix: str = "") -> list[str]:
        """The node of each connection named ``name_prefix``… in ``vhost``, as the brokers' own
        connection processes report them (`rabbitmqctl list_connections`, asked of the first
        node whose app answers; it lists the whole cluster). Unlike the management API's list,
        which is built from statistics, it has no stats lag and no result cache: a connection
        is listed once open and gone once closed."""
        by_port = {node.port: short for short, node in self.nodes.items()}
        errors = []
        for short in NAMES:
            try:
                result = rabbitmqctl(
                    self.nodes[short].name,
                    "list_connections",
                    "-p",
                    vhost,
                    "port",
                    "client_properties",
                    "--formatter",
                    "json",
                    check=False,
                    timeout=60,
                )
                rows = json.loads(result.stdout or "[]") if result.returncode == 0 else None
            except (subprocess.TimeoutExpired, ValueError) as exc:
                errors.append(f"{short}: {type(exc).__name__}")
                continue
            if rows is None:
                errors.append(f"{short}: exit {result.returncode}")
                continue
            out = []
            for row in rows:
                props = _client_properties(row.get("client_properties"))
                if str(props.get("connection_name", "")).startswith(name_prefix):
                    out.append(by_port.get(int(row["port"]), f"port {row['port']}"))
            return out
        raise RuntimeError(f"no node listed the connections: {errors}")

    def close_connections(self, vhost: str, name_prefix: str = "") -> int:
        closed = 0
        for conn in self.connections(vhost, name_prefix):
            response = self.api(
                "DELETE",
                f"/connections/{q(conn['name'])}",
                headers={"X-Reason": "fault suite: forced close"},
            )
            if response.status_code in (200, 204):
                closed += 1
        return closed

    # --- AMQP (immediate, unlike management stats) ---------------------------------------------
    def depths(self, vhost: str, names: list[str], via: str | None = None) -> dict[str, int]:
        """Ready counts by passive declare on a live node; raises if no node answers."""
        return asyncio.run(self._depths(vhost, names, via))

    async def _depths(self, vhost: str, names: list[str], via: str | None) -> dict[str, int]:
        conn = await self._connect(vhost, via)
        out: dict[str, int] = {}
        try:
            for name in names:
                channel = await conn.channel()
                declared = await channel.declare_queue(name, passive=True)
                out[name] = int(declared.declaration_result.message_count or 0)
                await channel.close()
        finally:
            await conn.close()
        return out

    async def _connect(self, vhost: str, via: str | None) -> aio_pika.abc.AbstractConnection:
        order = ([via] if via else []) + [s for s in NAMES if s != via]
        last: BaseException | None = None
        for short in order:
            try:
                return await aio_pika.connect(self.url(short, vhost), timeout=5)
            except Exception as exc:
                last = exc
        raise RuntimeError(f"no node accepted an AMQP connection: {last}")

    def take_all(self, vhost: str, queue: str) -> list[tuple[str | None, dict[str, Any], bytes]]:
        """Remove every message from ``queue``: (message_id, headers, body) each (the end of a
        scenario, after the consumer stopped)."""
        return asyncio.run(self._take_all(vhost, queue))

    async def _take_all(
        self, vhost: str, queue: str
    ) -> list[tuple[str | None, dict[str, Any], bytes]]:
        conn = await self._connect(vhost, None)
        out: list[tuple[str | None, dict[str, Any], bytes]] = []
        try:
            channel = await conn.channel()
            source = await channel.get_queue(queue, ensure=False)
            while True:
                message = await source.get(fail=False, no_ack=False, timeout=10)
                if message is None:
                    return out
                out.append((message.message_id, dict(message.headers or {}), message.body))
                await message.ack()
        finally:
            await conn.close()


class ClusterConsumer(ConsumerProcess):
    """`rmqkit consume` against the cluster: RMQKIT_URL lists every node (``first`` first)."""

    _count = 0

    def __init__(
        self,
        cluster: Cluster,
        vhost: str,
        ledger: Path,
        *args: str,
        first: str | None = None,
        topology: Path,
        handler: str = "tests.faults.idempotent_handlers:handle_idempotent",
        queue: str = "jobs.work",
    ) -> None:
        ClusterConsumer._count += 1
        env = {k: v for k, v in os.environ.items() if not k.startswith("RMQKIT_")}
        env["RMQKIT_URL"] = cluster.urls(vhost, first)
        env["RMQKIT_MANAGEMENT_URL"] = cluster.nodes[first or "rmqa"].mgmt
        env["RMQKIT_TEST_LEDGER"] = str(ledger)
        env["RMQKIT_CONNECT_TIMEOUT_S"] = "3"
        cmd = [sys.executable, "-m", "rmqkit", "consume", handler, "--queue", queue, *args]
        cmd += ["--topology", str(topology)]
        self.log_path = ledger.with_name(f"consumer-{ClusterConsumer._count}.log")
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT
        )


@contextlib.contextmanager
def running_cluster() -> Iterator[Cluster]:
    cluster = Cluster()
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def _main(argv: list[str]) -> int:
    """scripts/cluster start|status|stop: a cluster by hand (start keeps running until stop)."""
    command = argv[0] if argv else "status"
    if command == "status":
        beams = _our_beams()
        print(json.dumps({"beams": {str(k): v for k, v in beams.items()}}, indent=2))
        for short in sorted(set(beams.values())):
            result = rabbitmqctl(f"{short}@{HOST}", "cluster_status", check=False, timeout=30)
            print(result.stdout or result.stderr)
        return 0
    if command == "stop":
        cleanup_stale()
        STATE_PATH.unlink(missing_ok=True)
        return 0
    if command == "start":
        cluster = Cluster()
        cluster.start()
        atexit.unregister(cluster.stop)
        cluster._started = False  # keep running; `scripts/cluster stop` removes it
        STATE_PATH.write_text(json.dumps({"base": str(cluster.base)}))
        for node in cluster.nodes.values():
            print(f"{node.name}: {node.url()}  management {node.mgmt}")
        return 0
    print("usage: scripts/cluster start|status|stop", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))

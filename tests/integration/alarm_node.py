"""A RabbitMQ node of the alarm tests' own (``rmqalarm@host``: AMQP 5691, management 15691),
so that a memory or disk alarm never blocks the publishers of the shared default node (5672)
or of the 4.x nodes other test modules run on at the same time: an alarm blocks every
publishing connection of its cluster.

Started once per test module (``AlarmNode.start()``, ~10 s), stopped and its directory removed
by ``stop()``; ``start`` raises ``ClusterUnavailable`` (the module skips, with the reason) when
no node can be started here (no rabbitmq-server, not root, the ports taken). Built on the fault
cluster's node definition (tests/faults/cluster.py): own name, ports, data directory and config.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from tests.faults import cluster
from tests.faults.cluster import AUTH, DIST_OFFSET, ClusterUnavailable, Node, poll, rabbitmqctl
from tests.ports import bindable

SHORT = "rmqalarm"
AMQP_PORT = 5691
LOCK_PATH = cluster.HOST_DIR / "rmqkit-alarm-node.lock"


@dataclass(frozen=True)
class _AlarmNodeSpec(Node):
    @property
    def port(self) -> int:
        return AMQP_PORT

    @property
    def mgmt_port(self) -> int:
        return AMQP_PORT + 10000


class AlarmNode:
    """One standalone node whose memory and disk alarms the tests may raise."""

    def __init__(self) -> None:
        base = cluster.WORK_ROOT / f"rmqkit-alarm-node-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.node = _AlarmNodeSpec(SHORT, base)
        self._lock: Any = None
        self._started = False

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def url(self) -> str:
        return self.node.url("/")

    @property
    def management_url(self) -> str:
        return self.node.mgmt

    def start(self) -> AlarmNode:
        """Start the node (waits for AMQP and the management API); ClusterUnavailable if it
        cannot be started here."""
        if shutil.which("rabbitmq-server") is None or shutil.which("rabbitmqctl") is None:
            raise ClusterUnavailable("rabbitmq-server/rabbitmqctl not installed")
        if os.geteuid() != 0:
            raise ClusterUnavailable("needs root (the node runs as the rabbitmq user)")
        LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
        self._lock = LOCK_PATH.open("a+")
        try:  # one alarm node per host: a second test run waits for the first
            deadline = time.monotonic() + 300
            while True:
                try:
                    fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise ClusterUnavailable(f"{LOCK_PATH} held for 300 s") from None
                    time.sleep(1)
            rabbitmqctl(self.name, "stop", check=False, timeout=30)  # a crashed run's leftover
            ports = (AMQP_PORT, AMQP_PORT + DIST_OFFSET, self.node.mgmt_port)

            def busy_ports() -> list[int]:
                return [port for port in ports if not bindable(port)]

            poll(lambda: not busy_ports(), 15)  # a leftover just stopped frees them in seconds
            busy = busy_ports()
            if busy:
                raise ClusterUnavailable(f"ports in use by something else: {busy}")
            self.node.prepare()
            self._started = True
            result = subprocess.run(
                ["rabbitmq-server", "-detached"],
                env=self.node.env(),
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            if result.returncode != 0:
                raise ClusterUnavailable(f"rabbitmq-server -detached: {result.stderr.strip()}")
            self._await_startup(120)
            if not poll(self._management_ready, 60, 0.3):
                raise RuntimeError(f"management API of {self.name} not ready in 60 s")
        except BaseException:
            self.stop()
            raise
        return self

    def _await_startup(self, timeout_s: float) -> None:
        last = cluster.await_node_startup(self.name, timeout_s)
        if last is not None:
            raise RuntimeError(f"{self.name} did not start within {timeout_s:.0f} s: {last[-300:]}")

    def _management_ready(self) -> bool:
        try:
            response = httpx.get(self.management_url + "/api/overview", auth=AUTH, timeout=5)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    def ctl(self, *args: str) -> str:
        """``rabbitmqctl -n rmqalarm@host ARGS`` (its stdout)."""
        return rabbitmqctl(self.name, *args, timeout=60).stdout

    @contextlib.contextmanager
    def memory_alarm(self) -> Iterator[None]:
        """A memory alarm for the block: the watermark far below what the node uses; restored
        (and the alarm cleared) however the block ends."""
        self.ctl("set_vm_memory_high_watermark", "0.0000001")
        try:
            # In force before the block runs: a publish that starts before the node's memory
            # monitor raised the alarm is not blocked (a loaded CI run got exit 0, not 69).
            if not poll(lambda: "mem_alarm" in self.alarms(), 20):
                raise AssertionError(f"no memory alarm on {self.name} within 20 s")
            yield
        finally:
            self.ctl("set_vm_memory_high_watermark", "0.4")
            poll(lambda: "mem_alarm" not in self.alarms(), 20)

    @contextlib.contextmanager
    def disk_alarm(self) -> Iterator[None]:
        """A disk alarm for the block: a free-disk limit far above any disk's free space."""
        self.ctl("set_disk_free_limit", "100000GB")
        try:
            yield
        finally:
            self.ctl("set_disk_free_limit", "50MB")

    def alarms(self) -> list[str]:
        """The node's current alarms as the management API reports them."""
        row = httpx.get(
            f"{self.management_url}/api/nodes/{self.name}", auth=AUTH, timeout=10
        ).json()
        return [name for name in ("mem_alarm", "disk_free_alarm") if row.get(name)]

    def stop(self) -> None:
        """Stop the node and remove its directory (safe to call twice)."""
        if self._started:
            self._started = False
            rabbitmqctl(self.name, "stop", check=False, timeout=60)
            pid_text = ""
            with contextlib.suppress(OSError):
                pid_text = self.node.pid_file.read_text().strip()
            if pid_text.isdigit():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid_text), signal.SIGKILL)
            shutil.rmtree(self.node.base, ignore_errors=True)
        if self._lock is not None:
            with contextlib.suppress(Exception):
                fcntl.flock(self._lock, fcntl.LOCK_UN)
                self._lock.close()
            self._lock = None

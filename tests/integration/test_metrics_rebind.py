"""A restarted worker whose metrics port is taken keeps consuming (and binds again later).

CI once lost a whole consumer this way: kill -9 of a worker, its restart found the metrics port
taken, exited 78 (config error, fatal), and the supervisor stopped every worker. The first start
still refuses a taken port (an operator's mistake); only a restart consumes on.
"""

from __future__ import annotations

import os
import signal
import socket
import uuid
from pathlib import Path

import httpx

from tests import broker
from tests.consumer_harness import ConsumerProcess, effects, wait_until
from tests.handlers import body
from tests.ports import free_port


def _answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_restarted_worker_with_its_port_taken_consumes_and_binds_again(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    port = free_port()
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(jobs_vhost, ledger, "--metrics-port", str(port))
    consumers.append(consumer)
    assert wait_until(lambda: _answers(port), timeout_s=20), consumer.output()
    [worker] = consumer.workers()
    os.kill(worker, signal.SIGKILL)
    taker = socket.socket()  # the port taken before the supervisor's restart (>= 0.2 s later)
    taker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    assert wait_until(lambda: _bind(taker, port), timeout_s=2)
    taker.listen()
    try:
        assert wait_until(lambda: "consuming without metrics" in consumer.output(), 20), (
            consumer.output()
        )
        ids = [uuid.uuid4().hex for _ in range(10)]
        broker.publish_with_ids(jobs_vhost, "jobs", "job", [(m, body(id=m)) for m in ids])
        assert wait_until(lambda: all(effects(ledger)[m] == 1 for m in ids), 20), consumer.output()
        assert consumer.proc.poll() is None
    finally:
        taker.close()
    assert wait_until(lambda: _answers(port), timeout_s=10), consumer.output()
    assert consumer.stop() == 0


def _bind(sock: socket.socket, port: int) -> bool:
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        return False
    return True

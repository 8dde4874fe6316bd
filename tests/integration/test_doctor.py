"""`rmqkit doctor` against the real broker: one test per check, each planting exactly that
problem in a fresh vhost, and rmqkit's own topology reporting clean."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from rmqkit.broker.amqp import parse_version
from rmqkit.cli.main import main
from rmqkit.health.doctor import DoctorReport, run_doctor
from rmqkit.settings import with_vhost
from rmqkit.topology import declare_topology, load_topology
from tests import broker

pytestmark = [pytest.mark.broker, pytest.mark.semantics("4.3")]
ROOT = Path(__file__).resolve().parents[2]
ORDERS = str(ROOT / "topologies" / "orders.toml")
VERSION = parse_version(str(broker.api("GET", "/overview").json()["rabbitmq_version"]))


# --- planting ---------------------------------------------------------------------------------
def put_queue(vhost: str, name: str, qtype: str = "quorum", **args: Any) -> None:
    arguments = {"x-queue-type": qtype, **{f"x-{k.replace('_', '-')}": v for k, v in args.items()}}
    body = {"durable": True, "auto_delete": False, "arguments": arguments}
    broker.api("PUT", f"/queues/{broker.q(vhost)}/{broker.q(name)}", json=body).raise_for_status()


def put_exchange(vhost: str, name: str, xtype: str = "topic") -> None:
    body = {"type": xtype, "durable": True}
    path = f"/exchanges/{broker.q(vhost)}/{broker.q(name)}"
    broker.api("PUT", path, json=body).raise_for_status()


def put_policy(vhost: str, name: str, pattern: str, definition: dict[str, Any]) -> None:
    body = {"pattern": pattern, "definition": definition, "priority": 0, "apply-to": "queues"}
    path = f"/policies/{broker.q(vhost)}/{broker.q(name)}"
    broker.api("PUT", path, json=body).raise_for_status()


def put_parking(vhost: str, name: str) -> None:
    """A correct parking queue for this broker (4.x: delivery-limit -1, else its default 20)."""
    if VERSION >= (4, 0, 0):
        put_queue(vhost, name, delivery_limit=-1)
    else:
        put_queue(vhost, name)


WORK_ARGS = {
    "dead_letter_exchange": "",
    "dead_letter_routing_key": "w.parking",
    "dead_letter_strategy": "at-least-once",
    "overflow": "reject-publish",
    "max_length": 1000,
}


async def _publish_raw(
    vhost: str, exchange: str, key: str, count: int, *, persistent: bool, mandatory: bool
) -> None:
    conn = await aio_pika.connect(with_vhost(broker.BASE_URL, vhost))
    try:
        channel = await conn.channel()
        target = (
            channel.default_exchange if exchange == "" else await channel.get_exchange(exchange)
        )
        mode = (
            aio_pika.DeliveryMode.PERSISTENT if persistent else aio_pika.DeliveryMode.NOT_PERSISTENT
        )
        for _ in range(count):
            await target.publish(
                aio_pika.Message(b"{}", delivery_mode=mode), routing_key=key, mandatory=mandatory
            )
    finally:
        await conn.close()


class BackgroundPublisher(threading.Thread):
    """Publishes persistent messages to a queue (or ``exchange``) every ``every_s`` until
    stopped, or ``limit`` of them and then stays connected: the management API counts a
    channel's publishes when it emits the channel's stats, which a channel closed at once
    may never do (the unroutable check's evidence was seen missing that way)."""

    def __init__(
        self,
        vhost: str,
        queue: str,
        every_s: float = 0.05,
        *,
        exchange: str = "",
        limit: int | None = None,
    ) -> None:
        super().__init__(daemon=True)
        self.vhost, self.queue, self.every_s = vhost, queue, every_s
        self.exchange, self.limit = exchange, limit
        self.stopping = threading.Event()
        self.sent = 0

    def run(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        conn = await aio_pika.connect(with_vhost(broker.BASE_URL, self.vhost))
        try:
            channel = await conn.channel()
            target = (
                await channel.get_exchange(self.exchange)
                if self.exchange
                else channel.default_exchange
            )
            while not self.stopping.is_set():
                if self.limit is None or self.sent < self.limit:
                    await target.publish(
                        aio_pika.Message(b"{}", delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                        routing_key=self.queue,
                        mandatory=False,  # unroutable ones are dropped, as the check expects
                    )
                    self.sent += 1
                await asyncio.sleep(self.every_s)
        finally:
            await conn.close()

    def __enter__(self) -> BackgroundPublisher:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        self.join(timeout=10)


def declare_orders(vhost: str) -> None:
    """`rmqkit declare topologies/orders.toml`, in-process (a CLI start costs ~1.5 s)."""
    broker.run(declare_topology(broker.settings_for(vhost), load_topology(ORDERS)))


# --- running doctor ---------------------------------------------------------------------------
def fired(report: DoctorReport) -> set[str]:
    return {f.check for f in report.findings}


def await_checks(
    vhost: str, expected: set[str], objects: set[str] | None = None, timeout_s: float = 20.0
) -> None:
    """Poll (in-process, no growth sampling) until exactly ``expected`` fire (on ``objects``,
    if given): management stats lag by up to the stats interval, and rates need two samples
    to settle."""
    settings = broker.settings_for(vhost)
    last: list[set[str]] = []

    def probe() -> bool:
        report = broker.run(run_doctor(settings, sample_interval_s=0, transient_recheck_s=0.5))
        last.append(fired(report))
        found = {f.object for f in report.findings}
        return last[-1] == expected and (objects is None or found == objects)

    assert broker.wait_for(probe, timeout_s=timeout_s, interval_s=0.5), (
        f"doctor kept reporting {last[-1] if last else None}, not {expected}"
    )


Doctor = Callable[..., tuple[int, dict[str, Any]]]


@pytest.fixture
def doctor(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Doctor:
    """`rmqkit doctor --json` through the CLI's own entry point (argument parsing, exit-code
    mapping), in-process: a subprocess start costs more than the check. Returns the exit code
    and the report; two tests below run the real subprocess."""
    for key in [k for k in os.environ if k.startswith("RMQKIT_")]:
        monkeypatch.delenv(key)
    monkeypatch.chdir(ROOT / "tests")  # no stray .env

    def run(vhost: str, *args: str) -> tuple[int, dict[str, Any]]:
        capsys.readouterr()
        url = with_vhost(broker.BASE_URL, vhost)
        code = main(["--url", url, "--management-url", broker.MGMT, "doctor", "--json", *args])
        captured = capsys.readouterr()
        assert code in (0, 1, 2), captured.err
        report: dict[str, Any] = json.loads(captured.out)
        assert report["exit_code"] == code
        return code, report

    return run


def only_finding(report: dict[str, Any], check: str) -> list[dict[str, Any]]:
    """The findings, asserting every one is from ``check``."""
    findings: list[dict[str, Any]] = report["findings"]
    assert findings and {f["check"] for f in findings} == {check}, findings
    return findings


# --- one test per check -----------------------------------------------------------------------
def test_quorum_queue_with_delivery_limit_and_no_dead_letter_target(
    fresh_vhost: Callable[[], str], doctor: Doctor
) -> None:
    vhost = fresh_vhost()
    put_queue(vhost, "jobs", delivery_limit=5)
    code, report = doctor(vhost)
    (finding,) = only_finding(report, "quorum-no-dead-letter")
    assert (code, finding["severity"], finding["object"]) == (2, "critical", "jobs")
    assert "delivery-limit 5 (argument)" in finding["evidence"]


def test_dead_letter_exchange_that_does_not_exist(
    fresh_vhost: Callable[[], str], doctor: Doctor
) -> None:
    vhost = fresh_vhost()
    put_queue(vhost, "jobs", "classic", dead_letter_exchange="no-such-dlx")
    code, report = doctor(vhost)
    (finding,) = only_finding(report, "dead-letter-target-missing")
    assert (code, finding["severity"], finding["object"]) == (2, "critical", "jobs")
    assert "'no-such-dlx'" in finding["evidence"]


def test_at_least_once_without_reject_publish(
    fresh_vhost: Callable[[], str], doctor: Doctor
) -> None:
    vhost = fresh_vhost()
    put_parking(vhost, "w.parking")
    args = {k: v for k, v in WORK_ARGS.items() if k != "overflow"}
    put_queue(vhost, "w", **args)
    code, report = doctor(vhost)
    (finding,) = only_finding(report, "at-least-once-without-reject-publish")
    assert (code, finding["severity"], finding["object"]) == (1, "warning", "w")


def test_parking_queue_with_a_ttl(fresh_vhost: Callable[[], str], doctor: Doctor) -> None:
    vhost = fresh_vhost()
    # Version difference: on 4.x a quorum queue without delivery-limit has the default 20, which
    # (no dead-letter target) is a second, separate fault; -1 leaves the TTL the only one.
    unlimited = {"delivery_limit": -1} if VERSION >= (4, 0, 0) else {}
    put_queue(vhost, "jobs.parking", message_ttl=86_400_000, **unlimited)
    code, report = doctor(vhost)
    (finding,) = only_finding(report, "parking-limit-or-ttl")
    assert (code, finding["severity"], finding["object"]) == (2, "critical", "jobs.parking")
    assert "message-ttl 24h" in finding["evidence"]


def test_parking_queue_with_a_delivery_limit_set_by_a_policy(
    fresh_vhost: Callable[[], str], doctor: Doctor
) -> None:
    """A dead-letter target that dead-letters nowhere is a parking queue, whatever its name;
    a delivery limit there also drops silently, so both checks speak."""
    vhost = fresh_vhost()
    put_queue(vhost, "w", **{**WORK_ARGS, "dead_letter_routing_key": "graveyard"})
    put_queue(vhost, "graveyard")
    put_policy(vhost, "limit", "^graveyard$", {"delivery-limit": 3})
    code, report = doctor(vhost)
    by_check = {f["check"]: f for f in report["findings"]}
    assert set(by_check) == {"parking-limit-or-ttl", "quorum-no-dead-letter"}
    assert code == 2
    assert "delivery-limit 3 (policy 'limit')" in by_check["parking-limit-or-ttl"]["evidence"]


@pytest.mark.skipif(VERSION >= (4, 0, 0), reason="4.x has no classic mirroring")
def test_classic_mirrored_policy(fresh_vhost: Callable[[], str], doctor: Doctor) -> None:
    vhost = fresh_vhost()
    put_policy(vhost, "mirror-all", "^legacy\\.", {"ha-mode": "all"})
    code, report = doctor(vhost)
    (finding,) = only_finding(report, "classic-mirrored-policy")
    assert (code, finding["severity"], finding["object"]) == (1, "warning", "mirror-all")


def test_transient_messages_in_a_durable_queue(
    fresh_vhost: Callable[[], str], doctor: Doctor
) -> None:
    vhost = fresh_vhost()
    put_queue(vhost, "events", "classic")
    broker.run(_publish_raw(vhost, "", "events", 3, persistent=False, mandatory=True))
    broker.run(_publish_raw(vhost, "", "events", 1, persistent=True, mandatory=True))
    # Until the publish rate settles, the queue also looks like it is growing unconsumed.
    await_checks(vhost, {"transient-messages"})
    code, report = doctor(vhost)
    (finding,) = only_finding(report, "transient-messages")
    assert (code, finding["severity"], finding["object"]) == (1, "warning", "events")
    assert finding["evidence"] == (
        "3 of 4 message(s) in this durable classic queue are transient (delivery_mode 1) on two "
        "reads of the counters: they are lost when the node restarts"
    )


def test_transient_messages_in_a_quorum_queue_are_no_finding(
    fresh_vhost: Callable[[], str], doctor: Doctor
) -> None:
    """A quorum queue persists every message whatever its delivery_mode: doctor neither warns
    nor tells it to "use a quorum queue"."""
    vhost = fresh_vhost()
    put_queue(vhost, "events.q", "quorum")
    broker.run(_publish_raw(vhost, "", "events.q", 3, persistent=False, mandatory=True))
    broker.run(_publish_raw(vhost, "", "events.q", 1, persistent=True, mandatory=True))
    assert broker.wait_for(
        lambda: (broker.mgmt_queue(vhost, "events.q") or {}).get("messages") == 4
    )
    _, report = doctor(vhost)
    assert not [f for f in report["findings"] if f["check"] == "transient-messages"], report
    assert "use a quorum queue" not in json.dumps(report)
    assert broker.depths(vhost, ["events.q"]) == {"events.q": 4}


def test_unroutable_publishes_dropped_without_alternate_exchange(
    fresh_vhost: Callable[[], str], doctor: Doctor
) -> None:
    vhost = fresh_vhost()
    put_exchange(vhost, "events")
    with BackgroundPublisher(vhost, "nobody.listens", exchange="events", limit=5):
        await_checks(vhost, {"unroutable-dropped"}, {"events"}, timeout_s=30)
        code, report = doctor(vhost)
    (finding,) = only_finding(report, "unroutable-dropped")
    assert (code, finding["severity"], finding["object"]) == (1, "warning", "events")
    assert "dropped 5 unroutable" in finding["evidence"]


def test_queue_growing_with_no_consumers(fresh_vhost: Callable[[], str], doctor: Doctor) -> None:
    vhost = fresh_vhost()
    put_queue(vhost, "inbox", "classic")
    with BackgroundPublisher(vhost, "inbox"):
        assert broker.wait_for(lambda: (broker.depths(vhost, ["inbox"])["inbox"] or 0) > 0)
        code, report = doctor(vhost)
    (finding,) = only_finding(report, "growing-without-consumers")
    assert (code, finding["severity"], finding["object"]) == (1, "warning", "inbox")
    assert "no consumer" in finding["evidence"]


def test_work_queue_without_a_length_bound(fresh_vhost: Callable[[], str], doctor: Doctor) -> None:
    vhost = fresh_vhost()
    put_parking(vhost, "w.parking")
    put_queue(vhost, "w", **{k: v for k, v in WORK_ARGS.items() if k != "max_length"})
    code, report = doctor(vhost)
    (finding,) = only_finding(report, "unbounded-work-queue")
    assert (code, finding["severity"], finding["object"]) == (1, "warning", "w")


def test_handler_timeout_above_the_consumer_timeout(
    fresh_vhost: Callable[[], str], doctor: Doctor
) -> None:
    vhost = fresh_vhost()
    declare_orders(vhost)
    code, report = doctor(vhost, "--handler-timeout", "45m")
    if broker.version() >= (4, 3):
        # `rmqkit consume` asks for a consumer timeout of its own there (45m + 45m): the
        # broker's 30 min cannot cancel it, so doctor has nothing to advise.
        checks = {f["check"] for f in report["findings"]}
        assert "handler-timeout-above-consumer-timeout" not in checks, report
        return
    (finding,) = only_finding(report, "handler-timeout-above-consumer-timeout")
    assert (code, finding["severity"], finding["object"]) == (1, "warning", "orders.work")
    assert "45m (--handler-timeout)" in finding["evidence"]


def test_topology_file_out_of_sync(
    fresh_vhost: Callable[[], str], tmp_path: Path, doctor: Doctor
) -> None:
    vhost = fresh_vhost()
    declare_orders(vhost)
    changed = tmp_path / "orders.toml"
    text = Path(ORDERS).read_text().replace('"2m"]', '"2m", "10m"]')
    assert text != Path(ORDERS).read_text()
    changed.write_text(text)
    code, report = doctor(vhost, "--topology", str(changed))
    findings = only_finding(report, "topology-out-of-sync")
    assert code == 1 and {f["severity"] for f in findings} == {"warning"}
    assert "orders.work.wait.10m" in {f["object"] for f in findings}
    # A conflict `declare` cannot apply is critical: the work queue exists with an x-argument
    # that beats the file's max_length (the lower number wins).
    other = fresh_vhost()
    # With its dead-letter target as the file has it: on 4.x a quorum queue without one is also
    # (rightly) flagged quorum-no-dead-letter, its default delivery limit being 20.
    dead_letter = {"dead_letter_exchange": "", "dead_letter_routing_key": "orders.work.parking"}
    put_queue(other, "orders.work", max_length=50, **dead_letter)
    put_parking(other, "orders.work.parking")
    code, report = doctor(other, "--topology", ORDERS)
    findings = only_finding(report, "topology-out-of-sync")
    conflicts = [f["object"] for f in findings if f["severity"] == "critical"]
    assert code == 2 and conflicts == ["orders.work"]


# --- rmqkit's own topology is clean -----------------------------------------------------------
def test_a_topology_declared_by_rmqkit_is_clean(
    fresh_vhost: Callable[[], str], doctor: Doctor
) -> None:
    vhost = fresh_vhost()
    declared = broker.cli("declare", ORDERS, vhost=vhost)
    assert declared.returncode == 0, declared.stderr
    code, report = doctor(vhost, "--topology", ORDERS)
    assert (code, report["status"], report["findings"]) == (0, "ok", [])
    statuses = {c["id"]: c["status"] for c in report["checks"]}
    assert set(statuses.values()) == {"ok"}, statuses  # nothing skipped with a topology
    plain = broker.cli("doctor", vhost=vhost)  # piped, without the file
    assert plain.returncode == 0 and "DOCTOR OK" in plain.stdout.splitlines()[0]  # Nagios: first


def test_unreachable_management_api_is_exit_69(fresh_vhost: Callable[[], str]) -> None:
    result = broker.cli("--management-url", "http://127.0.0.1:1", "doctor", vhost=fresh_vhost())
    assert result.returncode == 69, result.stderr
    assert result.stderr.startswith("rmqkit: error:") and "Traceback" not in result.stderr

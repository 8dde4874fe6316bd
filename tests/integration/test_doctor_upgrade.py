"""`rmqkit doctor --target 4.3`, the upgrade preflight, against the real broker.

Before 4.3 (3.10 and 4.0): every object 4.3 refuses or treats differently is planted in a
fresh vhost and must be found, with its check, severity and object; a vhost of rmqkit's own
topology has none of them. On 4.3: each refusal the preflight claims is done there (the
declare that fails, the connection that closes, the policy that is refused, the global
prefetch taken per consumer), so a claim the broker stops making fails this test.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aio_pika
import aiormq
import pytest

from rmqkit.settings import with_vhost
from tests import broker
from tests.integration.test_doctor import put_policy, put_queue

pytestmark = [pytest.mark.broker, pytest.mark.semantics("4.0", "4.3")]
ROOT = Path(__file__).resolve().parents[2]
ORDERS = str(ROOT / "topologies" / "orders.toml")
BEFORE_4_3 = pytest.mark.skipif(
    broker.version() >= (4, 3), reason="a preflight for 4.3 runs before it"
)
ON_4_3 = pytest.mark.skipif(broker.version() < (4, 3), reason="what 4.3 does, seen on 4.3")


def preflight(vhost: str, *extra: str) -> tuple[int, dict[str, Any]]:
    done = broker.cli("doctor", "--target", "4.3", "--json", *extra, vhost=vhost)
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def found(report: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(f["check"], f["severity"], f["object"]) for f in report["findings"]}


def statuses(report: dict[str, Any]) -> dict[str, str]:
    return {c["id"]: c["status"] for c in report["checks"]}


async def _global_qos_consumers(
    vhost: str, queue: str, hold: asyncio.Event, stop: asyncio.Event
) -> None:
    """A legacy application: three consumers on one channel under basic.qos(global=true) 5,
    until ``stop``."""
    conn = await aio_pika.connect(
        with_vhost(broker.BASE_URL, vhost), client_properties={"connection_name": "legacy-app"}
    )
    try:
        channel = await conn.channel()
        await channel.set_qos(prefetch_count=5, global_=True)
        q = await channel.get_queue(queue)

        async def hold_it(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            pass  # never acked: the channel's prefetch is what the broker shows

        for _ in range(3):
            await q.consume(hold_it)
        hold.set()
        await asyncio.wait_for(stop.wait(), 60)
    finally:
        await conn.close()


@BEFORE_4_3
def test_everything_4_3_refuses_or_changes_is_found(fresh_vhost: Callable[[], str]) -> None:
    vhost = fresh_vhost()
    put_queue(vhost, "legacy.v1", "classic", queue_version=1)
    put_queue(vhost, "legacy.lazy", "classic", queue_mode="lazy")
    put_queue(vhost, "legacy.locator", "classic", queue_master_locator="min-masters")
    put_queue(vhost, "legacy.timeout", "classic", consumer_timeout=60000)
    put_queue(vhost, "legacy.nacked", "quorum", delivery_limit=5)
    path = f"/queues/{broker.q(vhost)}/{broker.q('legacy.transient')}"
    body = {"durable": False, "auto_delete": False, "arguments": {}}
    broker.api("PUT", path, json=body).raise_for_status()
    put_policy(vhost, "lazy-all", "^lazy-none$", {"queue-mode": "lazy"})
    put_policy(vhost, "locate", "^locate-none$", {"queue-master-locator": "client-local"})
    code, report = preflight(vhost)
    version = broker.version()
    expected = {
        ("upgrade-path", "critical", vhost),
        ("classic-queue-v1", "critical", "legacy.v1"),
        ("classic-queue-v1", "warning", "legacy.lazy"),
        ("classic-queue-v1", "warning", "lazy-all"),
        ("queue-master-locator", "critical", "legacy.locator"),
        ("queue-master-locator", "critical", "locate"),
        ("classic-consumer-timeout", "critical", "legacy.timeout"),
        ("transient-queues", "warning", "legacy.transient"),
        ("delivery-limit-counting", "warning", "legacy.nacked"),
    }
    got = found(report)
    assert expected <= got, sorted(got)
    if version >= (4, 0):  # 4.0's khepri_db is there and disabled
        assert ("feature-flags", "critical", vhost) in got
    unexpected = {f for f in got if f not in expected and f[0] != "feature-flags"}
    assert not unexpected, sorted(unexpected)
    assert code == 2 and report["target"] == "4.3"


@BEFORE_4_3
def test_a_global_prefetch_is_found_where_the_broker_reports_it(
    fresh_vhost: Callable[[], str],
) -> None:
    """3.x reports a channel's global prefetch; 4.0 to 4.2 do not, and the check says so
    (skipped, never a silent pass)."""
    vhost = fresh_vhost()
    put_queue(vhost, "legacy.shared", "classic")

    async def main() -> tuple[int, dict[str, Any]]:
        hold, stop = asyncio.Event(), asyncio.Event()
        app = asyncio.create_task(_global_qos_consumers(vhost, "legacy.shared", hold, stop))
        await hold.wait()
        report: tuple[int, dict[str, Any]] = (0, {})
        for _ in range(10):  # the channel's stats arrive within a stats interval (5 s)
            await asyncio.sleep(1)
            report = await asyncio.to_thread(preflight, vhost)
            if any(f["check"] == "global-qos" for f in report[1]["findings"]):
                break
        stop.set()
        await app
        return report

    _, report = asyncio.run(main())
    qos = [f for f in report["findings"] if f["check"] == "global-qos"]
    if broker.version() >= (4, 0):
        assert statuses(report)["global-qos"] == "skipped" and not qos
        return
    assert len(qos) == 1, report["findings"]
    assert qos[0]["severity"] == "warning"
    assert "prefetch 5 shared by 3 consumer(s)" in qos[0]["evidence"]
    assert "up to 15 unacked" in qos[0]["evidence"] and "-> 127.0.0.1:" in qos[0]["evidence"]


@BEFORE_4_3
def test_rmqkit_own_topology_needs_no_change_for_4_3(fresh_vhost: Callable[[], str]) -> None:
    """A vhost declared from the shipped orders topology: nothing in it is refused by 4.3;
    with --topology its work queues (consumed by `rmqkit consume`) are not flagged for the
    delivery-limit change."""
    vhost = fresh_vhost()
    declared = broker.cli("declare", ORDERS, vhost=vhost)
    assert declared.returncode == 0, declared.stderr
    _, report = preflight(vhost, "--topology", ORDERS)
    left = {f for f in found(report) if f[0] not in ("upgrade-path", "feature-flags")}
    assert not left, sorted(left)
    _, without = preflight(vhost)  # without the file its work queues' consumers are unknown
    limits = [f for f in without["findings"] if f["check"] == "delivery-limit-counting"]
    assert all("--topology" in f["fix"] for f in limits), limits


def test_a_monitoring_user_runs_the_preflight(fresh_vhost: Callable[[], str]) -> None:
    """The read-only user operators hand to monitoring (monitoring tag, read ".*"): the
    preflight runs; on 3.x the feature flags need the administrator and are skipped, saying
    how to read them."""
    vhost = fresh_vhost()
    user = f"mon-{vhost[-6:]}"
    broker.api(
        "PUT", f"/users/{user}", json={"password": "pw", "tags": "monitoring"}
    ).raise_for_status()
    try:
        perms = {"configure": "", "write": "", "read": ".*"}
        broker.api("PUT", f"/permissions/{broker.q(vhost)}/{user}", json=perms).raise_for_status()
        url = with_vhost(broker.BASE_URL.replace("guest:guest", f"{user}:pw"), vhost)
        done = broker.cli(
            "doctor",
            "--target",
            "4.3",
            "--json",
            env={"RMQKIT_URL": url, "RMQKIT_MANAGEMENT_URL": broker.MGMT},
        )
        assert done.stdout, done.stderr
        report = json.loads(done.stdout)
        state = statuses(report)
        if broker.version() < (4, 0):
            assert state["feature-flags"] == "skipped"
            assert "list_feature_flags" in json.dumps(report["checks"])
        else:
            assert state["feature-flags"] != "skipped"
        assert state["khepri-majority"] == "ok"
        assert done.returncode == (0 if broker.version() >= (4, 3) else 2), done.stderr
    finally:
        broker.api("DELETE", f"/users/{user}")


@ON_4_3
def test_on_4_3_the_preflight_passes_on_a_clean_vhost(fresh_vhost: Callable[[], str]) -> None:
    code, report = preflight(fresh_vhost())
    assert (code, report["findings"]) == (0, [])
    assert statuses(report)["upgrade-path"] == "ok" and statuses(report)["feature-flags"] == "ok"


async def _refusal(vhost: str, declare: Callable[[Any], Any]) -> BaseException | None:
    conn = await aio_pika.connect(with_vhost(broker.BASE_URL, vhost))
    try:
        channel = await conn.channel()
        await declare(channel)
    except (aiormq.exceptions.AMQPError, aio_pika.exceptions.AMQPError) as exc:
        return exc
    finally:
        if not conn.is_closed:
            await conn.close()
    return None


@ON_4_3
def test_what_the_preflight_says_4_3_refuses_it_refuses(fresh_vhost: Callable[[], str]) -> None:
    vhost = fresh_vhost()

    def queue(name: str, args: dict[str, Any], durable: bool = True) -> Callable[[Any], Any]:
        return lambda ch: ch.declare_queue(name, durable=durable, arguments=args or None)

    v1 = asyncio.run(_refusal(vhost, queue("v1", {"x-queue-version": 1})))
    assert "unsupported queue version" in str(v1), v1
    locator = asyncio.run(_refusal(vhost, queue("loc", {"x-queue-master-locator": "min-masters"})))
    assert "queue_master_locator" in str(locator), locator
    timeout = asyncio.run(
        _refusal(vhost, queue("ct", {"x-queue-type": "classic", "x-consumer-timeout": 1000}))
    )
    assert "x-consumer-timeout" in str(timeout), timeout
    # accepted and ignored (a warning, not critical): queue mode and transient queues
    assert asyncio.run(_refusal(vhost, queue("lazy", {"x-queue-mode": "lazy"}))) is None
    assert asyncio.run(_refusal(vhost, queue("transient", {}, durable=False))) is None
    assert {"v1", "loc", "ct"}.isdisjoint(broker.queue_names(vhost))
    body = {"pattern": "^x$", "definition": {"queue-master-locator": "client-local"}}
    refused = broker.api("PUT", f"/policies/{broker.q(vhost)}/locate", json=body)
    assert refused.status_code == 400 and "queue-master-locator" in refused.text
    # basic.qos(global=true) is taken per consumer
    put_queue(vhost, "shared", "classic")

    async def consumers() -> list[dict[str, Any]]:
        hold, stop = asyncio.Event(), asyncio.Event()
        app = asyncio.create_task(_global_qos_consumers(vhost, "shared", hold, stop))
        await hold.wait()
        rows: list[dict[str, Any]] = []
        for _ in range(20):
            await asyncio.sleep(0.5)
            rows = broker.api("GET", f"/consumers/{broker.q(vhost)}").json()
            if len(rows) == 3:
                break
        stop.set()
        await app
        return rows

    rows = asyncio.run(consumers())
    assert sorted(r["prefetch_count"] for r in rows) == [5, 5, 5], rows

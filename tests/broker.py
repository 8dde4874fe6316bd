"""Test helpers that talk to the real broker (synchronous wrappers for readability).

The suite reaches the broker under test only through the environment, so it runs unchanged on
each version `scripts/broker-up --version 3.10|4.0|4.3 --env` prints:

- ``RMQKIT_TEST_URL`` (AMQP, default the host's node on 5672) and ``RMQKIT_TEST_MANAGEMENT_URL``
  (default 15672): every settings object, CLI subprocess and direct client here is built from
  them (``settings_for``, ``cli_env``), never from rmqkit's own defaults;
- ``RMQKIT_TEST_RABBITMQCTL``: the command that runs rabbitmqctl for that node (e.g.
  ``scripts/broker-ctl --version 4.3``). Unset, the host's ``rabbitmqctl -n <node>``, the node
  name read from the management API, so a test never silently reaches another node.

``version()`` is the broker's version as the management API reports it, for tests whose
expectation differs by version (each such branch says what differs and why).
"""

from __future__ import annotations

import asyncio
import functools
import os
import shlex
import subprocess
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aio_pika
import aiormq
import httpx

from rmqkit.broker.codec.properties import TypedProperties
from rmqkit.settings import Settings, load_settings, with_vhost
from tests import cli_zygote

BASE_URL = os.environ.get("RMQKIT_TEST_URL", "amqp://guest:guest@127.0.0.1:5672/")
MGMT = os.environ.get("RMQKIT_TEST_MANAGEMENT_URL", "http://127.0.0.1:15672")
AUTH = ("guest", "guest")
RABBITMQCTL = os.environ.get("RMQKIT_TEST_RABBITMQCTL", "")
T = TypeVar("T")


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def api(method: str, path: str, **kwargs: Any) -> httpx.Response:
    """Call the management API directly (tests check the broker, not our client)."""
    return httpx.request(method, MGMT + "/api" + path, auth=AUTH, timeout=10, **kwargs)


def q(name: str) -> str:
    from urllib.parse import quote

    return quote(name, safe="")


def create_vhost(prefix: str) -> str:
    name = f"rmqkit-test-{prefix}-{uuid.uuid4().hex[:6]}"
    api("PUT", f"/vhosts/{q(name)}", json={}).raise_for_status()
    perms = {"configure": ".*", "write": ".*", "read": ".*"}
    api("PUT", f"/permissions/{q(name)}/guest", json=perms).raise_for_status()
    return name


def delete_vhost(name: str) -> None:
    api("DELETE", f"/vhosts/{q(name)}")


@functools.cache
def _overview() -> dict[str, Any]:
    response = api("GET", "/overview")
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result


def version() -> tuple[int, int]:
    """(major, minor) of the broker under test, from the management API (e.g. (4, 3))."""
    major, minor = str(_overview()["rabbitmq_version"]).split(".")[:2]
    return int(major), int(minor)


def node_name() -> str:
    """The Erlang node name of the broker under test (e.g. ``rmq43@vm``)."""
    return str(_overview()["node"])


def no_delivery_limit() -> dict[str, Any]:
    """x-arguments for a quorum queue without a delivery limit, as `rmqkit declare` makes a
    parking queue: 4.0+ gives every quorum queue a limit of 20 unless told -1 (and rmqkit refuses
    to browse a parking queue with a limit); 3.x has none by default and rejects -1."""
    return {"x-delivery-limit": -1} if version() >= (4, 0) else {}


def rabbitmqctl(
    *args: str, timeout: float = 60, check: bool = False
) -> subprocess.CompletedProcess[str]:
    """rabbitmqctl ARGS for the node under test (RMQKIT_TEST_RABBITMQCTL, see the docstring)."""
    command = shlex.split(RABBITMQCTL) if RABBITMQCTL else ["rabbitmqctl", "-n", node_name()]
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=timeout, check=check
    )


def settings_for(vhost: str) -> Settings:
    """Settings for ``vhost`` on the broker under test, management API included."""
    return load_settings(url=with_vhost(BASE_URL, vhost), management_url=MGMT)


def cli_env(vhost: str | None = None) -> dict[str, str]:
    """This process's environment without RMQKIT_*, plus RMQKIT_URL (``vhost`` on the broker
    under test; the bare base URL if None) and RMQKIT_MANAGEMENT_URL: for subprocesses."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RMQKIT_")}
    env["RMQKIT_URL"] = BASE_URL if vhost is None else with_vhost(BASE_URL, vhost)
    env["RMQKIT_MANAGEMENT_URL"] = MGMT
    return env


def wait_for(fn: Callable[[], T], *, timeout_s: float = 15.0, interval_s: float = 0.2) -> T:
    """Poll ``fn`` until it returns something truthy (management stats lag ~5 s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = fn()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval_s)


def mgmt_queue(vhost: str, name: str) -> dict[str, Any] | None:
    response = api("GET", f"/queues/{q(vhost)}/{q(name)}")
    return response.json() if response.status_code == 200 else None


def queue_names(vhost: str) -> set[str]:
    return {x["name"] for x in api("GET", f"/queues/{q(vhost)}").json()}


async def _depths(vhost: str, names: list[str]) -> dict[str, int | None]:
    conn = await aio_pika.connect(with_vhost(BASE_URL, vhost))
    out: dict[str, int | None] = {}
    try:
        for name in names:
            channel = await conn.channel()
            try:
                declared = await channel.declare_queue(name, passive=True)
                out[name] = declared.declaration_result.message_count
                await channel.close()
            except Exception:
                out[name] = None
    finally:
        await conn.close()
    return out


def depths(vhost: str, names: list[str] | set[str]) -> dict[str, int | None]:
    """Ready-message counts by AMQP passive declare: immediate, unlike management stats."""
    result: dict[str, int | None] = run(_depths(vhost, sorted(names)))
    return result


async def _publish(
    vhost: str, exchange: str, routing_key: str, bodies: list[bytes], headers: dict[str, Any]
) -> None:
    conn = await aio_pika.connect(with_vhost(BASE_URL, vhost))
    try:
        channel = await conn.channel(on_return_raises=True)
        target = (
            channel.default_exchange if exchange == "" else await channel.get_exchange(exchange)
        )
        for body in bodies:
            await target.publish(
                aio_pika.Message(
                    body,
                    message_id=uuid.uuid4().hex,
                    headers=headers,
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                ),
                routing_key=routing_key,
                mandatory=True,
            )
    finally:
        await conn.close()


def publish(
    vhost: str,
    exchange: str,
    routing_key: str,
    bodies: list[bytes],
    headers: dict[str, Any] | None = None,
) -> None:
    """Publish with confirms and mandatory; raises if the broker returns or nacks."""
    run(_publish(vhost, exchange, routing_key, bodies, headers or {}))


async def _reject_one(vhost: str, queue: str) -> bool:
    conn = await aio_pika.connect(with_vhost(BASE_URL, vhost))
    try:
        channel = await conn.channel()
        source = await channel.get_queue(queue, ensure=False)
        message = await source.get(fail=False)
        if message is None:
            return False
        await message.reject(requeue=False)
        return True
    finally:
        await conn.close()


def reject_one(vhost: str, queue: str) -> bool:
    result: bool = run(_reject_one(vhost, queue))
    return result


def cli(
    *args: str, vhost: str | None = None, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run the real `rmqkit` command in a subprocess, so exit codes are the real ones.

    With ``vhost``, RMQKIT_URL and RMQKIT_MANAGEMENT_URL name the broker under test; so does
    RMQKIT_MANAGEMENT_URL when ``env`` points RMQKIT_URL at it. Otherwise the command gets no
    RMQKIT_* at all (tests of flags, bad URLs, unreachable brokers)."""
    full_env = cli_env(vhost) if vhost is not None else _without_rmqkit()
    full_env.update(env or {})
    target = full_env.get("RMQKIT_URL")
    if target and _netloc(target) == _netloc(BASE_URL):
        full_env.setdefault("RMQKIT_MANAGEMENT_URL", MGMT)
    # A process of its own, forked from one that has the imports done (tests/cli_zygote.py):
    # the same exit codes and output, without a second of CPU per call for the imports.
    return cli_zygote.run(list(args), env=full_env, timeout=timeout)


def _without_rmqkit() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("RMQKIT_")}


def _netloc(url: str) -> tuple[str | None, int | None]:
    parts = urlsplit(url.split(",")[0].strip())
    return parts.hostname, parts.port


async def _publish_with_ids(
    vhost: str,
    exchange: str,
    routing_key: str,
    messages: list[tuple[str, bytes]],
    headers: Callable[[int], dict[str, Any]] | None = None,
    routing: Callable[[int], str] | None = None,
) -> None:
    conn = await aio_pika.connect(with_vhost(BASE_URL, vhost))
    try:
        channel = await conn.channel(on_return_raises=True)
        target = (
            channel.default_exchange if exchange == "" else await channel.get_exchange(exchange)
        )
        window = 200  # pipelined confirms: fast, still every publish confirmed
        pending: list[Any] = []
        for index, (message_id, body) in enumerate(messages):
            pending.append(
                target.publish(
                    aio_pika.Message(
                        body,
                        message_id=message_id,
                        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                        headers=headers(index) if headers else None,
                    ),
                    routing_key=routing(index) if routing else routing_key,
                    mandatory=True,
                )
            )
            if len(pending) >= window:
                await asyncio.gather(*pending)
                pending = []
        await asyncio.gather(*pending)
    finally:
        await conn.close()


async def _publish_exact(
    vhost: str, exchange: str, messages: list[tuple[str, str | None, bytes, dict[str, Any]]]
) -> None:
    conn = await aiormq.connect(with_vhost(BASE_URL, vhost))
    try:
        channel = await conn.channel()
        for routing_key, message_id, body, headers in messages:
            props = TypedProperties(message_id=message_id, delivery_mode=2, headers=headers)
            await channel.basic_publish(
                body, exchange=exchange, routing_key=routing_key, properties=props
            )
    finally:
        await conn.close()


def publish_exact(
    vhost: str, exchange: str, messages: list[tuple[str, str | None, bytes, dict[str, Any]]]
) -> None:
    """Publish (routing key, message_id, body, headers) with confirms, the id exactly as given:
    None stays absent (aio-pika and aiormq's plain properties would give it a random id)."""
    run(_publish_exact(vhost, exchange, messages))


def publish_with_ids(
    vhost: str,
    exchange: str,
    routing_key: str,
    messages: list[tuple[str, bytes]],
    headers: Callable[[int], dict[str, Any]] | None = None,
    routing: Callable[[int], str] | None = None,
) -> None:
    """Publish (message_id, body) pairs, confirmed and mandatory, in a pipelined window.

    ``headers(i)`` / ``routing(i)`` give the i-th message's headers and routing key."""
    run(_publish_with_ids(vhost, exchange, routing_key, messages, headers, routing))


async def _drain(vhost: str, queue: str) -> list[dict[str, Any]]:
    conn = await aio_pika.connect(with_vhost(BASE_URL, vhost))
    out: list[dict[str, Any]] = []
    try:
        channel = await conn.channel()
        source = await channel.get_queue(queue, ensure=False)
        while True:
            message = await source.get(fail=False, no_ack=True)
            if message is None:
                return out
            out.append(
                {
                    "message_id": message.message_id,
                    "headers": dict(message.headers or {}),
                    "body": message.body,
                }
            )
    finally:
        await conn.close()


def drain(vhost: str, queue: str) -> list[dict[str, Any]]:
    """Take every message out of ``queue`` (destructive; for the end of a test)."""
    result: list[dict[str, Any]] = run(_drain(vhost, queue))
    return result


async def _drain_consumed(vhost: str, queue: str) -> list[dict[str, Any]]:
    conn = await aio_pika.connect(with_vhost(BASE_URL, vhost))
    out: list[dict[str, Any]] = []
    try:
        channel = await conn.channel()
        source = await channel.declare_queue(queue, passive=True)
        count = source.declaration_result.message_count or 0
        if not count:
            return out
        async with source.iterator() as messages:
            async for message in messages:
                await message.ack()
                headers = dict(message.headers or {})
                out.append(
                    {"message_id": message.message_id, "headers": headers, "body": message.body}
                )
                if len(out) == count:
                    return out
        return out
    finally:
        await conn.close()


def drain_consumed(vhost: str, queue: str) -> list[dict[str, Any]]:
    """``drain`` by basic.consume, for a single-active-consumer quorum queue (it refuses
    basic.get: RESOURCE_LOCKED); the messages ready when it starts."""
    result: list[dict[str, Any]] = run(asyncio.wait_for(_drain_consumed(vhost, queue), 30))
    return result


def cli_json_lines(*args: str, vhost: str | None = None) -> list[dict[str, Any]]:
    """Run the CLI and parse its NDJSON stdout (asserting it succeeded)."""
    import json

    result = cli(*args, vhost=vhost, timeout=120)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]

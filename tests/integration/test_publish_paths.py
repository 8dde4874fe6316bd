"""The same publishing scenarios through both paths: `rmqkit publish --ndjson --topology` (a
subprocess) and ``rmqkit.Publisher`` (in-process). Each scenario ends with what the broker holds,
read back with basic.get, and both paths must leave the same: lanes, delay, an encrypted field, a
message_id that is a sensitive value (refused), unroutable, too large, and what AMQP cannot carry
(an id over 255 bytes, a header integer over 64 bits)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import rmqkit
from rmqkit.broker.session import session
from rmqkit.crypto import KeyRing, decrypt_fields, generate_keyring
from rmqkit.topology import declare_topology, load_topology
from tests import broker

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]
SENTINEL = "SENTINEL-5d81e0-TAXID"
# No queue has a default delay: declaring it declares no delay ladder, so a delayed publish
# must declare the ladder itself (the Publisher probed its entry before declaring it).
TOPOLOGY = """
[exchanges.jobs]
type = "direct"
[queues."jobs.work"]
bind = [{ exchange = "jobs", routing_key = "job" }]
retry_delays = []

[exchanges.media]
type = "direct"
[queues."media.work"]
bind = [{ exchange = "media", routing_key = "media" }]
retry_delays = []
[queues."media.work".lanes.large]
header = { "x-lane" = "large" }
[queues."media.work".lanes.big]
body_over = 1000

[exchanges.people]
type = "direct"
[queues."people.work"]
bind = [{ exchange = "people", routing_key = "person" }]
retry_delays = []
sensitive_fields = ["tax_id"]
encrypt = true
"""
LANES = ("media.work.lane.large", "media.work.lane.big")
QUEUES = ("jobs.work", "media.work", *LANES, "people.work")


@dataclass(frozen=True)
class Message:
    body: str
    message_id: str
    headers: dict[str, Any] | None = None
    routing_key: str | None = None


@dataclass(frozen=True)
class Sent:
    code: int  # the exit code (CLI) or the raised error's (API); 0: all confirmed
    text: str  # stderr, or the error's message


def via_cli(
    vhost: str,
    topology: Path,
    exchange: str,
    routing_key: str,
    messages: list[Message],
    *,
    delay: str | None = None,
    ring: KeyRing | None = None,
) -> Sent:
    records = []
    for m in messages:
        record: dict[str, Any] = {"body": m.body, "message_id": m.message_id}
        if m.headers is not None:
            record["headers"] = m.headers
        if m.routing_key is not None:
            record["routing_key"] = m.routing_key
        records.append(json.dumps(record) + "\n")
    args = ["publish", exchange, routing_key, "--ndjson", "--topology", str(topology)]
    args += ["--delay", delay] if delay is not None else []
    env = broker.cli_env(vhost)
    env["RMQKIT_KEYRING"] = ring.to_json() if ring is not None else ""
    env["RMQKIT_KEYRING_FILE"] = ""
    result = subprocess.run(
        [sys.executable, "-m", "rmqkit", *args],
        input="".join(records),
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    return Sent(result.returncode, result.stderr)


def via_api(
    vhost: str,
    topology: Path,
    exchange: str,
    routing_key: str,
    messages: list[Message],
    *,
    delay: str | None = None,
    ring: KeyRing | None = None,
) -> Sent:
    settings = broker.settings_for(vhost)

    async def main() -> Sent:
        async with rmqkit.Publisher.connect(settings, topology=topology, keyring=ring) as pub:
            batch = [
                rmqkit.PublishMessage(
                    m.body.encode(), m.message_id, m.headers, m.routing_key, delay=delay
                )
                for m in messages
            ]
            try:
                await pub.publish_many(exchange, routing_key, batch)
            except rmqkit.RmqkitError as exc:
                return Sent(exc.exit_code, str(exc))
        return Sent(0, "")

    result: Sent = broker.run(main())
    return result


Via = Callable[..., Sent]


@pytest.fixture(params=["cli", "api"])
def via(request: pytest.FixtureRequest) -> Via:
    """Each test runs once through `rmqkit publish` and once through ``rmqkit.Publisher``."""
    chosen: Via = via_cli if request.param == "cli" else via_api
    return chosen


def declared(vhost: str, path: Path) -> None:
    """TOPOLOGY declared in ``vhost``, with the lane queues where `declare` does not make them."""
    settings = broker.settings_for(vhost)
    broker.run(declare_topology(settings, load_topology(path)))

    async def lanes() -> None:
        async with session(settings) as s:
            missing = [q for q in LANES if not await s.queue_exists(q)]
            queues = [
                {"queue": q, "durable": True, "arguments": {"x-queue-type": "quorum"}}
                for q in missing
            ]
            await s.declare([], queues, [])

    broker.run(lanes())


@pytest.fixture
def setup(fresh_vhost: Callable[[], str], tmp_path: Path) -> tuple[str, Path]:
    vhost = fresh_vhost()
    path = tmp_path / "paths.toml"
    path.write_text(TOPOLOGY)
    declared(vhost, path)
    return vhost, path


def held(vhost: str) -> dict[str, list[tuple[bytes, str, dict[str, Any]]]]:
    """Every queue's messages (body, message_id, headers without the broker's own), sorted by
    id; queues that hold none are left out."""
    out = {}
    for queue in QUEUES:
        got = broker.drain(vhost, queue)
        if got:
            out[queue] = sorted(
                (
                    m["body"],
                    m["message_id"],
                    {k: v for k, v in (m["headers"] or {}).items() if k != "x-delivery-count"},
                )
                for m in got
            )
    return out


def ladder(vhost: str) -> set[str]:
    return {q for q in broker.queue_names(vhost) if q.startswith("rmqkit.delay")}


# --- lanes ---------------------------------------------------------------------------------------
def test_lane_by_header_and_by_body_size(via: Via, setup: tuple[str, Path]) -> None:
    vhost, path = setup
    messages = [
        Message("small", "l-1"),
        Message("tagged", "l-2", headers={"x-lane": "large", "k": "v"}),
        Message("B" * 2000, "l-3"),
    ]
    sent = via(vhost, path, "media", "media", messages)
    assert sent.code == 0, sent.text
    assert held(vhost) == {
        "media.work": [(b"small", "l-1", {})],
        "media.work.lane.large": [(b"tagged", "l-2", {"x-lane": "large", "k": "v"})],
        "media.work.lane.big": [(b"B" * 2000, "l-3", {})],
    }


# --- delay ---------------------------------------------------------------------------------------
@pytest.mark.timing
def test_delay_through_a_ladder_the_publish_declares(via: Via, setup: tuple[str, Path]) -> None:
    """No ladder exists before the publish (no queue has a default delay): it is declared,
    every message waits in it, then arrives in the work queue with the delay header. (The
    Publisher probed the ladder's entry exchange before declaring it: 65, nothing sent.)"""
    vhost, path = setup
    assert ladder(vhost) == set()
    messages = [Message(f"d{i}", f"d-{i}") for i in range(5)]
    sent = via(vhost, path, "jobs", "job", messages, delay="5s")
    published = time.monotonic()
    assert sent.code == 0, sent.text
    assert broker.depths(vhost, ["jobs.work"])["jobs.work"] == 0, "arrived before its delay"
    assert sum(d or 0 for d in broker.depths(vhost, ladder(vhost)).values()) == 5
    got: list[dict[str, Any]] = []
    while len(got) < 5 and time.monotonic() < published + 30:
        got += broker.drain(vhost, "jobs.work")
        time.sleep(0.1)
    assert sorted((m["body"], m["message_id"]) for m in got) == [
        (f"d{i}".encode(), f"d-{i}") for i in range(5)
    ]
    assert all(m["headers"]["rmqkit-delay-ms"] == 5000 for m in got)


# --- encryption ----------------------------------------------------------------------------------
def _person(i: int) -> dict[str, Any]:
    return {"id": i, "tax_id": f"{SENTINEL}-{i}", "city": "Lyon"}


def test_sensitive_field_is_ciphertext_on_the_broker(via: Via, setup: tuple[str, Path]) -> None:
    vhost, path = setup
    ring = generate_keyring()
    messages = [Message(json.dumps(_person(i)), f"p-{i}") for i in range(3)]
    sent = via(vhost, path, "people", "person", messages, ring=ring)
    assert sent.code == 0, sent.text
    queues = held(vhost)
    assert list(queues) == ["people.work"]
    got = queues["people.work"]
    assert [message_id for _, message_id, _ in got] == ["p-0", "p-1", "p-2"]
    for body, message_id, _ in got:
        assert SENTINEL.encode() not in body  # the broker holds ciphertext only
        plain = decrypt_fields(json.loads(body), None, ring)
        assert plain == _person(int(message_id[2:]))


def test_a_message_id_that_is_a_sensitive_value_publishes_nothing(
    via: Via, setup: tuple[str, Path]
) -> None:
    """The id would carry the encrypted field's value in plaintext (a property every log line,
    parking list and export shows). Refused (65) before anything of the call is sent, and the
    error does not quote it. Before: both paths published it (CLI and API alike)."""
    vhost, path = setup
    ring = generate_keyring()
    secret = f"{SENTINEL}-7"
    messages = [
        Message(json.dumps(_person(1)), "fine-1"),
        Message(json.dumps({"id": 7, "tax_id": secret}), secret),
    ]
    sent = via(vhost, path, "people", "person", messages, ring=ring)
    assert sent.code == 65, sent.text
    assert "sensitive field tax_id" in sent.text and "message 2" in sent.text
    assert SENTINEL not in sent.text
    assert held(vhost) == {}  # not even the first, innocent one


# --- what the broker refuses ------------------------------------------------------------------
def test_unroutable_is_65_and_the_routed_one_is_delivered(
    via: Via, setup: tuple[str, Path]
) -> None:
    vhost, path = setup
    messages = [Message("routed", "u-1"), Message("lost", "u-2", routing_key="nowhere")]
    sent = via(vhost, path, "jobs", "job", messages)
    assert sent.code == 65, sent.text
    assert "1 message(s) were unroutable" in sent.text and "u-2" in sent.text
    assert held(vhost) == {"jobs.work": [(b"routed", "u-1", {})]}


@pytest.mark.semantics("4.0", "4.3")  # the limit: 128 MiB on 3.x, 16 MiB on 4.x
def test_a_message_over_max_message_size_is_refused_and_the_rest_delivered(
    via: Via, setup: tuple[str, Path]
) -> None:
    """The broker closes the channel for a message over max_message_size (3.x: 128 MiB, 4.x:
    16 MiB). It is MessageTooLarge (65), never sent again; the messages before and after it
    are delivered. Before: the CLI stopped there (65 with `rmqkit plan` and "run the same
    command again" advice that fails again) and never sent the message after it."""
    vhost, path = setup
    limit = (16 if broker.version() >= (4, 0) else 128) * 1024 * 1024
    big = "x" * (limit + 1024)
    messages = [Message("before", "t-1"), Message(big, "t-2"), Message("after", "t-3")]
    sent = via(vhost, path, "jobs", "job", messages)
    assert sent.code == 65, sent.text
    assert "max_message_size" in sent.text and "t-2" in sent.text
    got = broker.drain(vhost, "jobs.work")
    # resent after the channel closed, so a copy may arrive twice; none is lost, the big one
    # is not there
    assert {(m["body"], m["message_id"]) for m in got} == {(b"before", "t-1"), (b"after", "t-3")}


@pytest.mark.parametrize(
    "bad",
    [
        Message("wide", "w-1", headers={"n": 2**70}),
        Message("long", "i" * 256),
    ],
    ids=["header-int-over-64-bits", "id-over-255-bytes"],
)
def test_what_amqp_cannot_carry_publishes_nothing(
    via: Via, setup: tuple[str, Path], bad: Message
) -> None:
    """The last message of the input cannot be encoded: 65 naming it, and not even the first
    is sent. Before: the CLI published the first, then failed with a traceback (exit 1)."""
    vhost, path = setup
    sent = via(vhost, path, "jobs", "job", [Message("ok", "ok-1"), bad])
    assert sent.code == 65, sent.text
    assert "message 2" in sent.text and "Traceback" not in sent.text
    assert held(vhost) == {}
    # the same publisher (API) or command (CLI) then publishes what it can carry
    assert via(vhost, path, "jobs", "job", [Message("ok", "ok-2")]).code == 0
    assert held(vhost) == {"jobs.work": [(b"ok", "ok-2", {})]}


def test_both_paths_leave_the_same_on_the_broker(
    fresh_vhost: Callable[[], str], tmp_path: Path
) -> None:
    """One input through the CLI and through the Publisher, each into its own vhost: lanes,
    headers and ids alike, message for message."""
    path = tmp_path / "paths.toml"
    path.write_text(TOPOLOGY)
    messages = [
        Message("small", "s-1", headers={"tenant": "t1"}),
        Message("tagged", "s-2", headers={"x-lane": "large"}),
        Message("B" * 1500, "s-3"),
    ]
    snapshots = []
    for publish in (via_cli, via_api):
        vhost = fresh_vhost()
        declared(vhost, path)
        assert publish(vhost, path, "media", "media", messages).code == 0
        snapshots.append(held(vhost))
    assert snapshots[0] == snapshots[1] and len(snapshots[0]) == 3

"""Outcome hooks (docs/hooks.md) against the real broker, on tests/topologies/jobs.toml.

The embedded consumer in this process: success, retry and park each fire their hook once with
the right fields, while the broker ends holding what it holds without hooks (work and wait
queues empty, the parked message in parking with its reason); a hook that raises, or hangs past
its timeout, changes nothing the broker holds and the consumer goes on with the next messages.
``rmqkit consume`` in a subprocess picks up the handler module's ``rmqkit_hooks``. Adversarial:
on a queue whose fields are decrypted for the handler, whose errors quote a decrypted value, no
hook event (its fields, its repr, what the hook writes) holds that plaintext.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import rmqkit
from rmqkit import headers as h
from rmqkit.consumer.hooks import Hooks, OutcomeEvent
from rmqkit.crypto import KeyRing, encrypt_fields, generate_keyring
from rmqkit.topology import load_topology
from rmqkit.topology.expand import wait_queue_names
from tests import broker
from tests.consumer_harness import JOBS, ConsumerProcess, wait_until
from tests.hook_handlers import as_line, handle, read_events

WORK, PARKING = "jobs.work", "jobs.work.parking"
SPEC = load_topology(Path(JOBS))
WAITS = [name for tier in wait_queue_names(SPEC, WORK) for name, _ in tier]
ALL = [WORK, *WAITS, PARKING]
SENTINEL = "SENTINEL-Hk27"


def body(i: str, kind: str) -> bytes:
    return json.dumps({"id": i, "kind": kind, "customer": {"name": f"{SENTINEL}-{i}"}}).encode()


async def publish(vhost: str, messages: list[tuple[str, bytes]]) -> None:
    await asyncio.to_thread(broker.publish_with_ids, vhost, "jobs", "job", messages)


async def depths(vhost: str) -> dict[str, int | None]:
    result: dict[str, int | None] = await asyncio.to_thread(broker.depths, vhost, ALL)
    return result


async def until(predicate: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def settled_to(vhost: str, expected: dict[str, int], timeout_s: float = 15.0) -> bool:
    want = {n: expected.get(n, 0) for n in ALL}
    deadline = time.monotonic() + timeout_s
    while await depths(vhost) != want:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


def consumer(
    vhost: str,
    hooks: Hooks | None,
    keyring: KeyRing | None = None,
    handler: Callable[[rmqkit.Message], Any] = handle,
) -> rmqkit.Consumer:
    return rmqkit.Consumer(
        handler,
        queue=WORK,
        topology=SPEC,
        settings=broker.settings_for(vhost),
        hooks=hooks if hooks is not None else Hooks(),
        keyring=keyring,
    )


def test_success_retry_and_park_each_fire_their_hook_once(jobs_vhost: str) -> None:
    events: list[OutcomeEvent] = []

    async def record(event: OutcomeEvent) -> None:
        events.append(event)

    def by(kind: str) -> dict[str | None, OutcomeEvent]:
        return {e.message_id: e for e in events if e.kind == kind}

    async def main() -> None:
        hooks = Hooks(on_success=record, on_retry=record, on_park=record)
        messages = [(f"ok-{n}", body(f"ok-{n}", "ok")) for n in range(3)]
        messages += [("tr-1", body("tr-1", "transient")), ("pm-1", body("pm-1", "permanent"))]
        async with consumer(jobs_vhost, hooks) as running:
            await publish(jobs_vhost, messages)
            # 5 handled once, the transient one twice (retried through the 1s tier)
            assert await until(lambda: running.processed == 6 and len(events) == 6), events
            assert await settled_to(jobs_vhost, {PARKING: 1})
        assert sorted(by("success")) == ["ok-0", "ok-1", "ok-2", "tr-1"]
        assert list(by("retry")) == ["tr-1"] and list(by("park")) == ["pm-1"]
        assert len(events) == 6  # each outcome once: no more after the stop either
        for one in events:
            assert (one.queue, one.exchange, one.routing_key) == (WORK, "jobs", "job")
        assert by("success")["tr-1"].attempt == 2 and by("success")["ok-0"].attempt == 1
        retry = by("retry")["tr-1"]
        assert (retry.attempt, retry.tier, retry.delay_s, retry.reason) == (1, "1s", 1.0, None)
        assert retry.target_queue in WAITS
        assert retry.error_type == "ConnectionError"
        assert isinstance(retry.exception, ConnectionError)
        park = by("park")["pm-1"]
        assert (park.attempt, park.reason, park.target_queue) == (1, "permanent", PARKING)
        assert park.error_type == "rmqkit.Permanent"
        assert isinstance(park.exception, rmqkit.Permanent)
        assert "never be billed" in str(park.error_message)
        # what the broker holds: the parked one, with the reason the hook was given
        (parked,) = await asyncio.to_thread(broker.drain, jobs_vhost, PARKING)
        assert parked["message_id"] == "pm-1"
        assert parked["headers"][h.PARK_REASON] == park.reason

    asyncio.run(main())


async def _hang(event: OutcomeEvent) -> None:
    await asyncio.sleep(60)


def _raise(event: OutcomeEvent) -> None:
    raise RuntimeError(f"hook bug on {event.message_id}")


def _hang_sync(event: OutcomeEvent) -> None:
    time.sleep(3)  # past the 0.3 s timeout; the thread is abandoned (a daemon)


FAULTY: dict[str, Hooks | None] = {
    "none": None,
    "raises": Hooks(on_success=_raise, on_retry=_raise, on_park=_raise, timeout_s=0.3),
    "hangs": Hooks(on_success=_hang, on_retry=_hang, on_park=_hang, timeout_s=0.3),
    "hangs-sync": Hooks(on_park=_hang_sync, on_retry=_hang_sync, timeout_s=0.3),
}


@pytest.mark.timing
@pytest.mark.parametrize("fault", list(FAULTY))
def test_a_raising_or_hung_hook_changes_nothing_the_broker_holds(
    jobs_vhost: str, fault: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Two batches: the second is published after the first one's hooks failed (or while they
    hang), and is settled as fast as without hooks; both end as they do without hooks."""

    async def main() -> dict[str, float]:
        taken: dict[str, float] = {}
        async with consumer(jobs_vhost, FAULTY[fault]) as running:
            for batch in ("a", "b"):
                started = time.monotonic()
                messages = [(f"{batch}-ok-{n}", body(f"{batch}-ok-{n}", "ok")) for n in range(10)]
                messages += [
                    (f"{batch}-pm-{n}", body(f"{batch}-pm-{n}", "permanent")) for n in range(10)
                ]
                messages.append((f"{batch}-tr", body(f"{batch}-tr", "transient")))
                before = running.processed
                await publish(jobs_vhost, messages)
                # 21 messages, the transient one twice (its retry waits the 1 s tier)
                assert await until(lambda n=before: running.processed - n == 22), running.processed
                taken[batch] = time.monotonic() - started
                parked = 10 if batch == "a" else 20
                assert await settled_to(jobs_vhost, {PARKING: parked})
        # after the stop: nothing came back to the work queue (every ack went out)
        assert await settled_to(jobs_vhost, {PARKING: 20}, timeout_s=5)
        parked = await asyncio.to_thread(broker.drain, jobs_vhost, PARKING)
        assert sorted(m["message_id"] for m in parked) == sorted(
            f"{b}-pm-{n}" for b in "ab" for n in range(10)
        )
        assert {m["headers"][h.PARK_REASON] for m in parked} == {"permanent"}
        return taken

    with caplog.at_level("INFO", logger="rmqkit.consumer"):
        taken = asyncio.run(main())
    # the retry's 1 s wait bounds each batch from below; a hung hook adds nothing to it
    # (22 hook calls at 0.3 s each would be 6.6 s if the messages waited for them)
    assert all(t < 4.0 for t in taken.values()), taken
    lines = [r.getMessage() for r in caplog.records]
    if fault == "raises":
        assert any("hook on_park" in m and "RuntimeError: hook bug on" in m for m in lines)
    if fault.startswith("hangs"):
        assert any(m.startswith("hook on_") and "did not return within 0.3s" in m for m in lines)
    consuming = [m for m in lines if m.startswith("consuming jobs.work")]
    assert consuming and ("hooks: none" in consuming[0]) == (fault == "none")
    print(f"\n{fault}: settled in {taken}")


def test_a_hook_still_running_holds_no_ack(jobs_vhost: str) -> None:
    """Adversarial: every hook call hangs (well within its 30 s timeout) when the consumer is
    cancelled outright, which hands back everything it has not acked. Nothing comes back: each
    message was acked (or its copy confirmed and then acked) while its hook still ran."""
    started: list[str | None] = []

    async def hang(event: OutcomeEvent) -> None:
        started.append(event.message_id)
        await asyncio.sleep(60)

    async def main() -> None:
        hooks = Hooks(on_success=hang, on_park=hang, on_retry=hang, timeout_s=30)
        running = consumer(jobs_vhost, hooks)
        await running.start()
        task = asyncio.create_task(running.run())
        messages = [(f"h-ok-{n}", body(f"h-ok-{n}", "ok")) for n in range(5)]
        messages.append(("h-pm", body("h-pm", "permanent")))
        await publish(jobs_vhost, messages)
        assert await until(lambda: running.processed == 6)
        assert len(started) == 1  # the first hook call hangs; the others wait behind it
        await asyncio.sleep(0.5)  # the batched ack goes out within milliseconds
        task.cancel()  # stop at once: whatever is unacked goes back to the work queue
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert await settled_to(jobs_vhost, {PARKING: 1}, timeout_s=5)

    asyncio.run(main())


def test_rmqkit_consume_picks_up_the_handler_module_s_hooks(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    ledger = tmp_path / "ledger.db"
    out = ledger.with_suffix(".hooks.jsonl")
    running = ConsumerProcess(jobs_vhost, ledger, handler="tests.hook_handlers:handle")
    consumers.append(running)
    broker.publish_with_ids(
        jobs_vhost,
        "jobs",
        "job",
        [
            ("c-ok", body("c-ok", "ok")),
            ("c-tr", body("c-tr", "transient")),
            ("c-pm", body("c-pm", "permanent")),
        ],
    )
    assert wait_until(lambda: len(read_events(out)) == 4, 30), (read_events(out), running.output())
    assert running.stop() == 0
    kinds = sorted((e["kind"], e["message_id"], e["attempt"]) for e in read_events(out))
    assert kinds == [
        ("park", "c-pm", 1),
        ("retry", "c-tr", 1),
        ("success", "c-ok", 1),
        ("success", "c-tr", 2),
    ]
    park = next(e for e in read_events(out) if e["kind"] == "park")
    assert park["reason"] == "permanent" and park["queue"] == WORK
    assert park["exception"].startswith("Permanent: customer")
    assert broker.depths(jobs_vhost, ALL) == {**{n: 0 for n in ALL}, PARKING: 1}
    assert "hooks: on_success=tests.hook_handlers.record" in running.output()
    assert "on_park=tests.hook_handlers.record (timeout 2s)" in running.output()
    # and the supervisor's first line, before any worker starts
    first = running.output().splitlines()[0]
    assert "rmqkit.consume: topology: " in first
    assert "; hooks: on_success=tests.hook_handlers" in first


def sealed(ring: KeyRing, i: str, kind: str) -> bytes:
    out: bytes = encrypt_fields(body(i, kind), ["customer.name"], [], ring)
    return out


def test_hooks_never_see_a_decrypted_field(
    jobs_vhost: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The handler's errors quote the decrypted customer name; the retry and park events (their
    fields, repr, and the line a hook writes) and the hooks' own log lines hold none of it."""
    ring = generate_keyring()
    events: list[OutcomeEvent] = []
    written: list[str] = []

    def record(event: OutcomeEvent) -> None:
        events.append(event)
        written.append(as_line(event))

    seen: list[str] = []

    async def handler(message: rmqkit.Message) -> None:
        seen.append(str(message.json()["customer"]["name"]))
        await handle(message)

    def failing(event: OutcomeEvent) -> None:
        record(event)
        raise ValueError(f"could not report {event.error_message}")

    async def main() -> None:
        hooks = Hooks(on_success=record, on_retry=record, on_park=failing)
        messages = [
            (i, sealed(ring, i, kind))
            for i, kind in (("e-ok", "ok"), ("e-tr", "transient"), ("e-pm", "permanent"))
        ]
        async with consumer(jobs_vhost, hooks, keyring=ring, handler=handler) as running:
            await publish(jobs_vhost, messages)
            assert await until(lambda: running.processed == 4 and len(events) == 4), events
            assert await settled_to(jobs_vhost, {PARKING: 1})

    with caplog.at_level("DEBUG"):
        asyncio.run(main())
    assert sorted(e.kind for e in events) == ["park", "retry", "success", "success"]
    failures = [e for e in events if e.kind != "success"]
    for one in failures:
        assert one.exception is None  # its message quoted the decrypted value
        assert one.error_type is not None and one.error_message
    for text in [*map(repr, events), *written, caplog.text]:
        assert SENTINEL not in text, text
    # ...while the handler did get the plaintext (else this proves nothing) and the message
    # itself is parked with its ciphertext as received
    assert f"{SENTINEL}-e-pm" in seen
    (parked,) = broker.drain(jobs_vhost, PARKING)
    assert SENTINEL.encode() not in parked["body"]
    assert parked["headers"][h.PARK_REASON] == "permanent"

"""`rmqkit consume MODULE`: routed handlers on one queue, against the real broker.

Known types reach their handler (each writes a file per message), everything else is parked
``unroutable_type``; a routed body its handler cannot decode is parked ``undecodable``.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests import broker
from tests.consumer_harness import ConsumerProcess, wait_until

pytestmark = pytest.mark.semantics("4.0")

WORK, PARKING = "jobs.work", "jobs.work.parking"
HANDLERS = "tests.routing_handlers"


def _all_queues_empty_but_parking(vhost: str) -> bool:
    counts = broker.depths(vhost, broker.queue_names(vhost) - {PARKING})
    return all(v == 0 for v in counts.values())


def _written(out: Path) -> dict[str, list[dict[str, Any]]]:
    """Each effect file's name and the lines in it (one line: handled once)."""
    if not out.exists():
        return {}
    return {
        path.name: [json.loads(line) for line in path.read_text().splitlines()]
        for path in out.iterdir()
    }


def _publish(vhost: str, messages: list[tuple[str, bytes, dict[str, Any]]]) -> None:
    headers = [h for _, _, h in messages]
    broker.publish_with_ids(
        vhost,
        "jobs",
        "job",
        [(mid, body) for mid, body, _ in messages],
        headers=headers.__getitem__,
    )


def _consume(
    vhost: str, tmp_path: Path, consumers: list[ConsumerProcess], *args: str
) -> tuple[ConsumerProcess, Path]:
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(vhost, ledger, *args, handler=HANDLERS)
    consumers.append(consumer)
    return consumer, tmp_path / "out"


def test_a_routed_module_hands_each_type_to_its_handler_and_parks_the_rest(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    ids = {name: uuid.uuid4().hex for name in ("created", "retried", "paid", "unknown", "none")}
    _publish(
        jobs_vhost,
        [
            (ids["created"], b'{"id": "o-1"}', {"type": "order.created"}),
            # fails once: its retry copy comes back from the wait queue and keeps its route
            (ids["retried"], b'{"id": "o-2", "fail": 1}', {"type": "order.created"}),
            (ids["paid"], b'{"amount": 5}', {"type": "order.paid"}),
            (ids["unknown"], b'{"id": "o-3"}', {"type": "order.refunded"}),
            (ids["none"], b'{"id": "o-4"}', {}),
        ],
    )
    consumer, out = _consume(jobs_vhost, tmp_path, consumers)
    expected = {f"created-{ids['created']}", f"created-{ids['retried']}", f"paid-{ids['paid']}"}
    assert wait_until(lambda: set(_written(out)) >= expected, timeout_s=30), consumer.output()
    assert wait_until(lambda: broker.depths(jobs_vhost, [PARKING])[PARKING] == 2, timeout_s=20)
    assert wait_until(lambda: _all_queues_empty_but_parking(jobs_vhost), timeout_s=10)
    assert consumer.stop() == 0, consumer.output()

    written = _written(out)
    assert set(written) == expected  # nothing else handled, each by its own handler
    assert written[f"created-{ids['created']}"] == [{"id": "o-1", "attempt": 1}]
    assert written[f"created-{ids['retried']}"] == [{"id": "o-2", "attempt": 2}]
    assert written[f"paid-{ids['paid']}"] == [{"data": {"amount": 5}, "routing_key": "job"}]

    parked = {p["message_id"]: p for p in broker.drain(jobs_vhost, PARKING)}
    assert set(parked) == {ids["unknown"], ids["none"]}
    for mid in (ids["unknown"], ids["none"]):
        headers = parked[mid]["headers"]
        assert headers["rmqkit-park-reason"] == "unroutable_type"
        assert headers["rmqkit-error-type"] == "rmqkit.UnroutableType"
        assert headers["rmqkit-origin-queue"] == WORK
        assert headers["rmqkit-attempt"] == 1
    assert "'order.refunded'" in parked[ids["unknown"]]["headers"]["rmqkit-error-message"]
    assert "has no type" in parked[ids["none"]]["headers"]["rmqkit-error-message"]


ADVERSARIAL_TYPES = [
    "handle_created",  # the decorated handler's attribute name
    "tests.routing_handlers:handle_created",  # a handler spec
    "routing_handlers.handle_created",
    "order_refunded",  # an undecorated function of the module
    "__init__",
    "ORDER.CREATED",
    "Order.Created",
    " order.created",
    "order.created ",
    "order.created\n",
    "order.created\x00",
    "order.*",
    "",
]


def test_a_type_that_only_resembles_a_route_reaches_no_handler(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    ids = [uuid.uuid4().hex for _ in ADVERSARIAL_TYPES]
    messages = [
        (mid, b'{"id": "x"}', {"type": value})
        for mid, value in zip(ids, ADVERSARIAL_TYPES, strict=True)
    ]
    # A routed message that also fails its handler's decoding is undecodable, not unroutable.
    bad_body = uuid.uuid4().hex
    messages.append((bad_body, b"\x00\xff not json", {"type": "order.created"}))
    wrong_shape = uuid.uuid4().hex
    messages.append((wrong_shape, b'{"no_id": 1}', {"type": "order.created"}))
    # A type that is not a string is no type (an int 1 is not the string "1").
    not_text = uuid.uuid4().hex
    messages.append((not_text, b'{"id": "x"}', {"type": 1}))
    _publish(jobs_vhost, messages)

    consumer, out = _consume(jobs_vhost, tmp_path, consumers)
    total = len(messages)
    assert wait_until(
        lambda: broker.depths(jobs_vhost, [PARKING])[PARKING] == total, timeout_s=30
    ), consumer.output()
    assert wait_until(lambda: _all_queues_empty_but_parking(jobs_vhost), timeout_s=10)
    assert consumer.stop() == 0, consumer.output()

    assert _written(out) == {}  # no handler ran, not even the undecorated one
    parked = {p["message_id"]: p["headers"] for p in broker.drain(jobs_vhost, PARKING)}
    assert len(parked) == total
    reasons = {mid: headers["rmqkit-park-reason"] for mid, headers in parked.items()}
    assert reasons.pop(bad_body) == "undecodable"
    assert reasons.pop(wrong_shape) == "undecodable"
    assert set(reasons.values()) == {"unroutable_type"}


def test_route_by_another_header_reaches_the_workers(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    """--route-by is recorded in the spec the workers load; `type` no longer routes."""
    by_event, by_type = uuid.uuid4().hex, uuid.uuid4().hex
    _publish(
        jobs_vhost,
        [
            (by_event, b'{"id": "e-1"}', {"event": "order.created"}),
            (by_type, b'{"id": "t-1"}', {"type": "order.created"}),
        ],
    )
    consumer, out = _consume(jobs_vhost, tmp_path, consumers, "--route-by", "header:event")
    assert wait_until(lambda: f"created-{by_event}" in _written(out), timeout_s=30), (
        consumer.output()
    )
    assert wait_until(lambda: broker.depths(jobs_vhost, [PARKING])[PARKING] == 1, timeout_s=20)
    assert wait_until(lambda: _all_queues_empty_but_parking(jobs_vhost), timeout_s=10)
    assert consumer.stop() == 0, consumer.output()
    assert set(_written(out)) == {f"created-{by_event}"}
    parked = broker.drain(jobs_vhost, PARKING)
    assert [p["message_id"] for p in parked] == [by_type]
    assert parked[0]["headers"]["rmqkit-park-reason"] == "unroutable_type"
    assert "header 'event'" in parked[0]["headers"]["rmqkit-error-message"]


@pytest.mark.parametrize(
    ("args", "handler", "needle"),
    [
        ((), "tests.flow_handlers", "has no handler decorated @rmqkit.handler"),
        (("--route-by", "event"), HANDLERS, "--route-by 'event'"),
        (("--route-by", "routing-key"), "tests.routing_handlers:handle_paid", "--route-by"),
    ],
)
def test_a_module_that_cannot_be_routed_is_refused_at_start(
    jobs_vhost: str,
    tmp_path: Path,
    args: tuple[str, ...],
    handler: str,
    needle: str,
    consumers: list[ConsumerProcess],
) -> None:
    consumer = ConsumerProcess(jobs_vhost, tmp_path / "ledger.db", *args, handler=handler)
    consumers.append(consumer)
    code = consumer.proc.wait(timeout=30)
    assert needle in consumer.output()
    assert code == (78 if not args else 64), consumer.output()
    assert broker.depths(jobs_vhost, [WORK])[WORK] == 0

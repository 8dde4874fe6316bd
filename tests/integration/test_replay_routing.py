"""Where `parking replay` sends a message when the operator does not name every part of the target.

Finding 5 of issue 9: `replay --to-exchange EX` without `--routing-key` routed with the origin
*queue name* as key. With an alternate exchange on EX every copy was "replayed" into its catch-all
queue (exit 0, parking emptied, the work queue got nothing). On the code of 7cb9a46 this module's
first test sees audit 108, work 0, parking 0 and exit 0; the dry run shows key ``o.work``.

A replay must route with the message's original routing key (rmqkit's header, or x-death's for a
message the broker dead-lettered) and keep a message parked when no key is known. The same class
of bug without any override: the origin of a broker-dead-lettered message was taken from its
*oldest* x-death entry, so a message that came through an upstream queue was replayed there.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import aiormq
import pytest

from rmqkit import headers as h
from rmqkit.settings import with_vhost
from tests import broker

pytestmark = pytest.mark.semantics("4.0", "4.3")

EXCHANGE = "o"
KEY = "o.created"
WORK = "o.work"
PARKING = "o.work.parking"
AUDIT = "o.audit"  # behind the exchange's alternate exchange: what nothing else takes
UPSTREAM = "o.incoming"  # dead-letters into EXCHANGE with KEY


async def _declare(vhost: str) -> None:
    conn = await aiormq.connect(with_vhost(broker.BASE_URL, vhost))
    try:
        channel = await conn.channel()
        await channel.exchange_declare("o.ae", exchange_type="fanout", durable=True)
        await channel.queue_declare(AUDIT, durable=True)
        await channel.queue_bind(AUDIT, "o.ae", routing_key="")
        await channel.exchange_declare(
            EXCHANGE,
            exchange_type="topic",
            durable=True,
            arguments={"alternate-exchange": "o.ae"},
        )
        quorum = {"x-queue-type": "quorum"}
        await channel.queue_declare(
            PARKING, durable=True, arguments={**quorum, **broker.no_delivery_limit()}
        )
        await channel.queue_declare(
            WORK,
            durable=True,
            arguments={
                **quorum,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": PARKING,
            },
        )
        await channel.queue_bind(WORK, EXCHANGE, routing_key=KEY)
        await channel.queue_declare(
            UPSTREAM,
            durable=True,
            arguments={"x-dead-letter-exchange": EXCHANGE, "x-dead-letter-routing-key": KEY},
        )
    finally:
        await conn.close()


def _parked_by_rmqkit(index: int, *, with_key: bool = True) -> tuple[str, str, bytes, Any]:
    failed = h.format_timestamp(datetime.now(UTC) - timedelta(minutes=5))
    headers: dict[str, Any] = {
        h.PARK_REASON: "permanent",
        h.ORIGIN_QUEUE: WORK,
        h.ERROR_TYPE: "myapp.Bad",
        h.ATTEMPT: 1,
        h.FIRST_FAILED_AT: failed,
        h.LAST_FAILED_AT: failed,
    }
    if with_key:
        headers[h.ORIGINAL_EXCHANGE] = EXCHANGE
        headers[h.ORIGINAL_ROUTING_KEY] = KEY
    return (PARKING, uuid.uuid4().hex, f"parked {index}".encode(), headers)


@pytest.fixture
def lane(fresh_vhost: Any) -> str:
    """100 messages parked by rmqkit, 5 dead-lettered by the broker from WORK (x-death only),
    3 parked with an origin but no known routing key."""
    vhost: str = fresh_vhost()
    broker.run(_declare(vhost))
    broker.publish_exact(vhost, "", [_parked_by_rmqkit(i) for i in range(100)])
    broker.publish(vhost, EXCHANGE, KEY, [f"dead {i}".encode() for i in range(5)])
    for _ in range(5):
        assert broker.reject_one(vhost, WORK)
    broker.publish_exact(vhost, "", [_parked_by_rmqkit(i, with_key=False) for i in range(3)])
    assert broker.depths(vhost, [PARKING, WORK]) == {PARKING: 108, WORK: 0}
    return vhost


def test_to_exchange_alone_routes_with_the_original_key_and_keeps_unknown_ones(lane: str) -> None:
    vhost = lane
    plan = broker.cli(
        "parking", "replay", PARKING, "--to-exchange", EXCHANGE, "--dry-run", vhost=vhost
    )
    assert plan.returncode == 0, plan.stderr
    lines = [line for line in plan.stdout.splitlines() if line.startswith("would replay")]
    assert len(lines) == 105 and all(
        line.endswith(f"exchange {EXCHANGE} key {KEY}") for line in lines
    )
    assert "skipped 3" in plan.stderr and "no original routing key" in plan.stderr
    assert broker.depths(vhost, [PARKING, WORK, AUDIT]) == {PARKING: 108, WORK: 0, AUDIT: 0}

    result = broker.cli("parking", "replay", PARKING, "--to-exchange", EXCHANGE, vhost=vhost)
    # 3 stay parked: a partial replay (exit 3), said in one problem line
    assert result.returncode == 3, result.stderr
    assert "replayed 105 of 108" in result.stderr and "3 x no original routing key" in result.stderr
    assert broker.depths(vhost, [PARKING, WORK, AUDIT]) == {PARKING: 3, WORK: 105, AUDIT: 0}
    kept = broker.drain(vhost, PARKING)
    assert all(h.ORIGINAL_ROUTING_KEY not in m["headers"] for m in kept)
    arrived = broker.drain(vhost, WORK)
    assert sorted(m["body"] for m in arrived) == sorted(
        [f"parked {i}".encode() for i in range(100)] + [f"dead {i}".encode() for i in range(5)]
    )
    assert all(m["headers"][h.REPLAY_COUNT] == 1 for m in arrived)


def test_an_explicit_routing_key_is_used_as_given(lane: str) -> None:
    vhost = lane
    result = broker.cli(
        "parking",
        "replay",
        PARKING,
        "--to-exchange",
        EXCHANGE,
        "--routing-key",
        "o.other",
        vhost=vhost,
    )
    # nothing is bound to o.other, so the alternate exchange takes all: what the operator asked
    assert result.returncode == 0, result.stderr
    assert broker.depths(vhost, [PARKING, WORK, AUDIT]) == {PARKING: 0, WORK: 0, AUDIT: 108}


def test_without_overrides_a_broker_dead_lettered_message_goes_back_where_it_last_died(
    fresh_vhost: Any,
) -> None:
    """Rejected in UPSTREAM, dead-lettered into WORK, rejected there into parking: x-death holds
    both, the newest for WORK. The old code took the oldest entry (UPSTREAM) as the origin."""
    vhost: str = fresh_vhost()
    broker.run(_declare(vhost))
    broker.publish(vhost, "", UPSTREAM, [b"via upstream"])
    assert broker.reject_one(vhost, UPSTREAM)
    assert broker.wait_for(lambda: broker.depths(vhost, [WORK])[WORK] == 1)
    assert broker.reject_one(vhost, WORK)
    listed = broker.cli_json_lines("parking", "list", PARKING, "--json", vhost=vhost)
    assert [m["origin_queue"] for m in listed] == [WORK]

    plan = broker.cli(
        "parking", "replay", PARKING, "--to-exchange", EXCHANGE, "--dry-run", vhost=vhost
    )
    assert plan.stdout.rstrip().endswith(f"exchange {EXCHANGE} key {KEY}"), plan.stdout
    result = broker.cli("parking", "replay", PARKING, vhost=vhost)
    assert result.returncode == 0, result.stderr
    assert broker.depths(vhost, [PARKING, WORK, UPSTREAM, AUDIT]) == {
        PARKING: 0,
        WORK: 1,
        UPSTREAM: 0,
        AUDIT: 0,
    }


def test_a_target_that_is_the_parking_queue_itself_is_refused(lane: str) -> None:
    vhost = lane
    result = broker.cli("parking", "replay", PARKING, "--routing-key", PARKING, vhost=vhost)
    assert result.returncode == 3 and "parking queue" in result.stderr, result.stderr
    assert broker.depths(vhost, [PARKING, WORK, AUDIT]) == {PARKING: 108, WORK: 0, AUDIT: 0}

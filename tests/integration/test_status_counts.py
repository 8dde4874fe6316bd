"""`rmqkit status` shows what the broker knows, honestly, and touches no message.

- Ready right after a publish: the management API's stats lag (a new queue has no
  ``messages_ready`` until the next stats emission, and the table showed ``-``); the count now
  comes from a passive declare where the API has none.
- Oldest: from the queue's ``head_message_timestamp`` where the broker keeps one (a classic
  queue, messages published with a timestamp); ``n/a`` with a footnote where it keeps none
  (quorum queues), never by taking the head message (a get with requeue spends a delivery
  attempt of a quorum queue's message).
"""

from __future__ import annotations

import io
import re
import time
from dataclasses import replace
from typing import Any

from rich.console import Console

from rmqkit.broker.management import management
from rmqkit.broker.snapshot import read_snapshot
from rmqkit.cli.status import OLDEST_NA, status_table
from rmqkit.health.fill import with_amqp_counts, with_rows
from rmqkit.health.status import build_status, read_status_once
from tests import broker


def put_queue(vhost: str, name: str, qtype: str) -> None:
    body = {"durable": True, "arguments": {"x-queue-type": qtype}}
    path = f"/queues/{broker.q(vhost)}/{broker.q(name)}"
    broker.api("PUT", path, json=body).raise_for_status()


def publish_stamped(vhost: str, queue: str, n: int, timestamp: int) -> None:
    """Through the management API, with an AMQP timestamp property."""
    for i in range(n):
        body = {
            "properties": {"delivery_mode": 2, "timestamp": timestamp, "message_id": f"m{i}"},
            "routing_key": queue,
            "payload": f"body {i}",
            "payload_encoding": "string",
        }
        path = f"/exchanges/{broker.q(vhost)}/amq.default/publish"
        answer = broker.api("POST", path, json=body)
        answer.raise_for_status()
        assert answer.json()["routed"] is True


def table_text(report: Any) -> str:
    out = io.StringIO()
    Console(file=out, width=250, color_system=None).print(status_table(report))
    return " ".join(re.sub(r"[│┃┏┓┗┛┡┩━╇┳┻─┼├┤└┘┌┐┬┴]", " ", out.getvalue()).split())


def test_ready_comes_from_a_passive_declare_where_management_has_none(
    fresh_vhost: Any,
) -> None:
    vhost = fresh_vhost()
    put_queue(vhost, "lag.work", "quorum")
    broker.publish(vhost, "", "lag.work", [b"a", b"b", b"c"])
    settings = broker.settings_for(vhost)

    async def blind_then_filled(lagging: int | None) -> tuple[Any, Any]:
        async with management(settings) as api:
            report = build_status(await read_snapshot(api))
        # as the API answers before its stats caught up: no count (3.10), or 0 (4.x quorum)
        rows = [replace(r, ready=lagging) for r in report.queues]
        blind = with_rows(report, rows)
        return blind, await with_amqp_counts(settings, blind)

    for lagging, shown in ((None, "-"), (0, "0")):
        blind, filled = broker.run(blind_then_filled(lagging))
        assert f"lag.work other {shown} " in table_text(blind)  # the lagging API alone
        (row,) = [r for r in filled.queues if r.name == "lag.work"]
        assert (row.ready, row.ready_from) == (3, "passive declare")
        assert "lag.work other 3 " in table_text(filled)
    # and straight after a publish, through the whole reading
    put_queue(vhost, "fresh.work", "quorum")
    broker.publish(vhost, "", "fresh.work", [b"x"] * 4)
    now = broker.run(read_status_once(settings))
    (fresh,) = [r for r in now.queues if r.name == "fresh.work"]
    assert fresh.ready == 4, fresh
    assert broker.depths(vhost, ["lag.work", "fresh.work"]) == {"lag.work": 3, "fresh.work": 4}


def test_oldest_from_the_head_timestamp_or_na_with_a_footnote(fresh_vhost: Any) -> None:
    vhost = fresh_vhost()
    put_queue(vhost, "stamped", "classic")
    put_queue(vhost, "quorate", "quorum")
    hour_ago = int(time.time()) - 3600
    publish_stamped(vhost, "stamped", 2, hour_ago)
    publish_stamped(vhost, "quorate", 2, hour_ago)
    settings = broker.settings_for(vhost)

    def read() -> Any:
        report = broker.run(read_status_once(settings))
        rows = {r.name: r for r in report.queues}
        return report if rows["stamped"].oldest_age_s is not None else None

    report = broker.wait_for(read, timeout_s=20)
    assert report, "the management API never showed the classic queue's head timestamp"
    rows = {r.name: r for r in report.queues}
    assert 3600 - 5 < rows["stamped"].oldest_age_s < 3600 + 60
    assert rows["stamped"].oldest_age_from == "head timestamp"
    assert rows["quorate"].oldest_age_s is None  # quorum queues keep no head timestamp
    text = table_text(report)
    assert "quorate other 2 " in text and " n/a " in text, text
    assert OLDEST_NA in text, text
    assert OLDEST_NA == (
        "oldest n/a: the broker keeps no head-message timestamp for that queue (quorum queues "
        "never do; classic ones only for messages published with a timestamp), and reading the "
        "head message instead would spend a delivery attempt; --parking-age browses parking "
        "queues for it"
    )
    piped = broker.cli("status", vhost=vhost)
    assert piped.returncode == 0, piped.stderr
    lines = {line.split("\t")[0]: line.split("\t") for line in piped.stdout.splitlines()}
    column = lines["queue"].index("oldest")
    assert lines["quorate"][column] == "n/a"
    assert lines["stamped"][column] == "1.0h"
    # No message was delivered to read any of this: this drain is each one's first delivery.
    held = broker.drain(vhost, "quorate")
    assert [m["headers"].get("x-delivery-count", 0) for m in held] == [0, 0], held
    assert len(broker.drain(vhost, "stamped")) == 2

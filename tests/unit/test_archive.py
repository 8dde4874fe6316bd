"""The archive queue a topology declares, and the headers archive and restore give a copy."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from rmqkit import headers as h
from rmqkit.broker.codec import Properties
from rmqkit.errors import TopologyFileError
from rmqkit.names import archive_queue, archived_from
from rmqkit.parking.archive import archived_headers, restored_headers
from rmqkit.parking.model import ParkedMessage
from rmqkit.topology.expand import expand
from rmqkit.topology.model import parse_topology

FILE = """
[queues."a.work"]
archive = "14d"
[queues."b.work"]
"""
NOW = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)


def test_names_go_both_ways() -> None:
    assert archive_queue("a.work.parking") == "a.work.parking.archive"
    assert archived_from("a.work.parking.archive") == "a.work.parking"
    assert archived_from("a.work.parking") is None


@pytest.mark.parametrize("version", [(3, 10, 8), (4, 3, 6)])
def test_the_archive_keeps_for_its_retention(
    version: tuple[int, int, int],
) -> None:
    desired = expand(parse_topology(FILE, "f.toml"), broker_version=version)
    [archive] = [q for q in desired.queues if q.role == "archive"]
    assert (archive.name, archive.owner) == ("a.work.parking.archive", "a.work")
    assert archive.settings["message-ttl"] == 14 * 86_400_000
    assert archive.settings["overflow"] == "reject-publish"
    # no dead-letter: expiring out of the archive is what archiving is for
    assert not any(key.startswith("dead-letter") for key in archive.settings)
    assert ("delivery-limit" in archive.settings) == (version >= (4, 0, 0))
    assert not [q for q in desired.queues if q.name.startswith("b.work.parking.")]
    assert "rmqkit.a.work.parking.archive" in {p.name for p in desired.policies}


def test_queues_sharing_a_parking_queue_agree_on_its_archive() -> None:
    shared = """
[queues."a.work"]
parking = "shared.parking"
archive = "14d"
[queues."b.work"]
parking = "shared.parking"
archive = "2d"
"""
    with pytest.raises(TopologyFileError, match="same archive retention"):
        parse_topology(shared, "f.toml")
    clash = """
[queues."a.work"]
archive = "1d"
[queues."a.work.parking.archive"]
"""
    with pytest.raises(TopologyFileError, match="is a work queue of this file"):
        parse_topology(clash, "f.toml")


def _message(headers: dict[str, object]) -> ParkedMessage:
    return ParkedMessage.from_delivery(1, Properties(message_id="m1", headers=headers), b"{}")


def test_a_message_the_broker_parked_lists_the_same_once_archived() -> None:
    """A delivery-limit death: reason, origin and route come from x-death, which no copy
    carries; the archived copy holds them in rmqkit's headers, and groups the same."""
    parked = _message(
        {
            "x-death": [
                {
                    "queue": "a.work",
                    "reason": "delivery_limit",
                    "count": 1,
                    "exchange": "orders",
                    "routing-keys": ["order.created"],
                    "time": datetime(2026, 12, 1, 8, 0, tzinfo=UTC),
                }
            ],
            "x-first-death-queue": "a.work",
            "x-first-death-reason": "delivery_limit",
            "x-delivery-count": 4,
            "app": "kept",
        }
    )
    copy = archived_headers(parked, NOW)
    assert h.BROKER_HEADERS.isdisjoint(copy)
    assert copy["app"] == "kept" and copy[h.ARCHIVED_AT] == "2026-12-03T09:00:00.000Z"
    archived = _message(copy)
    for view in ("reason", "origin_queue", "original_routing_key", "last_failed_at"):
        assert getattr(archived, view) == getattr(parked, view), view
    assert archived.failure_id == parked.failure_id
    restored = _message(restored_headers(archived, NOW))
    assert h.ARCHIVED_AT not in restored.headers
    assert (restored.reason, restored.failure_id) == (parked.reason, parked.failure_id)


def test_a_message_rmqkit_parked_keeps_its_own_record() -> None:
    own = {
        h.PARK_REASON: "exhausted",
        h.ERROR_TYPE: "ValueError",
        h.ERROR_MESSAGE: "refund of 3 exceeds 2",
        h.ORIGIN_QUEUE: "a.work",
        h.LAST_FAILED_AT: "2026-12-01T08:00:00.000Z",
        h.FINGERPRINT: "abc123abc123",
        h.ATTEMPT: 5,
    }
    copy = archived_headers(_message(dict(own)), NOW)
    assert {k: copy[k] for k in own} == own
    assert restored_headers(_message(copy), NOW) == own

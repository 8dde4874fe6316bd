"""The names rmqkit derives from a work queue ``W``, built and parsed here and nowhere else.

* ``W.parking``: its parking queue (a topology file may name it otherwise: ``parking = ...``),
  and ``P.archive`` the archive queue of parking queue ``P`` (``archive = "30d"``);
* ``W.wait.<delay>``: the wait queue of one retry tier, and ``W.wait.<delay>.slot-<ttl>`` its
  jitter slots (durations as ``rmqkit.durations.format_duration_ms`` spells them);
* ``W.lane.<name>``: a lane, and ``W.p<N>``: a partition, each a work queue of its own (with
  wait queues of its own), ``W.partition`` the hash exchange in front of the partitions.

Pure string functions below every layer: the topology expands a file into these names, and the
consumer, health (status, doctor) and parking read the roles of queues on a broker from them.
"""

from __future__ import annotations

import re
from typing import Final

from rmqkit.durations import format_duration_ms, parse_duration_ms

PARKING_SUFFIX: Final = ".parking"
ARCHIVE_SUFFIX: Final = ".archive"
WAIT_INFIX: Final = ".wait."
SLOT_INFIX: Final = ".slot-"
LANE_INFIX: Final = ".lane."
PARTITION_INFIX: Final = ".p"
PARTITION_EXCHANGE_SUFFIX: Final = ".partition"

# The shapes of the names derived from a work queue W (after "W"): a wait queue of a tier and its
# jitter slots, a lane, a partition, each of those two with wait queues of its own.
_DURATION = r"\d+(?:ms|s|m|h)"
_WAIT = rf"\.wait\.{_DURATION}(?:\.slot-{_DURATION})?"
_DERIVED = re.compile(rf"(?:{_WAIT}|\.lane\.[A-Za-z0-9_-]+(?:{_WAIT})?|\.p\d+(?:{_WAIT})?)")
_FLOW_QUEUE = re.compile(r"^(?P<parent>.+)\.(?:lane\.[^.]+|p\d+)$")
_SLOT = re.compile(r"\.slot-(\w+)$")


def parking_queue(work_queue: str) -> str:
    """``orders.work`` → ``orders.work.parking`` (the default parking queue)."""
    return f"{work_queue}{PARKING_SUFFIX}"


def is_parking_name(name: str) -> bool:
    """Whether ``name`` is named like a parking queue (``….parking``)."""
    return name.endswith(PARKING_SUFFIX)


def archive_queue(parking: str) -> str:
    """``orders.work.parking`` → ``orders.work.parking.archive``: the queue ``parking archive``
    moves messages to and ``parking restore`` takes them back from. Derived from the parking
    queue (not the work queue), so a command given only the parking queue finds it."""
    return f"{parking}{ARCHIVE_SUFFIX}"


def archived_from(archive: str) -> str | None:
    """The parking queue an archive queue belongs to (``P.archive`` → ``P``), else None."""
    return archive.removesuffix(ARCHIVE_SUFFIX) if archive.endswith(ARCHIVE_SUFFIX) else None


def wait_prefix(queue: str) -> str:
    """``orders.work`` → ``orders.work.wait.``: what every wait queue of ``queue`` starts with."""
    return f"{queue}{WAIT_INFIX}"


def wait_queue(queue: str, delay_ms: int) -> str:
    """The main wait queue of one delay tier of ``queue``: ``orders.work.wait.5s``."""
    return f"{wait_prefix(queue)}{format_duration_ms(delay_ms)}"


def slot_queue(wait: str, ttl_ms: int) -> str:
    """A jitter slot of the tier whose main wait queue is ``wait``: ``….wait.5s.slot-2500ms``."""
    return f"{wait}{SLOT_INFIX}{format_duration_ms(ttl_ms)}"


def tier_of(wait: str) -> str:
    """A wait queue's tier: its main queue's name (a jitter slot's suffix cut off)."""
    return wait.split(SLOT_INFIX, 1)[0]


def wait_delay_ms(name: str, queue: str) -> int | None:
    """The tier delay (ms) of ``name`` if it is named as a wait queue of ``queue``, else None."""
    prefix = wait_prefix(queue)
    if not name.startswith(prefix):
        return None
    try:
        return parse_duration_ms(tier_of(name[len(prefix) :]))
    except ValueError:
        return None


def slot_text(name: str) -> str | None:
    """The ``<ttl>`` of a jitter slot's name (``….slot-<ttl>``), None for another name."""
    match = _SLOT.search(name)
    return None if match is None else match.group(1)


def lane_queue(work_queue: str, lane: str) -> str:
    """``orders.work`` + ``large`` → ``orders.work.lane.large``."""
    return f"{work_queue}{LANE_INFIX}{lane}"


def partition_queue(work_queue: str, index: int) -> str:
    """``orders.work`` + 3 → ``orders.work.p3``."""
    return f"{work_queue}{PARTITION_INFIX}{index}"


def partition_exchange(work_queue: str) -> str:
    """The x-consistent-hash exchange in front of a partitioned work queue's partitions."""
    return f"{work_queue}{PARTITION_EXCHANGE_SUFFIX}"


def partition_index(name: str, work_queue: str) -> int | None:
    """``N`` when ``name`` is named as partition ``work_queue.pN``, else None."""
    match = re.fullmatch(rf"{re.escape(work_queue)}\.p(\d+)", name)
    return None if match is None else int(match.group(1))


def is_lane_of(name: str, work_queue: str) -> bool:
    """Whether ``name`` is named as a lane of ``work_queue`` (``work_queue.lane.NAME``)."""
    return re.fullmatch(rf"{re.escape(work_queue)}\.lane\.[^.]+", name) is not None


def flow_parent(name: str) -> str | None:
    """The work queue ``W`` whose lane (``W.lane.x``) or partition (``W.pN``) ``name`` is
    named as; None for any other name."""
    match = _FLOW_QUEUE.match(name)
    return None if match is None else match["parent"]


def is_flow_member(name: str, root: str) -> bool:
    """``name`` is ``root`` itself or named as one of its lanes or partitions."""
    return name == root or re.fullmatch(re.escape(root) + r"\.(lane\.[^.]+|p\d+)", name) is not None


def is_derived_suffix(suffix: str) -> bool:
    """Whether ``suffix`` (a name after its work queue's ``W``) is one rmqkit derives: a wait
    queue or slot, a lane or a partition, or a wait queue of one of those two."""
    return _DERIVED.fullmatch(suffix) is not None

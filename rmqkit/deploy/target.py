"""What a deployment of `rmqkit consume --queue Q` runs and watches, read from its topology.

``consume_target`` turns a topology file and a queue into a ``ConsumeTarget``: the queues one
consumer serves (the queue, or its lanes, or every partition), the pattern that matches them
and their wait queues on the management API (what KEDA counts), and the numbers the
manifests derive from the file (prefetch, handler timeout, whether a key ring is needed).

The topology is read through ``TopologyView``, the few members of ``rmqkit.topology.Topology``
used here (mypy checks at the call site that ``Topology`` has them), so this package imports
nothing above the names and errors it is built on.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from rmqkit.errors import DataError, UsageError

# KEDA's rabbitmq scaler reads the queues a pattern matches as one page of the management API
# (more than one page is an error there), and the API serves at most 500 a page.
MAX_PAGE_SIZE = 500
MIN_PAGE_SIZE = 100  # KEDA's own default

# The suffix of every wait queue and jitter slot rmqkit derives from a work queue
# (rmqkit/names.py: W.wait.<delay>[.slot-<ttl>]), whatever delays the file says today: a tier
# dropped from the file leaves its wait queue in place, still dead-lettering back to the work
# queue, so the retries waiting in it must keep a replica too.
_DURATION = r"[0-9]+(?:ms|s|m|h)"
WAIT_SUFFIX = rf"\.wait\.{_DURATION}(?:\.slot-{_DURATION})?"
# PCRE's inline flag (the broker's regex engine) undoing the API's caseless compile; Python's
# re knows only the scoped form, so the checks here compile the pattern without it.
CASE_SENSITIVE = "(?-i)"


class QueueSettingsView(Protocol):
    """The settings of one work queue that a deployment depends on."""

    @property
    def prefetch(self) -> int: ...
    @property
    def handler_timeout(self) -> int | None: ...
    @property
    def retry_delays(self) -> Sequence[int]: ...
    @property
    def jitter_slots(self) -> int: ...
    @property
    def retry_engine(self) -> str: ...
    @property
    def encrypt(self) -> bool: ...
    @property
    def single_active_consumer(self) -> bool: ...
    @property
    def partitions(self) -> int | None: ...


class TopologyModelView(Protocol):
    """The file's ``[queues.NAME]`` tables."""

    @property
    def queues(self) -> Mapping[str, QueueSettingsView]: ...


class TopologyView(Protocol):
    """A validated topology file (``rmqkit.topology.Topology``), as far as deploy reads it."""

    @property
    def source(self) -> str: ...
    @property
    def model(self) -> TopologyModelView: ...
    def parent_of(self, queue: str) -> str | None: ...
    def work_queue_names(self) -> list[str]: ...
    def queue_spec(self, name: str) -> QueueSettingsView: ...
    def parking_name(self, queue: str) -> str: ...
    def archive_name(self, queue: str) -> str | None: ...


@dataclass(frozen=True)
class ConsumeTarget:
    """One `rmqkit consume --queue QUEUE` as a deployment sees it."""

    queue: str  # as given to --queue
    vhost: str
    source: str  # the topology file, as named on the command line
    served: tuple[str, ...]  # the queues the consumer consumes: QUEUE, its lanes or partitions
    counted_pattern: str  # management API regex: the served queues and all their wait queues
    page_size: int  # KEDA's pageSize: every queue the pattern matches fits in one page
    prefetch: int  # messages one consumer process holds at most, all served queues together
    handler_timeout_s: float | None  # the file's handler_timeout (None: consume's default)
    needs_keyring: bool  # encrypt = true: consume refuses to start without a key ring
    active_consumers: int | None  # single active consumer queues: how many replicas work


def known_queues(topology: TopologyView) -> list[str]:
    """The names `consume --queue` takes for this file, in file order: each work queue (a
    partitioned one too: it names all its partitions) followed by its lanes or partitions."""
    out: list[str] = []
    derived = topology.work_queue_names()
    for name in topology.model.queues:
        out.append(name)
        out.extend(q for q in derived if q != name and topology.parent_of(q) == name)
    return out


def served_queues(topology: TopologyView, queue: str) -> tuple[str, ...]:
    """The queues `rmqkit consume --queue QUEUE` consumes: a file's work queue with its lanes
    (a partitioned one: its partitions only), or the one lane or partition named.
    UsageError (64) for a queue the file does not declare, naming those it does."""
    parent = topology.parent_of(queue)
    if parent is None:
        known = ", ".join(known_queues(topology)) or "none"
        raise UsageError(
            f"{topology.source} has no work queue {queue!r} (work queues in it: {known}) — "
            "name one of them with --queue"
        )
    if parent != queue:  # a lane or partition named directly: only that queue
        return (queue,)
    family = [q for q in topology.work_queue_names() if topology.parent_of(q) == queue]
    return tuple(family)


def counted_pattern(served: Sequence[str]) -> str:
    """The management API filter (``use_regex``) matching exactly the ``served`` queues and
    their wait queues: never a parking queue, never another work queue.

    The API compiles the filter case-insensitively and matches it anywhere in a name, so it
    turns case sensitivity back on (``(?-i)``, checked on RabbitMQ 3.10.8: ``Orders.Work`` is
    not counted for ``orders.work``) and anchors both ends."""
    names = sorted(served)
    root = names[0]
    for name in names[1:]:  # the common prefix: the work queue for its lanes or partitions
        while not name.startswith(root):
            root = root[:-1]
    rest = [re.escape(name[len(root) :]) for name in names]
    if rest == [""]:
        family = re.escape(root)
    else:
        choices = "|".join(r for r in rest if r)
        optional = "?" if "" in rest else ""
        family = f"{re.escape(root)}(?:{choices}){optional}"
    return f"{CASE_SENSITIVE}^{family}(?:{WAIT_SUFFIX})?$"


def family_size(topology: TopologyView, served: Sequence[str]) -> int:
    """How many queues ``counted_pattern(served)`` matches on a broker declared from the file,
    at most: each served queue and, per retry tier, its jitter slots."""
    total = 0
    for name in served:
        spec = topology.queue_spec(name)
        tiers = 0 if spec.retry_engine == "broker" else len(spec.retry_delays)
        total += 1 + tiers * spec.jitter_slots
    return total


def _check_pattern(topology: TopologyView, pattern: str, served: Sequence[str]) -> None:
    """DataError if another queue of the file is named like a wait queue of a served one (a
    work queue ``orders.work.wait.7s``, a parking queue named so): KEDA would count it."""
    compiled = re.compile(pattern.removeprefix(CASE_SENSITIVE))
    others: list[str] = []
    for name in topology.work_queue_names():
        others.append(name)
        others.append(topology.parking_name(name))
        archive = topology.archive_name(name)
        if archive is not None:
            others.append(archive)
    for name in others:
        if name not in served and compiled.search(name):
            raise DataError(
                f"{topology.source}: queue {name!r} is named like a wait queue of "
                f"{served[0]!r}, so KEDA would count its messages as {served[0]!r}'s — rename it"
            )


def consume_target(topology: TopologyView, queue: str, vhost: str) -> ConsumeTarget:
    """The deployment's view of `rmqkit consume --queue QUEUE` on ``topology`` in ``vhost``.
    UsageError (64) for a queue the file does not declare (naming those it does); DataError
    (65) when KEDA could not count its queues in one page."""
    served = served_queues(topology, queue)
    pattern = counted_pattern(served)
    _check_pattern(topology, pattern, served)
    size = family_size(topology, served)
    if size > MAX_PAGE_SIZE:
        raise DataError(
            f"{queue!r} and its wait queues are {size} queues: KEDA's rabbitmq trigger reads "
            f"them as one page of the management API, at most {MAX_PAGE_SIZE} — lower "
            "jitter_slots, the retry tiers or the partitions in the file"
        )
    specs = [topology.queue_spec(name) for name in served]
    parent = topology.queue_spec(topology.parent_of(queue) or queue)
    timeout = parent.handler_timeout
    single = all(spec.single_active_consumer for spec in specs)
    return ConsumeTarget(
        queue=queue,
        vhost=vhost,
        source=topology.source,
        served=served,
        counted_pattern=pattern,
        # Room for twice the queues the file declares: wait queues of tiers the file no longer
        # names stay on the broker (and are counted) until someone deletes them.
        page_size=min(MAX_PAGE_SIZE, max(MIN_PAGE_SIZE, 2 * size)),
        prefetch=sum(spec.prefetch for spec in specs),
        handler_timeout_s=None if timeout is None else timeout / 1000,
        needs_keyring=parent.encrypt,
        active_consumers=len(served) if single else None,
    )

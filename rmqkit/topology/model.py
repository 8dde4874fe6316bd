"""The topology file: TOML, validated by pydantic (rmqkit.topology.schema), errors naming the file,
key path and line; ``Topology`` is the validated file with its names and lookups."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import (
    ValidationError,
)

from rmqkit import names
from rmqkit.durations import format_duration_ms
from rmqkit.errors import TopologyFileError
from rmqkit.topology import lanes
from rmqkit.topology.schema import (
    BUILTIN_EXCHANGE_PREFIX,
    MAX_DEFAULT_DELAY_MS,
    QueueModel,
    TopologyModel,
)
from rmqkit.topology.sources import find_line, key_path, pydantic_message


class Topology:
    """A validated topology file and where it came from.

    Work queues are the file's ``[queues.NAME]``; a lane (``NAME.lane.LANE``) or partition
    (``NAME.pI``) queue is a work queue too, derived from its parent: ``queue_spec`` resolves
    either, so consumers, parking and status treat them alike.
    """

    def __init__(self, model: TopologyModel, source: str) -> None:
        self.model = model
        self.source = source
        self._derived = lanes.derived_queues(model)

    def parent_of(self, queue: str) -> str | None:
        """The file's work queue that ``queue`` is (itself) or serves (a lane or partition)."""
        if queue in self.model.queues:
            return queue
        return self._derived.get(queue)

    def work_queue_names(self) -> list[str]:
        """Every queue a consumer may serve: the file's work queues (a partitioned one excepted,
        it is not a queue on the broker), each followed by its lanes or partitions."""
        out: list[str] = []
        for name, spec in self.model.queues.items():
            if not spec.partitions:
                out.append(name)
            out.extend(q for q, parent in self._derived.items() if parent == name)
        return out

    def queue_spec(self, name: str) -> QueueModel:
        """The settings of work queue ``name``: a file's work queue, or a lane or partition
        queue (the parent's settings; its own prefetch for a lane; one active consumer for a
        partition; the parent's parking queue). KeyError for any other name."""
        parent = self.parent_of(name)
        if parent is None:
            raise KeyError(f"{self.source} has no work queue {name!r}")
        spec = self.model.queues[parent]
        if parent == name:
            return spec
        update: dict[str, Any] = {
            "parking": self.parking_name(parent),
            "lanes": {},
            "partitions": None,
            "partition_key": None,
            "partition_by": "header",
            "bind": [],
        }
        lane = name.removeprefix(names.lane_queue(parent, ""))
        if name.startswith(names.lane_queue(parent, "")) and lane in spec.lanes:
            update["prefetch"] = spec.lanes[lane].prefetch or spec.prefetch
        else:
            update["single_active_consumer"] = True
        return spec.model_copy(update=update)

    def parking_name(self, queue: str) -> str:
        """The parking queue of work queue ``queue`` (a lane's or partition's: its parent's)."""
        parent = self.parent_of(queue)
        if parent is None:
            raise KeyError(f"{self.source} has no work queue {queue!r}")
        return self.model.queues[parent].parking or names.parking_queue(parent)

    def archive_name(self, queue: str) -> str | None:
        """The archive queue of work queue ``queue``'s parking queue, None if the file gives
        it none (``archive = ...`` left out)."""
        parent = self.parent_of(queue)
        if parent is None:
            raise KeyError(f"{self.source} has no work queue {queue!r}")
        if self.model.queues[parent].archive is None:
            return None
        return names.archive_queue(self.parking_name(parent))

    def wait_name(self, queue: str, delay_ms: int) -> str:
        """The main wait queue of one delay tier (TTL = the full delay)."""
        return names.wait_queue(queue, delay_ms)

    def lanes_of(self, work_queue: str) -> list[lanes.LaneSpec]:
        """The lanes of a file's work queue, in match order ([] without lanes)."""
        return lanes.lane_specs(work_queue, self.model.queues[work_queue])

    def lane_for(self, work_queue: str, headers: Mapping[str, Any] | None, body_size: int) -> str:
        """The queue to publish a message for ``work_queue`` to: its first matching lane's
        queue, else ``work_queue`` itself."""
        return lanes.choose_lane(work_queue, self.model.queues[work_queue], headers, body_size)

    def partitions_of(self, work_queue: str) -> list[str]:
        """The partition queues of a partitioned work queue, p0 first ([] if not partitioned)."""
        count = self.model.queues[work_queue].partitions or 0
        return [names.partition_queue(work_queue, i) for i in range(count)]

    def partition_exchange(self, work_queue: str) -> str | None:
        """The hash exchange of a partitioned work queue (None if not partitioned)."""
        if not self.model.queues[work_queue].partitions:
            return None
        return names.partition_exchange(work_queue)

    def work_queues_for(
        self, exchange: str, routing_key: str, headers: Mapping[str, Any] | None = None
    ) -> list[str]:
        """The file's work queues (parents, as named in the file) a publish would reach;
        ``headers`` only matter for headers exchanges."""
        return lanes.work_queues_for(self.model, exchange, routing_key, headers)


def parse_topology(text: str, source: str) -> Topology:
    """Validate topology ``text``; ``source`` names it in errors. Raises TopologyFileError."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line = getattr(exc, "lineno", None)
        detail = str(exc)
        if line is None:
            match = re.search(r"line (\d+)", detail)
            line = int(match.group(1)) if match else None
        raise TopologyFileError(source, f"malformed TOML: {detail}", line=line) from None
    try:
        model = TopologyModel.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = tuple(first["loc"])
        raise TopologyFileError(
            source, pydantic_message(first), key=key_path(loc), line=find_line(text, loc)
        ) from None
    topology = Topology(model, source)
    _check_references(topology, text)
    return topology


def _check_references(topology: Topology, text: str) -> None:
    model = topology.model

    def fail(loc: tuple[int | str, ...], detail: str) -> None:
        raise TopologyFileError(
            topology.source, detail, key=key_path(loc), line=find_line(text, loc)
        )

    def exchange_known(name: str) -> bool:
        return name in model.exchanges or name.startswith(BUILTIN_EXCHANGE_PREFIX)

    work = set(model.queues)
    generated: dict[str, str] = {}
    archives: dict[str, int | None] = {}
    for qname, queue in model.queues.items():
        if not qname or qname.startswith(BUILTIN_EXCHANGE_PREFIX):
            fail(("queues", qname), "queue names must be non-empty and not start with 'amq.'")
        for index, bind in enumerate(queue.bind):
            if not exchange_known(bind.exchange):
                fail(
                    ("queues", qname, "bind", index, "exchange"),
                    f"binds to exchange {bind.exchange!r}, which the file does not declare "
                    f"(add [exchanges.{bind.exchange}])",
                )
        if len(set(queue.retry_delays)) != len(queue.retry_delays):
            fail(("queues", qname, "retry_delays"), "the same delay appears twice")
        parking = topology.parking_name(qname)
        if parking in work:
            fail(("queues", qname, "parking"), f"{parking!r} is a work queue of this file")
        archive = topology.archive_name(qname)
        if archive is not None and archive in work:
            fail(("queues", qname, "archive"), f"{archive!r} is a work queue of this file")
        if archive is not None:
            generated[archive] = qname
        # Work queues sharing one parking queue share its archive: one retention for it.
        kept = archives.setdefault(parking, queue.archive)
        if kept != queue.archive:
            fail(
                ("queues", qname, "archive"),
                f"the work queues sharing parking queue {parking!r} must say the same archive "
                "retention (or all leave it out)",
            )
        if queue.delay is not None and not 0 < queue.delay <= MAX_DEFAULT_DELAY_MS:
            fail(
                ("queues", qname, "delay"),
                f"delay must be above zero and at most {format_duration_ms(MAX_DEFAULT_DELAY_MS)}"
                " (the delay ladder's reach)",
            )
    for where, problem in lanes.flow_problems(model):
        fail(where, problem)
    for name, parent in lanes.derived_queues(model).items():
        if name in work or name in generated:
            fail(("queues", parent), f"lane or partition queue {name!r} clashes with another queue")
        generated[name] = parent
    for qname in topology.work_queue_names():
        parent = topology.parent_of(qname) or qname
        for delay in model.queues[parent].retry_delays:
            name = topology.wait_name(qname, delay)
            if name in work or name in generated:
                fail(("queues", parent, "retry_delays"), f"wait queue {name!r} clashes")
            generated[name] = parent
    for ename, exchange in model.exchanges.items():
        if ename.startswith(BUILTIN_EXCHANGE_PREFIX) or not ename:
            fail(("exchanges", ename), "exchange names must be non-empty and not start with 'amq.'")
        if exchange.alternate_exchange and not exchange_known(exchange.alternate_exchange):
            fail(
                ("exchanges", ename, "alternate_exchange"),
                f"exchange {exchange.alternate_exchange!r} is not declared in the file",
            )
    partitioned = {q for q, spec in model.queues.items() if spec.partitions}
    queues_all = (work - partitioned) | {topology.parking_name(q) for q in work} | set(generated)
    exchanges_all = set(model.exchanges) | {names.partition_exchange(q) for q in partitioned}
    for index, binding in enumerate(model.bindings):
        if not exchange_known(binding.source):
            fail(
                ("bindings", index, "source"),
                f"exchange {binding.source!r} is not declared in the file",
            )
        known = queues_all if binding.destination_type == "queue" else exchanges_all
        if binding.destination_type == "queue" and binding.destination in partitioned:
            fail(
                ("bindings", index, "destination"),
                f"{binding.destination!r} is partitioned, not a queue: bind to its exchange "
                f"{names.partition_exchange(binding.destination)!r} (destination_type = "
                '"exchange")',
            )
        if binding.destination not in known:
            fail(
                ("bindings", index, "destination"),
                f"{binding.destination_type} {binding.destination!r} is not declared in the file",
            )


def load_topology(path: str | Path) -> Topology:
    """Read and validate the topology file at ``path``. Raises TopologyFileError (exit 65)."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TopologyFileError(source, "no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TopologyFileError(source, f"cannot be read: {exc}") from None
    return parse_topology(text, source)

"""What ``run_handler`` sets up before the message takes the consumer's path: the queue's
configuration (from a topology file, or the consumer's defaults with the test's overrides) and
the headers of the delivery that stands for the attempt asked for."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rmqkit import headers as h
from rmqkit.consumer.config import ConsumerConfig, ConsumerFlags, build_config, policy_from_topology
from rmqkit.consumer.loading import LoadedHandler
from rmqkit.errors import UsageError
from rmqkit.topology import load_topology
from rmqkit.topology.model import Topology
from rmqkit.topology.schema import QueueModel, TopologyModel

DEFAULT_QUEUE = "work"


def queue_config(
    loaded: LoadedHandler,
    topology: Topology | str | os.PathLike[str] | None,
    queue: str | None,
    max_attempts: int | None,
    retry_delays: Iterable[int | str] | None,
    permanent_errors: Iterable[str],
    handler_timeout_s: float | None,
) -> ConsumerConfig:
    """The consumer's configuration of the queue, as ``rmqkit consume`` builds it from a file."""
    if max_attempts is not None and max_attempts < 1:
        raise UsageError(f"max_attempts must be at least 1, not {max_attempts!r}")
    if topology is None:
        name = queue or DEFAULT_QUEUE
        settings: dict[str, Any] = {}
        if retry_delays is not None:
            settings["retry_delays"] = list(retry_delays)
        if max_attempts is not None:
            settings["max_attempts"] = max_attempts
        try:
            spec = QueueModel.model_validate(settings)
        except ValueError as exc:
            raise UsageError(f"run_handler: {exc}") from None
        topology = Topology(TopologyModel(queues={name: spec}), source="<run_handler>")
    else:
        if retry_delays is not None:
            raise UsageError("retry_delays comes from the topology when one is given")
        if not isinstance(topology, Topology):
            topology = load_topology(Path(topology))
        names = topology.work_queue_names()
        if queue is None:
            if len(names) != 1:
                raise UsageError(
                    f"{topology.source} has {len(names)} work queues ({', '.join(names)}); "
                    "name one with queue="
                )
            queue = names[0]
        name = queue
    policy = policy_from_topology(topology, name, max_attempts)
    flags = ConsumerFlags(
        handler_timeout_s=handler_timeout_s,
        max_attempts=max_attempts,
        permanent_errors=tuple(permanent_errors),
    )
    return build_config(loaded.spec, name, policy, flags, topology, loaded=loaded)


def attempt_headers(headers: Mapping[str, Any] | None, attempt: int | None) -> dict[str, Any]:
    """The test's headers as the delivery of ``attempt`` carries them (None: as given)."""
    copy = dict(headers or {})
    if attempt is not None:
        if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
            raise UsageError(f"attempt must be an int of at least 1, not {attempt!r}")
        if attempt > h.COUNT_MAX:
            raise UsageError(f"attempt must be at most {h.COUNT_MAX}, not {attempt}")
        if attempt > 1:
            # The header an earlier copy carries: the number of the delivery that failed.
            copy[h.ATTEMPT] = attempt - 1
        else:
            copy.pop(h.ATTEMPT, None)
    return copy

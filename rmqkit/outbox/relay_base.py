"""What every part of the relay shares: its options, store, broker, connections and report.

``rmqkit.outbox.relay.Relay`` is built from ``RelayBase`` and two parts that each own one
thing: ``rmqkit.outbox.batch`` (claim, publish and mark one batch) and
``rmqkit.outbox.housekeeping`` (retention, gauges, the failing rows' summary).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from collections.abc import Sequence
from typing import Any

from rmqkit.outbox.amqp import Broker, Row
from rmqkit.outbox.metrics import RelayMetrics
from rmqkit.outbox.options import RelayOptions, RelayReport
from rmqkit.outbox.queries import queries_for
from rmqkit.outbox.stopping import Stopping
from rmqkit.publishing.routing import Edge, Encryptor
from rmqkit.settings import Settings
from rmqkit.store import AsyncConnection, Store


class RelayBase:
    """The relay's state (see ``rmqkit.outbox.relay``)."""

    def __init__(self, settings: Settings, options: RelayOptions) -> None:
        self.options = options
        self.store = Store(options.dsn)
        self.sql = queries_for(self.store.dialect)
        # Rows with a delay go through the ladder with or without a topology; the topology adds
        # lanes and work queues' default delays (a default beyond the ladder: 65 at start).
        self.edge = Edge(options.topology)
        # With a topology, rows for queues that encrypt are checked (never encrypted here: the
        # relay holds no key ring, and the table must not hold plaintext in the first place).
        self.encryptor = Encryptor(topology=self.edge.topology)
        self.pg = self.store.dialect.name == "postgresql"
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.broker = Broker(settings, window=max(options.batch, 1), name="rmqkit outbox relay")
        self.metrics = RelayMetrics()
        self.report = RelayReport()
        self.stop = Stopping(options.grace_s)
        self._conn: AsyncConnection | None = None
        self._routed: list[Row] | None = None  # the batch in flight, as routed
        self._listener: Any = None
        self._next_retention = 0.0
        self._next_gauges = 0.0
        self._next_summary = 0.0

    async def _sleep(self, seconds: float) -> None:
        """``seconds``, or less if a stop is requested."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        assert self._conn is not None
        cursor = await self._conn.execute(sql, params)
        return list(await cursor.fetchall())

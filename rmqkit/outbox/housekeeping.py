"""The relay's periodic work beside publishing: deleting old published rows (``--retention``),
the metrics gauges (``--metrics-port``) and the failing rows' summary (``--failing-summary``,
rmqkit.outbox.failures)."""

from __future__ import annotations

import time
from typing import Final

from rmqkit.outbox.failures import GROUPS_SHOWN, log, summary_line
from rmqkit.outbox.queries import RETENTION_CHUNK
from rmqkit.outbox.relay_base import RelayBase

RETENTION_EVERY_S: Final = 60.0
GAUGES_EVERY_S: Final = 2.0


class Housekeeping(RelayBase):
    """Retention, gauges and the failing summary, each on its own timer."""

    async def _retention(self, *, force: bool = False) -> None:
        """Delete published rows older than the retention, RETENTION_CHUNK rows per statement."""
        if self.options.retention_s is None or (
            not force and time.monotonic() < self._next_retention
        ):
            return
        self._next_retention = time.monotonic() + RETENTION_EVERY_S
        assert self._conn is not None
        while not self.stop.is_set():
            cursor = await self._conn.execute(
                self.sql.delete_published, (self.options.retention_s, RETENTION_CHUNK)
            )
            if cursor.rowcount < RETENTION_CHUNK:
                break

    async def _gauges(self) -> None:
        if self.options.metrics_port is None or time.monotonic() < self._next_gauges:
            return
        self._next_gauges = time.monotonic() + GAUGES_EVERY_S
        count, oldest, now = (await self._fetch(self.sql.pending))[0]
        self.metrics.pending.set(count)
        self.metrics.lag.set(max(0.0, now - oldest) if oldest is not None else 0.0)

    async def _summary(self, *, force: bool = False) -> None:
        """Every ``failing_summary_s`` while rows are failing: how many, why, the oldest's age.
        One indexed count (the failing partial index) when none are."""
        every = self.options.failing_summary_s
        if every is None or (not force and time.monotonic() < self._next_summary):
            return
        self._next_summary = time.monotonic() + every
        total, oldest, now = (await self._fetch(self.sql.failing_totals))[0]
        if not total:
            return
        groups = await self._fetch(self.sql.failing_groups, (GROUPS_SHOWN,))
        age = None if oldest is None else max(0.0, now - oldest)
        log.warning(summary_line(int(total), age, [(str(e), int(n)) for e, n in groups]))

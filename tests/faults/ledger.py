"""Accounting for every message id of a fault scenario.

Each id the test generated is followed through four sources:

* **published**: ids sent with `rmqkit publish --ndjson` (each line carries its message_id) and
  the count the publisher reported confirmed;
* **processed**: the handler's side effect (``effect_log`` of tests/faults/idempotent_handlers.py)
  and its completions — the times the handler finished it, duplicates included;
* **parked**: `rmqkit parking list --json` of the parking queue, with the reason;
* **queued**: what is still in the work and wait queues once the consumers stopped.

An id that is in none of them is *unaccounted* (lost). The table printed per scenario:
ids / processed once / processed twice+ / parked / queued / unaccounted / effects applied twice.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.faults.idempotent_handlers import connect

COLUMNS = (
    ("scenario", "scenario"),
    ("ids", "ids"),
    ("processed_once", "processed once"),
    ("processed_twice", "processed twice+"),
    ("parked", "parked"),
    ("queued", "queued"),
    ("unaccounted", "unaccounted"),
    ("effects_twice", "effect applied twice"),
    ("deliveries", "deliveries"),
    ("seconds", "seconds"),
)
# Filled by every scenario; the conftest prints them together at the end of the run.
TABLES: list[LedgerReport] = []


@dataclass
class LedgerReport:
    scenario: str
    ids: int
    processed_once: int
    processed_twice: int
    parked: int
    queued: int
    unaccounted: int
    effects_twice: int
    deliveries: int
    seconds: float = 0.0
    parked_by_reason: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    unaccounted_sample: list[str] = field(default_factory=list)
    effects_twice_sample: list[str] = field(default_factory=list)
    foreign: int = 0  # ids seen that the test never sent

    def row(self) -> list[str]:
        values = asdict(self)
        out = []
        for key, _ in COLUMNS:
            value = values[key]
            out.append(f"{value:.1f}" if isinstance(value, float) else str(value))
        return out


def render(reports: Iterable[LedgerReport]) -> str:
    """A Markdown table of ledger reports (also readable as plain text)."""
    rows = [[title for _, title in COLUMNS]] + [r.row() for r in reports]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    out = [line(rows[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in rows[1:]]
    return "\n".join(out)


class Ledger:
    """The ids a scenario sent, and where each one ended up."""

    def __init__(self, path: Path, scenario: str) -> None:
        self.path = path
        self.scenario = scenario
        self.sent: dict[str, str] = {}  # message_id → kind ("good", "poison", "parks", …)
        self.confirmed_reported = 0  # what publishers said was confirmed
        self.notes: list[str] = []
        connect(path).close()  # create the schema before any consumer starts

    # --- what was sent -----------------------------------------------------------------------
    def add(self, ids: Iterable[str], kind: str) -> None:
        for message_id in ids:
            self.sent.setdefault(message_id, kind)

    def ids(self, kind: str | None = None) -> set[str]:
        return {m for m, k in self.sent.items() if kind is None or k == kind}

    def note(self, text: str) -> None:
        self.notes.append(text)

    # --- what the handler did ----------------------------------------------------------------
    def _query(self, sql: str) -> list[tuple[Any, ...]]:
        db = sqlite3.connect(str(self.path), timeout=60)
        try:
            return list(db.execute(sql))
        except sqlite3.OperationalError:
            return []
        finally:
            db.close()

    def effects(self) -> Counter[str]:
        """Side effects applied, per id (must never exceed 1)."""
        return Counter(
            {m: n for m, n in self._query("SELECT message_id, COUNT(*) FROM effect_log GROUP BY 1")}
        )

    def effect_count(self) -> int:
        return int(self._query("SELECT COUNT(*) FROM effect_log")[0][0])

    def completions(self) -> Counter[str]:
        """Times the handler finished each id (duplicates absorbed by idempotency included)."""
        return Counter(
            {
                m: n
                for m, n in self._query("SELECT message_id, COUNT(*) FROM completions GROUP BY 1")
            }
        )

    def deliveries(self) -> Counter[str]:
        """Handler calls per id (every delivery, poison included)."""
        return Counter(
            {m: n for m, n in self._query("SELECT message_id, COUNT(*) FROM deliveries GROUP BY 1")}
        )

    def busy_pids(self, window_s: float = 1.0) -> dict[int, int]:
        """Processes that called the handler in the last ``window_s`` seconds, with how often.
        (The cut-off is this process's clock, to the microsecond: SQLite's strftime('%s') is
        whole seconds, which let a worker idle for up to two seconds count as busy.)"""
        since = time.time() - window_s
        rows = self._query(f"SELECT pid, COUNT(*) FROM deliveries WHERE t > {since!r} GROUP BY pid")
        return {int(pid): int(n) for pid, n in rows}

    def left_unsettled(self, pids: Iterable[int]) -> tuple[int, int]:
        """What killed processes ``pids`` died holding, read once the messages came back:
        (handler calls they never completed, ids they completed that another process then
        completed again — applied, not acked, redelivered)."""
        wanted = ",".join(str(int(p)) for p in pids) or "NULL"

        def counts(table: str) -> Counter[tuple[str, int]]:
            rows = self._query(
                f"SELECT message_id, pid, COUNT(*) FROM {table} WHERE pid IN ({wanted})"
                " GROUP BY 1, 2"
            )
            return Counter({(m, p): n for m, p, n in rows})

        in_handler = sum((counts("deliveries") - counts("completions")).values())
        theirs: dict[str, float] = {}  # id → when a killed process first completed it
        later: dict[str, float] = {}  # id → when any other process last completed it
        victims = {int(p) for p in pids}
        for message_id, pid, t in self._query("SELECT message_id, pid, t FROM completions"):
            if int(pid) in victims:
                theirs[message_id] = min(t, theirs.get(message_id, t))
            else:
                later[message_id] = max(t, later.get(message_id, t))
        redone = sum(1 for m, t in theirs.items() if later.get(m, 0.0) > t)
        return in_handler, redone

    def processed(self, ids: set[str] | None = None) -> int:
        done = {m for (m,) in self._query("SELECT message_id FROM effects")}
        return len(done if ids is None else done & ids)

    # --- the account -------------------------------------------------------------------------
    def account(
        self,
        parked: dict[str, str | None],
        queued: Iterable[str | None],
        seconds: float = 0.0,
        parked_copies: int | None = None,
    ) -> LedgerReport:
        """Where every sent id is: processed, parked or queued; the rest are unaccounted."""
        effects = self.effects()
        completions = self.completions()
        deliveries = self.deliveries()
        queued_ids = Counter(m for m in queued if m)
        sent = set(self.sent)
        processed = {m for m in effects if m in sent}
        unaccounted = sorted(sent - processed - set(parked) - set(queued_ids))
        twice = sorted(m for m, n in effects.items() if n > 1)
        seen = set(effects) | set(parked) | set(queued_ids) | set(deliveries)
        foreign = seen - sent
        report = LedgerReport(
            scenario=self.scenario,
            ids=len(sent),
            processed_once=sum(1 for m in processed if completions[m] <= 1),
            processed_twice=sum(1 for m in processed if completions[m] > 1),
            parked=sum(1 for m in parked if m in sent),
            queued=len(set(queued_ids) & sent),
            unaccounted=len(unaccounted),
            effects_twice=len(twice),
            deliveries=sum(deliveries.values()),
            seconds=seconds,
            parked_by_reason=dict(Counter(str(r) for m, r in parked.items() if m in sent)),
            notes=list(self.notes),
            unaccounted_sample=unaccounted[:10],
            effects_twice_sample=twice[:10],
            foreign=len(foreign),
        )
        if parked_copies is not None and parked_copies != len(parked):
            report.notes.append(
                f"{parked_copies} parked messages for {len(parked)} ids (parked twice: a copy "
                "confirmed whose original's ack was lost in a fault)"
            )
        TABLES.append(report)
        out = os.environ.get("RMQKIT_LEDGER_OUT")
        if out:
            with open(out, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(asdict(report)) + "\n")
        return report


def check(report: LedgerReport) -> None:
    """The invariants of every scenario: nothing lost, no effect applied twice, nothing foreign."""
    print("\n" + render([report]))
    if report.parked_by_reason:
        print(f"parked by reason: {report.parked_by_reason}")
    for text in report.notes:
        print(f"note: {text}")
    assert report.unaccounted == 0, f"lost ids: {report.unaccounted_sample}"
    assert report.effects_twice == 0, f"effects applied twice: {report.effects_twice_sample}"
    assert report.foreign == 0, f"{report.foreign} id(s) seen that were never sent"

"""DedupeWorkers (what `consume --dedupe` runs deliveries through) on a real SQLite file and the
real PostgreSQL, without a broker: calls stand in for handlers and write business rows in the
transaction they are given; the tests count rows in the database."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rmqkit.idempotency import (
    DedupeVerdict,
    DedupeWorkers,
    HandlerEnd,
    OrderKey,
    WorkerOptions,
    init_store,
)
from rmqkit.store import dialect_of
from tests.dedupe_harness import BACKENDS, query, store_dsn


@pytest.fixture(params=BACKENDS)
def dsn(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with store_dsn(request.param, tmp_path) as made:
        init_store(made)
        query(made, "CREATE TABLE business (message_id TEXT, k TEXT, version INTEGER)")
        yield made


def judge(outcome: str) -> HandlerEnd:
    return {"ok": HandlerEnd.OK, "fail": HandlerEnd.FAILED}.get(outcome, HandlerEnd.ABANDONED)


def writer(message_id: str, *, fail: bool = False, key: str = "", version: int = 0) -> Any:
    """An async handler stand-in: one business row in the transaction, then ok or fail."""

    async def call(tx: Any) -> str:
        sql = dialect_of(tx).q("INSERT INTO business (message_id, k, version) VALUES (?, ?, ?)")
        await tx.execute(sql, (message_id, key, version))
        await asyncio.sleep(random.random() / 1000)
        return "fail" if fail else "ok"

    return call


def sync_writer(message_id: str) -> Any:
    """A sync handler stand-in: the write runs in a thread on the sync connection."""

    async def call(tx: Any) -> str:
        sql = dialect_of(tx).q("INSERT INTO business (message_id) VALUES (?)")
        await asyncio.to_thread(tx.execute, sql, (message_id,))
        return "ok"

    return call


async def _lanes(dsn: str, **options: Any) -> DedupeWorkers[str]:
    lanes: DedupeWorkers[str] = DedupeWorkers(
        WorkerOptions(dsn=dsn, queue="q", **{"connections": 2, "batch": 20, **options}), judge
    )
    await lanes.start()
    return lanes


def business(dsn: str) -> Counter[str]:
    return Counter(row[0] for row in query(dsn, "SELECT message_id FROM business"))


def test_each_id_applied_once_with_duplicates_in_and_across_batches(dsn: str) -> None:
    ids = [f"m-{i}" for i in range(300)]
    deliveries = ids + random.sample(ids, 60) + ids[:10]

    async def main() -> Counter[DedupeVerdict]:
        lanes = await _lanes(dsn, pass_transaction=True)
        try:
            results = await asyncio.gather(*(lanes.run(m, writer(m)) for m in deliveries))
        finally:
            await lanes.close()
        return Counter(verdict for verdict, _ in results)

    verdicts = asyncio.run(main())
    assert verdicts == {DedupeVerdict.APPLIED: 300, DedupeVerdict.DUPLICATE: 70}
    assert business(dsn) == Counter(ids)
    assert query(dsn, "SELECT count(*) FROM rmqkit_processed") == [(300,)]


def test_a_failed_handler_rolls_back_its_rows_and_its_id(dsn: str) -> None:
    async def main() -> list[tuple[DedupeVerdict, str | None]]:
        lanes = await _lanes(dsn, pass_transaction=True)
        try:
            first = await asyncio.gather(
                *(lanes.run(f"m-{i}", writer(f"m-{i}", fail=i % 3 == 0)) for i in range(30))
            )
            again = await lanes.run("m-0", writer("m-0"))  # the retry of a failed one applies
        finally:
            await lanes.close()
        return [*first, again]

    results = asyncio.run(main())
    assert [v for v, _ in results[:30]].count(DedupeVerdict.ROLLED_BACK) == 10
    assert results[30] == (DedupeVerdict.APPLIED, "ok")
    applied = business(dsn)
    assert set(applied) == {f"m-{i}" for i in range(30) if i % 3} | {"m-0"}
    assert max(applied.values()) == 1
    assert query(dsn, "SELECT count(*) FROM rmqkit_processed") == [(21,)]


def test_two_consumers_racing_on_the_same_ids(dsn: str) -> None:
    """Two DedupeWorkers (two consumers, separate connections) get the same 200 ids at once."""
    ids = [f"r-{i}" for i in range(200)]

    async def main() -> Counter[DedupeVerdict]:
        a = await _lanes(dsn, pass_transaction=True)
        b = await _lanes(dsn, pass_transaction=True)
        try:
            results = await asyncio.gather(
                *(a.run(m, writer(m)) for m in ids), *(b.run(m, writer(m)) for m in reversed(ids))
            )
        finally:
            await a.close()
            await b.close()
        return Counter(verdict for verdict, _ in results)

    assert asyncio.run(main()) == {DedupeVerdict.APPLIED: 200, DedupeVerdict.DUPLICATE: 200}
    assert business(dsn) == Counter(ids)


def test_handlers_without_the_transaction_run_concurrently(dsn: str) -> None:
    running = 0
    peak = 0

    def call_for(fail: bool) -> Any:
        async def call(tx: Any) -> str:
            nonlocal running, peak
            assert tx is None
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.02)
            running -= 1
            return "fail" if fail else "ok"

        return call

    async def main() -> Counter[DedupeVerdict]:
        lanes = await _lanes(dsn, connections=1)
        try:
            results = await asyncio.gather(
                *(lanes.run(f"c-{i}", call_for(i == 5)) for i in range(20))
            )
        finally:
            await lanes.close()
        return Counter(verdict for verdict, _ in results)

    assert asyncio.run(main()) == {DedupeVerdict.APPLIED: 19, DedupeVerdict.ROLLED_BACK: 1}
    assert peak > 5
    assert query(dsn, "SELECT count(*) FROM rmqkit_processed") == [(19,)]


def test_sync_connections_for_thread_handlers(dsn: str) -> None:
    async def main() -> Counter[DedupeVerdict]:
        lanes = await _lanes(dsn, pass_transaction=True, sync_connection=True)
        try:
            ids = [f"s-{i}" for i in range(50)]
            results = await asyncio.gather(*(lanes.run(m, sync_writer(m)) for m in ids + ids[:5]))
        finally:
            await lanes.close()
        return Counter(verdict for verdict, _ in results)

    assert asyncio.run(main()) == {DedupeVerdict.APPLIED: 50, DedupeVerdict.DUPLICATE: 5}
    assert len(business(dsn)) == 50 and max(business(dsn).values()) == 1


def test_ordering_guard_converges_to_the_latest_version(dsn: str) -> None:
    deliveries = [(f"k{k}", v) for k in range(20) for v in range(1, 11)]
    random.shuffle(deliveries)

    async def main() -> Counter[DedupeVerdict]:
        lanes = await _lanes(dsn, pass_transaction=True, ordered=True, connections=3)
        try:
            results = await asyncio.gather(
                *(
                    lanes.run(
                        f"{k}-{v}",
                        writer(f"{k}-{v}", key=k, version=v),
                        OrderKey(k.encode(), v),
                    )
                    for k, v in deliveries
                )
            )
        finally:
            await lanes.close()
        return Counter(verdict for verdict, _ in results)

    verdicts = asyncio.run(main())
    assert verdicts[DedupeVerdict.APPLIED] + verdicts[DedupeVerdict.STALE] == 200
    assert verdicts[DedupeVerdict.STALE] > 0
    versions = dict(query(dsn, "SELECT key, version FROM rmqkit_versions WHERE scope = 'q'"))
    assert versions == {f"k{k}".encode(): 10 for k in range(20)}
    latest = query(dsn, "SELECT k, max(version) FROM business GROUP BY k")
    assert dict(latest) == {f"k{k}": 10 for k in range(20)}


def test_a_broken_transaction_reruns_each_message_alone(dsn: str) -> None:
    """One call breaks the shared transaction (bad SQL it swallows): the others of its batch
    are run again, each alone, and applied once; the bad one fails with the store's error."""

    def breaker() -> Any:
        async def call(tx: Any) -> str:
            with contextlib.suppress(Exception):
                await tx.execute("INSERT INTO no_such_table VALUES (1)")
            if dialect_of(tx).name == "sqlite":  # SQLite keeps the transaction usable: end it
                await tx.execute("ROLLBACK")
            return "ok"

        return call

    async def main() -> list[Any]:
        lanes = await _lanes(dsn, pass_transaction=True, connections=1, batch=50)
        try:
            calls = [lanes.run(f"b-{i}", writer(f"b-{i}")) for i in range(10)]
            calls.insert(5, lanes.run("bad", breaker()))
            # last in its batch: a PostgreSQL COMMIT of the aborted transaction would quietly
            # roll the whole batch back while every message in it looked applied
            calls.append(lanes.run("bad-last", breaker()))
            return list(await asyncio.gather(*calls, return_exceptions=True))
        finally:
            await lanes.close()

    results = asyncio.run(main())
    errors = [r for r in results if isinstance(r, BaseException)]
    assert len(errors) == 2
    assert business(dsn) == Counter(f"b-{i}" for i in range(10))
    recorded = {row[0] for row in query(dsn, "SELECT message_id FROM rmqkit_processed")}
    assert recorded == {f"b-{i}" for i in range(10)}


def test_a_store_cut_off_at_start_is_unavailable_not_uninitialised() -> None:
    """The start-up probe's backend terminated (a failover while a worker restarts):
    DatabaseUnavailable (69: the supervisor restarts the worker), not ConfigError 78 'run
    dedupe init' (fatal: it stopped every worker of the consumer)."""
    from rmqkit.errors import DatabaseUnavailable
    from tests.dedupe_harness import pg_schema_dsn

    async def scenario(dsn: str) -> None:
        lanes: DedupeWorkers[str] = DedupeWorkers(WorkerOptions(dsn=dsn, queue="q"), judge)
        real_open = lanes._open

        async def open_then_cut() -> Any:
            conn = await real_open()
            query(dsn, "SELECT pg_terminate_backend(%s)", (conn.handle.info.backend_pid,))
            return conn

        lanes._open = open_then_cut  # type: ignore[method-assign]
        with pytest.raises(DatabaseUnavailable):
            await lanes.start()

    with pg_schema_dsn() as dsn:
        init_store(dsn)
        asyncio.run(scenario(dsn))

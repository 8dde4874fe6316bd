"""DedupeWorkers of two scopes on one real store (SQLite file, PostgreSQL schema), no broker:
what one scope's lanes delete or lock never touches the other's rows — a failed handler's id,
the ids a handler's own COMMIT took along, the ordering guard's versions."""

from __future__ import annotations

import asyncio
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
from tests.dedupe_harness import BACKENDS, query, store_dsn


@pytest.fixture(params=BACKENDS)
def dsn(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with store_dsn(request.param, tmp_path) as made:
        init_store(made)
        yield made


def judge(outcome: str) -> HandlerEnd:
    return HandlerEnd.OK if outcome == "ok" else HandlerEnd.FAILED


def returning(outcome: str) -> Any:
    async def call(tx: Any) -> str:
        return outcome

    return call


async def _run(
    dsn: str, scope: str, calls: list[tuple[str, str, OrderKey | None]], **options: Any
) -> list[DedupeVerdict]:
    lanes: DedupeWorkers[str] = DedupeWorkers(
        WorkerOptions(dsn=dsn, queue="q", scope=scope, connections=1, batch=10, **options), judge
    )
    await lanes.start()
    try:
        results = await asyncio.gather(
            *(lanes.run(mid, returning(outcome), order) for mid, outcome, order in calls)
        )
    finally:
        await lanes.close()
    return [verdict for verdict, _ in results]


@pytest.mark.parametrize("ordered", [False, True])
def test_a_failed_handler_forgets_its_own_scope_s_id_only(dsn: str, ordered: bool) -> None:
    order = OrderKey(b"k", 1) if ordered else None
    assert asyncio.run(_run(dsn, "a", [("x", "ok", order)], ordered=ordered)) == [
        DedupeVerdict.APPLIED
    ]
    # scope b: the same id is new there; its handler fails, and its id is deleted again
    failed = asyncio.run(_run(dsn, "b", [("x", "fail", order)], ordered=ordered))
    assert failed == [DedupeVerdict.ROLLED_BACK]
    assert query(dsn, "SELECT scope, message_id FROM rmqkit_processed") == [("a", "x")]
    again = asyncio.run(_run(dsn, "a", [("x", "ok", order)], ordered=ordered))
    assert again == [DedupeVerdict.DUPLICATE]  # a's record survived b's rollback
    if ordered:
        versions = query(dsn, "SELECT scope, key, version FROM rmqkit_versions WHERE version > 0")
        assert [(s, bytes(k), v) for s, k, v in versions] == [("a", b"k", 1)]


def test_versions_of_one_key_are_per_scope(dsn: str) -> None:
    newer = asyncio.run(_run(dsn, "a", [("m1", "ok", OrderKey(b"k", 5))], ordered=True))
    older = asyncio.run(_run(dsn, "b", [("m2", "ok", OrderKey(b"k", 3))], ordered=True))
    stale = asyncio.run(_run(dsn, "b", [("m3", "ok", OrderKey(b"k", 2))], ordered=True))
    assert (newer, older, stale) == (
        [DedupeVerdict.APPLIED],
        [DedupeVerdict.APPLIED],
        [DedupeVerdict.STALE],
    )

"""rmqkit.broker.blocking without a broker: aiormq's blocked/unblocked notices reach a
BlockWatch even when the CLI quiets aiormq's loggers (CRITICAL), and nothing else of aiormq's
gets through that would not have. The real notice from a real alarm: test_alarms.py."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from rmqkit.broker.blocking import (
    AIORMQ_LOGGER,
    BLOCKED_NOTICE,
    UNBLOCKED_NOTICE,
    BlockWatch,
    alarm_kind,
    describe,
)


class FakeConnection:
    is_closed = False


class Seen(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def quieted() -> Iterator[Seen]:
    """aiormq quieted the way `rmqkit` does (cli/main.py), a handler on the root logger."""
    parent, logger = logging.getLogger("aiormq"), logging.getLogger(AIORMQ_LOGGER)
    saved = (parent.level, logger.level)
    seen = Seen()
    logging.getLogger().addHandler(seen)
    parent.setLevel(logging.CRITICAL)
    try:
        yield seen
    finally:
        logging.getLogger().removeHandler(seen)
        parent.setLevel(saved[0])
        logger.setLevel(saved[1])


def test_notices_reach_the_watch_through_a_quieted_logger(quieted: Seen) -> None:
    connection, other = FakeConnection(), FakeConnection()
    changes: list[bool] = []
    watch = BlockWatch(connection, lambda w: changes.append(w.blocked))
    log = logging.getLogger(AIORMQ_LOGGER)
    log.warning(BLOCKED_NOTICE, connection, "low on memory")
    assert watch.blocked and watch.reason == "low on memory" and watch.since is not None
    log.warning(UNBLOCKED_NOTICE, connection)
    assert not watch.blocked and changes == [True, False]
    # Another connection's notice, and aiormq's other warnings, stay as quiet as before.
    log.warning(BLOCKED_NOTICE, other, "low on disk")
    log.warning("Connection %r lost", other)
    assert not watch.blocked and quieted.messages == []
    log.critical("still shown: %s", "critical")
    assert quieted.messages == ["still shown: critical"]
    watch.close()
    log.warning(BLOCKED_NOTICE, connection, "low on memory")
    assert not watch.blocked  # closed: no longer watched


def test_reasons_read_as_an_operator_reads_them() -> None:
    assert alarm_kind("low on memory") == "memory" and alarm_kind("low on disk") == "disk"
    assert describe("low on disk") == "low on disk (a disk alarm on a node of the cluster)"
    assert "memory or disk alarm" in describe(None)

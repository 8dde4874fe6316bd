"""Error types are stored under their public names (issue 14): a class rmqkit exports at top
level is ``rmqkit.X`` in the ERROR_TYPE header and the log, not the module that defines it."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

import rmqkit
from rmqkit import headers as h
from rmqkit.consumer.decision import Failed, Park, RetryLater, Undecodable, decide
from rmqkit.consumer.policy import QueuePolicy

POLICY = QueuePolicy(
    queue="jobs.work",
    parking_queue="jobs.work.parking",
    retry_delays_ms=(1000,),
    max_attempts=3,
    wait_queues=(("jobs.work.wait.1s",),),
)


class MyPermanent(rmqkit.Permanent):
    """A handler's own subclass: named by its own module path."""


def _decide(exc: Exception, *, permanent: bool = False) -> Park | RetryLater:
    decision = decide(
        Failed.from_exception(exc, permanent=permanent),
        {},
        POLICY,
        exchange="jobs",
        routing_key="job",
        now=datetime(2026, 12, 1, tzinfo=UTC),
        host="h",
        pid=1,
    )
    assert isinstance(decision, Park | RetryLater)
    return decision


@pytest.mark.parametrize(
    ("qualified", "public"),
    [
        ("rmqkit.consumer.message.Permanent", "rmqkit.Permanent"),
        ("rmqkit.consumer.message.Retry", "rmqkit.Retry"),
        ("rmqkit.consumer.message.Message", "rmqkit.Message"),
        ("rmqkit.errors.ConfigError", "rmqkit.ConfigError"),
        # not exported at top level: stays as it is
        ("rmqkit.consumer.message.DecodeError", "rmqkit.DecodeError"),
        ("shipping.errors.MailboxFull", "shipping.errors.MailboxFull"),
        ("ValueError", "ValueError"),
        ("rmqkit.Permanent", "rmqkit.Permanent"),  # idempotent
    ],
)
def test_public_type_name(qualified: str, public: str) -> None:
    assert h.public_type_name(qualified) == public


def test_every_class_exported_at_top_level_maps_to_its_public_name() -> None:
    for name in rmqkit.__all__:
        value = getattr(rmqkit, name)
        if isinstance(value, type):
            qualified = f"{value.__module__}.{value.__qualname__}"
            assert h.public_type_name(qualified) == f"rmqkit.{name}", name


def test_permanent_is_stored_as_rmqkit_permanent() -> None:
    decision = _decide(rmqkit.Permanent("bad job"), permanent=True)
    assert isinstance(decision, Park)
    assert decision.headers[h.ERROR_TYPE] == "rmqkit.Permanent"


def test_retry_is_stored_as_rmqkit_retry() -> None:
    decision = _decide(rmqkit.Retry(delay_s=1))
    assert isinstance(decision, RetryLater)
    assert decision.headers[h.ERROR_TYPE] == "rmqkit.Retry"


def test_a_subclass_keeps_its_own_name_and_builtins_stay_bare() -> None:
    sub = _decide(MyPermanent("x"), permanent=True)
    assert sub.headers[h.ERROR_TYPE] == f"{__name__}.MyPermanent"
    assert _decide(ConnectionError("down")).headers[h.ERROR_TYPE] == "ConnectionError"


def test_permanent_errors_still_match_the_qualified_names() -> None:
    """Listing the module path in permanent_errors keeps working: matching uses the qualified
    names, only the stored name is the public one."""
    policy = QueuePolicy(
        queue="q",
        parking_queue="q.parking",
        retry_delays_ms=(1000,),
        max_attempts=3,
        wait_queues=(("q.wait",),),
        permanent_errors=frozenset({"rmqkit.consumer.message.Retry"}),
    )
    decision = decide(
        Failed.from_exception(rmqkit.Retry()),
        {},
        policy,
        exchange="",
        routing_key="q",
        now=datetime(2026, 12, 1, tzinfo=UTC),
        host="h",
        pid=1,
    )
    assert isinstance(decision, Park) and decision.headers[h.ERROR_TYPE] == "rmqkit.Retry"


def test_undecodable_type_goes_through_the_same_mapping() -> None:
    decision = decide(
        Undecodable("bad", exc_type="rmqkit.consumer.message.Permanent"),
        {},
        POLICY,
        exchange="",
        routing_key="q",
        now=datetime(2026, 12, 1, tzinfo=UTC),
        host="h",
        pid=1,
    )
    assert decision.headers[h.ERROR_TYPE] == "rmqkit.Permanent"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "pattern",
    ["rmqkit.consumer.message.Permanent", "rmqkit.Permanent", "Permanent", "rmqkit.*"],
)
def test_a_filter_written_with_the_old_module_path_still_finds_public_names(pattern: str) -> None:
    from rmqkit.parking.model import error_type_matches

    assert error_type_matches(pattern, "rmqkit.Permanent")  # views map old stored names first

"""Failure fingerprints (rmqkit.fingerprint): one failure, one id, whatever its values; the
frame is the application's; what the consumer writes is what a view computes again; and the
filters that select a group or a time window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from rmqkit import headers as h
from rmqkit.broker.codec import Properties
from rmqkit.cli.parking_options import moment_option, parked_filter
from rmqkit.consumer.decision import Park, decide
from rmqkit.consumer.outcomes import Failed
from rmqkit.consumer.policy import QueuePolicy
from rmqkit.errors import UsageError
from rmqkit.fingerprint import application_frame, fingerprint, normalise_message
from rmqkit.parking.model import ParkedFilter, ParkedMessage


def _traceback(*frames: tuple[str, str]) -> str:
    lines = ["Traceback (most recent call last):"]
    for path, func in frames:
        lines += [f'  File "{path}", line 12, in {func}', "    do()"]
    return "\n".join([*lines, "ValueError: boom"])


APP = ("/srv/releases/r17/app/payments.py", "charge")
RMQKIT = ("/venv/lib/python3.11/site-packages/rmqkit/consumer/handler.py", "run")
STDLIB = ("/usr/lib/python3.11/json/decoder.py", "decode")
CHECKOUT = ("/tmp/ci-clone/rmqkit/consumer/dispatch.py", "call")


def test_the_frame_is_the_innermost_of_the_applications_code() -> None:
    assert application_frame(_traceback(RMQKIT, APP, STDLIB)) == "payments.py:charge"
    assert application_frame(_traceback(CHECKOUT, APP)) == "payments.py:charge"
    # the release directory and the line number are not part of it: a deploy keeps the group
    moved = _traceback(RMQKIT, ("/srv/releases/r18/app/payments.py", "charge"))
    assert application_frame(moved) == "payments.py:charge"
    assert application_frame(_traceback(RMQKIT, STDLIB)) == ""
    assert application_frame(None) == "" and application_frame("ValueError: x") == ""


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("card declined for order 17: amount 12.50", "card declined for order 90210: amount 3"),
        ("'sku-17'", "'sku-4'"),
        ('no user "bob"', 'no user "alice smith"'),
        ("id 3f2a9c1e-1111-2222-3333-444455556666", "id 00000000-aaaa-bbbb-cccc-ddddeeeeffff"),
        ("token deadbeef99 refused", "token 0123456789abcdef refused"),
        ("mail a.b@example.com bounced", "mail x@y.org bounced"),
        ("timeout  after\n5s", "timeout after 30s"),
    ],
)
def test_values_do_not_split_a_failure(a: str, b: str) -> None:
    assert normalise_message(a) == normalise_message(b)
    tb = _traceback(APP)
    assert fingerprint("exhausted", "ValueError", a, tb).id == (
        fingerprint("exhausted", "ValueError", b, tb).id
    )


def test_reason_type_frame_and_words_each_split_a_failure() -> None:
    tb = _traceback(APP)
    base = fingerprint("exhausted", "ValueError", "refund 5 exceeds 3", tb)
    others = [
        fingerprint("permanent", "ValueError", "refund 5 exceeds 3", tb),
        fingerprint("exhausted", "KeyError", "refund 5 exceeds 3", tb),
        fingerprint("exhausted", "ValueError", "refund 5 exceeds 3", _traceback(("a.py", "f"))),
        fingerprint("exhausted", "ValueError", "charge 5 exceeds 3", tb),
    ]
    assert len({base.id, *(o.id for o in others)}) == 5
    assert len(base.id) == 12 and int(base.id, 16) >= 0


def _policy() -> QueuePolicy:
    return QueuePolicy("w", "w.parking", (), 1, ())


def _parked(headers: dict[str, object]) -> ParkedMessage:
    return ParkedMessage.from_delivery(1, Properties(message_id="m", headers=headers), b"{}")


def test_what_the_consumer_writes_is_what_a_view_computes() -> None:
    error = Failed("app.Error", "charge failed for order 17", _traceback(RMQKIT, APP))
    decision = decide(
        error, {}, _policy(), exchange="x", routing_key="k", now=datetime.now(UTC), host="h",
        pid=1,
    )  # fmt: skip
    assert isinstance(decision, Park)
    stored = decision.headers[h.FINGERPRINT]
    message = _parked(decision.headers)
    assert message.failure_id == stored
    without = {k: v for k, v in decision.headers.items() if k != h.FINGERPRINT}
    assert _parked(without).failure_id == stored  # parked before the header: the same id
    assert message.failure().frame == "payments.py:charge"


def test_a_broker_death_after_the_consumers_park_is_its_own_failure() -> None:
    error = Failed("app.Error", "boom", _traceback(APP))
    decision = decide(
        error, {}, _policy(), exchange="x", routing_key="k", now=datetime.now(UTC), host="h",
        pid=1,
    )  # fmt: skip
    assert isinstance(decision, Park)
    later = datetime.now(UTC) + timedelta(seconds=5)
    headers = {
        **decision.headers,
        h.REPLAYED_AT: h.format_timestamp(later - timedelta(seconds=1)),
        "x-death": [
            {
                "queue": "w",
                "reason": "delivery_limit",
                "count": 1,
                "time": later,
                "exchange": "",
                "routing-keys": ["w"],
            }
        ],
    }
    message = _parked(headers)
    assert message.reason == "delivery_limit"
    assert message.failure_id != decision.headers[h.FINGERPRINT]
    assert message.failure().frame == ""  # the old traceback is not this failure's


def test_group_since_and_until_select() -> None:
    error = Failed("app.Error", "boom", _traceback(APP))
    now = datetime.now(UTC)
    decision = decide(error, {}, _policy(), exchange="x", routing_key="k", now=now, host="h", pid=1)
    assert isinstance(decision, Park)
    message = _parked(decision.headers)
    group = message.failure_id
    assert ParkedFilter(group=group[:4]).matches(message, now)
    assert not ParkedFilter(group="0" if group[0] != "0" else "1").matches(message, now)
    parked = message.last_failed_at
    assert parked is not None
    assert ParkedFilter(since=parked).matches(message, now)
    assert not ParkedFilter(since=parked + timedelta(milliseconds=1)).matches(message, now)
    assert not ParkedFilter(until=parked).matches(message, now)
    assert ParkedFilter(until=parked + timedelta(milliseconds=1)).matches(message, now)


def test_the_options_parse_times_ages_and_group_ids() -> None:
    assert moment_option("2026-12-01T09:00Z", "--since") == datetime(2026, 12, 1, 9, tzinfo=UTC)
    assert moment_option("2026-12-01", "--since") == datetime(2026, 12, 1, tzinfo=UTC)
    ago = moment_option("2h", "--since")
    assert ago is not None and abs((datetime.now(UTC) - ago).total_seconds() - 7200) < 5
    with pytest.raises(UsageError, match="--until wants an ISO time"):
        moment_option("yesterday", "--until")
    flt = parked_filter([], None, None, None, None, [], [], None, group="ABC1")
    assert flt.group == "abc1"
    with pytest.raises(UsageError, match="--group wants"):
        parked_filter([], None, None, None, None, [], [], None, group="xyz")

"""configure_logging: JSON lines and text lines carrying the message context; idempotent."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator

import pytest

from rmqkit.consumer.logs import CONTEXT_FIELDS, configure_logging, message_extra

TS = r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z"


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """Put the root logger and the quietened loggers back as they were."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    quiet = {name: logging.getLogger(name).level for name in ("aiormq", "aio_pika")}
    yield
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
    for h in handlers:
        if h not in root.handlers:
            root.addHandler(h)
    root.setLevel(level)
    for name, lvl in quiet.items():
        logging.getLogger(name).setLevel(lvl)


def test_json_lines_parse_and_carry_message_id_and_attempt() -> None:
    out = io.StringIO()
    configure_logging("json", stream=out)
    log = logging.getLogger("rmqkit.consumer")
    log.info("handled %s", "ok", extra=message_extra("o-17", 2, queue="orders.work"))
    log.warning(
        "parked",
        extra=message_extra("o-18", 5, decision="park", reason="exhausted", error_type="KeyError"),
    )
    log.info("not about a message")

    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    first, second, third = (json.loads(line) for line in lines)

    assert re.fullmatch(TS, first["ts"])
    assert first == {
        "ts": first["ts"],
        "level": "INFO",
        "logger": "rmqkit.consumer",
        "msg": "handled ok",
        "message_id": "o-17",
        "attempt": 2,
        "queue": "orders.work",
    }
    assert second["level"] == "WARNING"
    assert (second["message_id"], second["attempt"]) == ("o-18", 5)
    assert (second["decision"], second["reason"], second["error_type"]) == (
        "park",
        "exhausted",
        "KeyError",
    )
    assert set(third) == {"ts", "level", "logger", "msg"}


def test_json_timestamp_is_utc() -> None:
    out = io.StringIO()
    configure_logging("json", stream=out)
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", None, None)
    record.created = 1_795_968_000.123  # 2026-11-29T16:00:00.123Z
    logging.getLogger().handle(record)
    assert json.loads(out.getvalue())["ts"] == "2026-11-29T16:00:00.123Z"


def test_json_exception_and_odd_values_stay_on_one_line() -> None:
    out = io.StringIO()
    configure_logging("json", stream=out)
    log = logging.getLogger("rmqkit.consumer")
    try:
        raise ValueError("bad\nbody")
    except ValueError:
        log.exception("handler failed", extra=message_extra(None, 1, delivery_tag=object()))
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert "message_id" not in record  # None is left out
    assert record["attempt"] == 1
    assert record["delivery_tag"].startswith("<object object")
    assert "ValueError: bad\nbody" in record["exc"]


def test_text_format_shows_the_context_in_brackets() -> None:
    out = io.StringIO()
    configure_logging("text", stream=out)
    log = logging.getLogger("rmqkit.consumer")
    log.info("retrying", extra=message_extra("o-17", 2, tier="5s"))
    log.info("connected")
    log.info("odd", extra=message_extra("has space", 1))

    first, second, third = out.getvalue().splitlines()
    assert re.fullmatch(
        TS + r" INFO rmqkit\.consumer: retrying \[message_id=o-17 attempt=2 tier=5s\]", first
    )
    assert re.fullmatch(TS + r" INFO rmqkit\.consumer: connected", second)
    assert third.endswith('odd [message_id="has space" attempt=1]')


def test_text_format_appends_the_traceback() -> None:
    out = io.StringIO()
    configure_logging("text", stream=out)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("rmqkit.consumer").exception("failed", extra=message_extra("m", 3))
    text = out.getvalue()
    assert text.splitlines()[0].endswith("failed [message_id=m attempt=3]")
    assert "Traceback (most recent call last)" in text
    assert "RuntimeError: boom" in text


def test_idempotent_and_switching_format() -> None:
    out = io.StringIO()
    configure_logging("text", stream=out)
    configure_logging("json", stream=out)
    configure_logging("json", stream=out)
    logging.getLogger("rmqkit.consumer").info("once")
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0])["msg"] == "once"
    ours = [h for h in logging.getLogger().handlers if getattr(h, "_rmqkit_consumer_handler", 0)]
    assert len(ours) == 1


def test_replaces_a_basic_config_handler_but_keeps_others() -> None:
    root = logging.getLogger()
    plain = logging.StreamHandler(io.StringIO())
    other = logging.NullHandler()
    root.addHandler(plain)  # what logging.basicConfig (as in rmqkit.cli.main) installs
    root.addHandler(other)
    out = io.StringIO()
    configure_logging("json", stream=out)
    assert plain not in root.handlers
    assert other in root.handlers
    logging.getLogger("rmqkit").info("x")
    assert len(out.getvalue().splitlines()) == 1


def test_level_and_quiet_client_loggers() -> None:
    out = io.StringIO()
    configure_logging("json", level=logging.DEBUG, stream=out)
    logging.getLogger("rmqkit.consumer").debug("debug shows")
    logging.getLogger("aiormq.connection").info("reconnecting chatter")
    logging.getLogger("aio_pika.robust_connection").debug("more chatter")
    logging.getLogger("aiormq.connection").warning("worth seeing")
    msgs = [json.loads(line)["msg"] for line in out.getvalue().splitlines()]
    assert msgs == ["debug shows", "worth seeing"]
    assert logging.getLogger("aiormq").level == logging.WARNING

    configure_logging("json", level=logging.ERROR, stream=out)
    assert logging.getLogger("aio_pika").level == logging.ERROR


def test_bad_format_is_refused() -> None:
    with pytest.raises(ValueError, match="log format"):
        configure_logging("yaml")  # type: ignore[arg-type]


def test_message_extra() -> None:
    assert message_extra("m", 1) == {"message_id": "m", "attempt": 1}
    assert message_extra(None, 2, tier="1s", reason="exhausted") == {
        "message_id": None,
        "attempt": 2,
        "tier": "1s",
        "reason": "exhausted",
    }
    with pytest.raises(TypeError, match="unknown log context field"):
        message_extra("m", 1, colour="red")
    assert set(CONTEXT_FIELDS) >= {"message_id", "attempt", "queue", "delivery_tag", "tier"}


def test_a_formatted_traceback_follows_the_line_in_text_and_is_exc_in_json() -> None:
    """The handler's traceback, already formatted (the copy sender logs it once per message)."""
    trace = "Traceback (most recent call last):\n  File \"h.py\", line 1\nKeyError: 'x'\n"
    for fmt in ("text", "json"):
        out = io.StringIO()
        configure_logging(fmt, stream=out)  # type: ignore[arg-type]
        logging.getLogger("rmqkit.consumer").info(
            "retry via q.wait: KeyError: 'x'", extra={"message_id": "m-1", "traceback": trace}
        )
        text = out.getvalue()
        if fmt == "json":
            (line,) = text.splitlines()
            assert json.loads(line)["exc"] == trace.rstrip("\n")
        else:
            first, *rest = text.rstrip("\n").split("\n")
            assert re.match(TS + r" INFO rmqkit.consumer: retry via q.wait", first)
            assert "\n".join(rest) == trace.rstrip("\n")

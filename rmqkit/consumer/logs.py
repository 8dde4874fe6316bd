"""Logging for the consumer process: text or JSON lines, with the message's context on each line.

``configure_logging("json")`` makes every record one JSON object on one line::

    {"ts": "2026-11-29T16:00:00.123Z", "level": "INFO", "logger": "rmqkit.consumer",
     "msg": "retrying", "message_id": "o-17", "attempt": 2, "tier": "5s"}

(printed on one line), and ``configure_logging("text")`` one readable line::

    2026-11-29T16:00:00.123Z INFO rmqkit.consumer: retrying [message_id=o-17 attempt=2 tier=5s]

The context fields are ``CONTEXT_FIELDS``, passed with ``extra=``; ``message_extra()`` builds that
dict for a message. A field whose value is None is left out. An exception's traceback is the
``exc`` field in JSON and follows the line in text; so is a traceback already formatted, passed
as ``extra={"traceback": text}`` (the handler's, logged once per message: rmqkit.consumer.copies).

Only the standard library; safe to call more than once (the handler it installed before is
replaced, as is a plain stream handler left on the root logger by ``logging.basicConfig``, so
lines are never printed twice).
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from typing import Any, Final, Literal, TextIO

from rmqkit import tracing

CONTEXT_FIELDS: Final = (
    "message_id",
    "trace_id",
    "span_id",
    "attempt",
    "delivered",
    "queue",
    "delivery_tag",
    "decision",
    "reason",
    "tier",
    "error_type",
)

# Client libraries that log every connection hiccup at INFO/DEBUG; rmqkit reports what matters.
QUIET_LOGGERS: Final = ("aiormq", "aio_pika")

_HANDLER_MARK: Final = "_rmqkit_consumer_handler"


class _UtcClock:
    """ISO-8601 UTC timestamps with milliseconds; the date part is formatted once per second."""

    __slots__ = ("_prefix", "_second")

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def format(self, created: float) -> str:
        second, millis = divmod(int(created * 1000), 1000)
        if second != self._second:
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = second
        return f"{self._prefix}.{millis:03d}Z"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, msg, then the context fields present."""

    def __init__(self) -> None:
        super().__init__()
        self._clock = _UtcClock()

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": self._clock.format(record.created),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = record.__dict__
        for name in CONTEXT_FIELDS:
            value = fields.get(name)
            if value is not None:
                out[name] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        elif fields.get("traceback"):
            out["exc"] = str(fields["traceback"]).rstrip("\n")
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """``<ts> <LEVEL> <logger>: <msg> [field=value ...]``, the bracket only when fields are set."""

    def __init__(self) -> None:
        super().__init__()
        self._clock = _UtcClock()

    def format(self, record: logging.LogRecord) -> str:
        line = (
            f"{self._clock.format(record.created)} {record.levelname} {record.name}: "
            f"{record.getMessage()}"
        )
        fields = record.__dict__
        context = [
            f"{name}={_text_value(fields[name])}"
            for name in CONTEXT_FIELDS
            if fields.get(name) is not None
        ]
        if context:
            line = f"{line} [{' '.join(context)}]"
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        elif record.exc_text:
            line = f"{line}\n{record.exc_text}"
        elif fields.get("traceback"):
            line = f"{line}\n{str(fields['traceback']).rstrip(chr(10))}"
        if record.stack_info:
            line = f"{line}\n{self.formatStack(record.stack_info)}"
        return line


def _text_value(value: object) -> str:
    """The value as is, or JSON-quoted when it would make the bracket ambiguous."""
    text = str(value)
    if not text or any(c in text for c in ' ="[]\n\r\t'):
        return json.dumps(text)
    return text


# The message being handled in this task (set by the runner; asyncio tasks and the handler
# threads copy it), so even a handler's own log lines carry message_id and attempt.
current_message: contextvars.ContextVar[tuple[str | None, int] | None] = contextvars.ContextVar(
    "rmqkit_current_message", default=None
)


class MessageContextFilter(logging.Filter):
    """Adds message_id/attempt of the message in hand to records that do not name one, and
    the trace and span ids of the current span when tracing (rmqkit.tracing)."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = current_message.get()
        if context is not None and getattr(record, "message_id", None) is None:
            record.message_id, record.attempt = context
        if tracing.active() and getattr(record, "trace_id", None) is None:
            # here, not in the formatter: a filter runs in the task that logs, where the
            # delivery's span is the current one
            ids = tracing.current_ids()
            if ids is not None:
                record.trace_id, record.span_id = ids
        return True


def configure_logging(
    fmt: Literal["text", "json"],
    level: int = logging.INFO,
    stream: TextIO | None = None,
) -> None:
    """Send the process's log records to ``stream`` (default: sys.stderr) in ``fmt``.

    Sets the root logger's level, replaces the handler an earlier call installed (and plain
    stream handlers from ``logging.basicConfig``), and keeps aiormq/aio_pika below WARNING quiet.
    """
    if fmt == "json":
        formatter: logging.Formatter = JsonFormatter()
    elif fmt == "text":
        formatter = TextFormatter()
    else:
        raise ValueError(f"log format must be 'text' or 'json', got {fmt!r}")

    root = logging.getLogger()
    for old in list(root.handlers):
        # Ours from an earlier call, or exactly what basicConfig() installs; handlers of other
        # types (pytest's capture, syslog, ...) are someone else's and stay.
        if getattr(old, _HANDLER_MARK, False) or type(old) is logging.StreamHandler:
            root.removeHandler(old)
            if getattr(old, _HANDLER_MARK, False):
                old.close()

    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(formatter)
    handler.addFilter(MessageContextFilter())
    setattr(handler, _HANDLER_MARK, True)
    root.addHandler(handler)
    root.setLevel(level)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(max(level, logging.WARNING))


def message_extra(message_id: str | None, attempt: int, **more: Any) -> dict[str, Any]:
    """The ``extra=`` dict for a log line about one message, e.g.
    ``log.info("parked", extra=message_extra(msg.message_id, msg.attempt, reason="exhausted"))``.

    ``more`` takes the other ``CONTEXT_FIELDS`` (queue, delivery_tag, decision, reason, tier,
    error_type); other names are refused, since the formatters would silently drop them.
    """
    unknown = more.keys() - _CONTEXT_SET
    if unknown:
        raise TypeError(f"unknown log context field(s): {', '.join(sorted(unknown))}")
    extra: dict[str, Any] = {"message_id": message_id, "attempt": attempt}
    extra.update(more)
    return extra


_CONTEXT_SET: Final = frozenset(CONTEXT_FIELDS)

__all__ = [
    "CONTEXT_FIELDS",
    "JsonFormatter",
    "TextFormatter",
    "configure_logging",
    "message_extra",
]

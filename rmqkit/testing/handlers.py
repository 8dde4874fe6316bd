"""``run_handler``: what the consumer would do with one message, without a broker.

The message takes the consumer's own per-message path (rmqkit.consumer.dispatch): the size and
message-id checks, the attempt number from the headers, the body's encrypted fields (no key ring
here: a body holding an envelope is undecryptable, as for a consumer without one), the handler
call with its argument built and validated by rmqkit.consumer.handler, and the decision of
rmqkit.consumer.decision with the queue's tiers, attempts and permanent errors. Only the
publishing of the copy and the ack are left out; ``HandlerResult.headers`` is what the copy
would carry.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import random
import socket
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from rmqkit import headers as h
from rmqkit.consumer import handler as handler_module
from rmqkit.consumer.attempts import attempt_number, delivery_count
from rmqkit.consumer.config import ConsumerConfig
from rmqkit.consumer.decision import (
    DecryptFailed,
    HandlerOutcome,
    MissingMessageId,
    TooLarge,
    decide,
)
from rmqkit.consumer.loading import LoadedHandler, handler_from_callable, load_handler
from rmqkit.consumer.message import Message
from rmqkit.consumer.routing import Router, Routes
from rmqkit.crypto import Undecryptable as UndecryptableField
from rmqkit.crypto import decrypt_fields
from rmqkit.delay import delivered_route
from rmqkit.errors import RmqkitError, UsageError
from rmqkit.testing.arrange import attempt_headers, queue_config
from rmqkit.testing.result import HandlerResult, result_of
from rmqkit.topology.model import Topology

__all__ = [
    "HandlerAborted",
    "HandlerResult",
    "UnawaitedResult",
    "run_handler",
    "run_handler_async",
    "run_retries",
]

# A handler function or callable, a "module:function" (or routed "module") spec, a module of
# @rmqkit.handler functions, a Router, or what load_handler returned.
HandlerLike = Callable[..., Any] | str | types.ModuleType | Router | LoadedHandler


class HandlerAborted(RmqkitError):
    """The handler raised a BaseException that is not an Exception (KeyboardInterrupt,
    SystemExit, GeneratorExit, ...): the consumer takes no decision for such a message.

    A worker of ``rmqkit consume`` stops on it without acking: the broker hands the message
    back, and once the queue's delivery limit is reached it parks it as ``delivery_limit``.
    The original exception is ``__cause__``."""


class UnawaitedResult(RmqkitError):
    """An ``async def`` handler returned an awaitable (e.g. ``return send(order)`` with ``send``
    a coroutine function) instead of awaiting it: the consumer acks such a message as handled,
    but the returned coroutine never runs. Await it inside the handler."""


def run_handler(
    handler: HandlerLike,
    body: bytes | str = b"",
    *,
    headers: Mapping[str, Any] | None = None,
    attempt: int | None = None,
    message_id: str | None = "test-message",
    exchange: str = "",
    routing_key: str = "",
    content_type: str | None = None,
    correlation_id: str | None = None,
    redelivered: bool = False,
    topology: Topology | str | os.PathLike[str] | None = None,
    queue: str | None = None,
    max_attempts: int | None = None,
    retry_delays: Iterable[int | str] | None = None,
    permanent_errors: Iterable[str] = (),
    handler_timeout_s: float | None = None,
    transaction: Any = None,
    rand: Callable[[], float] | None = None,
    now: datetime | None = None,
) -> HandlerResult:
    """Run ``handler`` on one message as ``rmqkit consume`` would and return its decision.

    ``handler``: a function (``def`` or ``async def``, any signature the consumer accepts), a
    ``"module:function"`` spec, or routed handlers: a module of ``@rmqkit.handler`` functions
    (the module, or its name as a spec), or a ``rmqkit.consumer.routing.Router``; the message
    then runs the route its type names, and one no route names is parked ``unroutable_type``.
    ``body``: bytes (a str is encoded as UTF-8). ``headers``: the delivery's headers (copied
    first; the handler sees the copy, as the consumer hands its delivery's dict over).
    ``attempt``: the number of this delivery (1: the first), written as the header earlier
    copies would carry; None reads it from ``headers`` (default 1).

    The queue: ``topology`` (a file path or a loaded Topology) and ``queue`` (its work queue;
    may be left out when the file has one) give the tiers, ``max_attempts``,
    ``permanent_errors``, ``handler_timeout``, ``require_message_id`` and
    ``max_message_bytes`` of that queue. Without a topology the queue has the topology file's
    defaults, changed by ``retry_delays`` (ms or durations such as ``"5s"``) and
    ``max_attempts``. ``permanent_errors`` and ``handler_timeout_s`` act as the options of
    ``rmqkit consume`` do. ``transaction``: the second argument of a handler that takes a
    ``rmqkit.Transaction`` (required for one; no dedupe store is involved). ``rand`` picks
    the jitter slot (default random.random), ``now`` the failure time written to the headers.

    Raises HandlerAborted when the handler raises a BaseException that is not an Exception,
    UnawaitedResult when an ``async def`` handler returns an awaitable, ConfigError when the
    handler cannot be one, UsageError for bad arguments. Must be called outside a running
    event loop: in an ``async`` test, ``await run_handler_async(...)``.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise UsageError(
            "run_handler was called inside a running event loop; in an async test use "
            "`await rmqkit.testing.run_handler_async(...)` (same arguments)"
        )
    result: HandlerResult = asyncio.run(
        run_handler_async(
            handler,
            body,
            headers=headers,
            attempt=attempt,
            message_id=message_id,
            exchange=exchange,
            routing_key=routing_key,
            content_type=content_type,
            correlation_id=correlation_id,
            redelivered=redelivered,
            topology=topology,
            queue=queue,
            max_attempts=max_attempts,
            retry_delays=retry_delays,
            permanent_errors=permanent_errors,
            handler_timeout_s=handler_timeout_s,
            transaction=transaction,
            rand=rand,
            now=now,
        )
    )
    return result


async def run_handler_async(
    handler: HandlerLike,
    body: bytes | str = b"",
    *,
    headers: Mapping[str, Any] | None = None,
    attempt: int | None = None,
    message_id: str | None = "test-message",
    exchange: str = "",
    routing_key: str = "",
    content_type: str | None = None,
    correlation_id: str | None = None,
    redelivered: bool = False,
    topology: Topology | str | os.PathLike[str] | None = None,
    queue: str | None = None,
    max_attempts: int | None = None,
    retry_delays: Iterable[int | str] | None = None,
    permanent_errors: Iterable[str] = (),
    handler_timeout_s: float | None = None,
    transaction: Any = None,
    rand: Callable[[], float] | None = None,
    now: datetime | None = None,
) -> HandlerResult:
    """``run_handler`` in the running event loop (for ``async`` tests); same arguments."""
    loaded, returned = _watched(_loaded(handler))
    if loaded.takes_transaction and transaction is None:
        raise UsageError(
            f"{loaded.spec} takes a rmqkit.Transaction (consume --dedupe): pass "
            "transaction= (your store's transaction, or a stand-in), or test it with the "
            "rmqkit_broker fixture and consume_until_idle(..., dedupe=DSN)"
        )
    config = queue_config(
        loaded, topology, queue, max_attempts, retry_delays, permanent_errors, handler_timeout_s
    )
    raw = body.encode("utf-8") if isinstance(body, str) else bytes(body)
    delivery_headers = attempt_headers(headers, attempt)
    outcome, attempt_no, deliveries = await _outcome(
        loaded,
        config,
        raw,
        delivery_headers,
        message_id=message_id,
        exchange=exchange,
        routing_key=routing_key,
        content_type=content_type,
        correlation_id=correlation_id,
        redelivered=redelivered,
        transaction=transaction,
    )
    decision = decide(
        outcome,
        delivery_headers,
        config.policy,
        exchange=exchange,
        routing_key=routing_key,
        now=now if now is not None else datetime.now(UTC),
        host=socket.gethostname(),
        pid=os.getpid(),
        rand=rand if rand is not None else random.random,
        delivered=deliveries,
    )
    if returned:
        for value in returned:
            if inspect.iscoroutine(value):
                value.close()  # never awaited, by the handler's own doing: no warning for it
        raise UnawaitedResult(
            f"the async handler {loaded.spec} returned {type(returned[0]).__name__} without "
            "awaiting it: the consumer would ack the message and the returned awaitable would "
            "never run; await it in the handler"
        )
    return result_of(decision, outcome, attempt_no)


def _watched(loaded: LoadedHandler) -> tuple[LoadedHandler, list[Any]]:
    """``loaded`` with an ``async def`` target wrapped to keep an awaitable it returns (the
    consumer drops it unawaited); a plain ``def`` returning one is awaited by the consumer."""
    returned: list[Any] = []
    if loaded.routes is not None:  # each async route watched the same way
        routes = {
            name: _watched_into(route, returned) for name, route in loaded.routes.handlers.items()
        }
        return replace(loaded, routes=Routes(loaded.routes.route_by, routes)), returned
    return _watched_into(loaded, returned), returned


def _watched_into(loaded: LoadedHandler, returned: list[Any]) -> LoadedHandler:
    if not loaded.is_async:
        return loaded
    target = loaded.target

    async def checked(*args: Any, **kwargs: Any) -> Any:
        result = await target(*args, **kwargs)
        if inspect.isawaitable(result):
            returned.append(result)
        return result

    return replace(loaded, target=checked)


def run_retries(
    handler: HandlerLike,
    body: bytes | str = b"",
    **options: Any,
) -> list[HandlerResult]:
    """``run_handler`` on the first delivery, then on each retry copy it makes, as the broker
    brings it back (the copy's headers; from the default exchange with the work queue's name as
    routing key), until the message is acked or parked. One result per delivery, the last one
    the ack or park. ``options``: run_handler's keywords (``attempt`` applies to the first)."""
    results = [run_handler(handler, body, **options)]
    queue = results[0].headers.get(h.ORIGIN_QUEUE)
    while results[-1].action == "retry" and len(results) <= _MAX_RETRIES:
        options = {
            **options,
            "headers": results[-1].headers,
            "attempt": None,
            "exchange": "",
            "routing_key": queue if isinstance(queue, str) else "",
        }
        results.append(run_handler(handler, body, **options))
    return results


_MAX_RETRIES = 10_000  # far above any max_attempts a topology would have


def _loaded(handler: HandlerLike) -> LoadedHandler:
    if isinstance(handler, LoadedHandler):
        return handler
    if isinstance(handler, str):
        return load_handler(handler)
    return handler_from_callable(handler)


async def _outcome(
    loaded: LoadedHandler,
    config: ConsumerConfig,
    body: bytes,
    headers: dict[str, Any],
    *,
    message_id: str | None,
    exchange: str,
    routing_key: str,
    content_type: str | None,
    correlation_id: str | None,
    redelivered: bool,
    transaction: Any,
) -> tuple[HandlerOutcome, int, int]:
    """The handler's outcome, as rmqkit.consumer.dispatch reaches it (same checks, same order),
    with this delivery's attempt number and the broker's delivery count."""
    attempt = attempt_number(
        headers,
        config.queue,
        wait_queues=config.policy.all_wait_queues,
        broker_retry=config.policy.broker_retry,
    )
    deliveries = delivery_count(headers, redelivered)
    if config.max_message_bytes is not None and len(body) > config.max_message_bytes:
        return TooLarge(len(body), config.max_message_bytes), attempt, deliveries
    if config.require_message_id and not message_id:
        return MissingMessageId(), attempt, deliveries
    try:
        opened = decrypt_fields(body, None, None, first=config.encrypted_fields)
    except UndecryptableField as exc:
        return DecryptFailed(str(exc), exc.reason), attempt, deliveries
    shown_exchange, shown_routing_key = delivered_route(exchange, routing_key, headers)
    message = Message(
        opened,
        headers=headers,  # the handler's dict is the one decided on, as in the consumer
        message_id=message_id,
        routing_key=shown_routing_key,
        exchange=shown_exchange,
        redelivered=redelivered,
        attempt=attempt,
        content_type=content_type,
        correlation_id=correlation_id,
        delivery_tag=1,
    )
    try:
        outcome = await handler_module.run_handler(
            loaded,
            message,
            timeout_s=config.handler_timeout_s,
            permanent_types=frozenset(config.policy.permanent_errors),
            transaction=transaction,
        )
    except asyncio.CancelledError:
        raise
    except BaseException as exc:
        if isinstance(exc, Exception):
            raise
        raise HandlerAborted(
            f"the handler raised {type(exc).__name__}, which is not an Exception: the consumer "
            "takes no decision for this message (its worker stops without acking it; the "
            "broker redelivers it, and parks it as delivery_limit at the queue's delivery "
            "limit). Raise an Exception subclass, rmqkit.Retry or rmqkit.Permanent instead"
        ) from exc
    return outcome, attempt, deliveries

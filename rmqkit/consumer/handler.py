"""Running a loaded handler on one message and classifying how it ended (the per-message path).

``run_handler`` only calls what rmqkit.consumer.loading prepared once: it builds the argument,
runs the handler (``async def`` awaited in the event loop; plain ``def`` in a thread pool:
``asyncio.to_thread``, an executor, or the consumer's HandlerThreads, so it cannot block the loop),
applies the handler timeout through one shared timer per loop, and turns the way it ended into an
HandlerOutcome (Success, Failed, HandlerTimeout, Undecodable, UnroutableType for a routed handler
with no route for the message).

The loading names (``load_handler``, ``LoadedHandler``, ``HandlerInput``) are re-exported here, so
``rmqkit.consumer.handler`` stays the one import for both halves.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import traceback as traceback_module
import weakref
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from pydantic import ValidationError

from rmqkit.consumer.decision import (
    Failed,
    HandlerOutcome,
    HandlerTimeout,
    Success,
    Undecodable,
    qualified_type_name,
)
from rmqkit.consumer.loading import HandlerInput, LoadedHandler, load_handler, one_line, type_label
from rmqkit.consumer.message import DecodeError, Message, Permanent, Retry
from rmqkit.consumer.policy import QueuePolicy
from rmqkit.consumer.threads import HandlerThreads

# --- running -------------------------------------------------------------------------------------

_SUCCESS = Success()


async def run_handler(
    handler: LoadedHandler,
    message: Message,
    *,
    timeout_s: float | None,
    permanent_types: frozenset[str],
    executor: Executor | HandlerThreads | None = None,
    transaction: Any = None,
) -> HandlerOutcome:
    """Run ``handler`` on ``message`` and say how it ended. Never raises, except CancelledError
    (and BaseExceptions such as SystemExit/KeyboardInterrupt, which are not outcomes).

    ``timeout_s``: the handler timeout (None: no limit). A sync handler's thread cannot be
    stopped: on timeout the outcome is HandlerTimeout all the same and the thread is left to
    finish on its own, keeping its executor worker busy until then (its side effects may still
    happen after the message was sent for retry; at-least-once).
    ``permanent_types``: exception type names (qualified or bare, as in
    QueuePolicy.permanent_errors) that mark a failure permanent; a listed base class covers its
    subclasses. ``executor``: where sync handlers run (default: the loop's default executor
    through asyncio.to_thread, whose size bounds how many sync handlers run at once). With
    HandlerThreads (the consumer's) the timeout starts only once a thread is free, so a message
    never times out queued behind other calls, and a call that outlives its timeout is counted
    as stuck.

    The handler runs in the calling task: no task is created per message, and the timeout
    cancels the calling task's await exactly as ``asyncio.timeout`` would (a cancellation from
    outside still propagates), but through one shared timer per event loop instead of a timer
    per call (see _Watchdog).

    ``transaction``: passed to a handler's parameter annotated ``rmqkit.Transaction``
    (``consume --dedupe``). The arguments are built in the handler's declared order
    (LoadedHandler.bind; the common one- or two-parameter forms skip that step). A routed
    handler (LoadedHandler.routes) runs the route the message's type names, or returns
    UnroutableType without running anything.
    """
    if handler.routes is not None:
        chosen = handler.routes.select(message)
        if not isinstance(chosen, LoadedHandler):
            return chosen  # UnroutableType: no route for the message's type
        handler = chosen
    target = handler.target
    if handler.bind is not None:
        target = handler.bind(target, message, transaction)
    elif handler.takes_transaction:
        target = _with_transaction(target, transaction)
    if handler.convert is None:
        argument: Any = message
    else:
        try:
            argument = handler.convert(message)
        except ValidationError as exc:
            return Undecodable(_validation_detail(exc, handler.input_type))
        except DecodeError as exc:
            return Undecodable(str(exc))
        except RecursionError as exc:
            # A body (or a JSON string the model parses) nested deeper than Python recurses:
            # the same body fails the same way every time, so it is poison, not transient.
            return _undecodable(exc, "the body is nested too deeply to decode")
        except Exception as exc:  # a model's validator raising something of its own
            return _classify(exc, permanent_types)

    if timeout_s is None:
        try:
            if handler.is_async:
                await target(argument)
            else:
                await _in_thread(target, argument, executor)
        except Exception as exc:
            return _classify(exc, permanent_types)
        return _SUCCESS

    if isinstance(executor, HandlerThreads) and not handler.is_async and executor.full:
        await executor.wait_for_thread()  # the timeout counts from the handler's start
    watchdog = _watchdog()
    deadline = watchdog.start(timeout_s)
    try:
        if handler.is_async:
            await target(argument)
        else:
            await _in_thread(target, argument, executor)
    except asyncio.CancelledError:
        # Ours if the watchdog cancelled and nobody else did meanwhile (asyncio.timeout's rule).
        if deadline.expired and deadline.task.uncancel() <= deadline.cancelling:
            return HandlerTimeout(timeout_s)
        raise
    except Exception as exc:
        if deadline.expired:
            # The handler turned our cancellation into another error: it still timed out. (A
            # TimeoutError of its own, e.g. an HTTP client's, is an ordinary failure.)
            deadline.task.uncancel()
            return HandlerTimeout(timeout_s)
        return _classify(exc, permanent_types)
    else:
        if deadline.expired:  # it swallowed the cancellation and finished: late, but done
            deadline.task.uncancel()
        return _SUCCESS
    finally:
        watchdog.finish(deadline)


def _with_transaction(target: Callable[..., Any], transaction: Any) -> Callable[[Any], Any]:
    def call(argument: Any) -> Any:
        return target(argument, transaction)

    return call


class _Deadline:
    __slots__ = ("cancelling", "expired", "task", "when")

    def __init__(self, when: float, task: asyncio.Task[Any]) -> None:
        self.when = when
        self.task = task
        self.cancelling = task.cancelling()
        self.expired = False


class _Watchdog:
    """Handler timeouts of one event loop through a single timer.

    ``asyncio.timeout`` schedules and cancels a TimerHandle per call; on the loop's heap (ordered
    by a Python-level ``__lt__``) that costs several microseconds per message. Here a call only
    adds its deadline to a set and removes it again; the one timer is set for the earliest
    deadline pending when it was scheduled, and when it fires it cancels the tasks whose
    deadline passed and re-arms itself for the earliest remaining one. With one timeout value
    deadlines arrive in increasing order, so the timer fires about once per timeout period and
    each firing scans only the calls in flight.
    """

    __slots__ = ("_loop", "_pending", "_timer", "_timer_when")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._pending: set[_Deadline] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_when = 0.0

    def start(self, timeout_s: float) -> _Deadline:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("run_handler with a timeout must run inside an asyncio task")
        deadline = _Deadline(self._loop.time() + timeout_s, task)
        self._pending.add(deadline)
        if self._timer is None or deadline.when < self._timer_when:
            self._arm(deadline.when)
        return deadline

    def finish(self, deadline: _Deadline) -> None:
        # The timer stays armed: cancelling and re-arming it per call is the cost avoided here.
        self._pending.discard(deadline)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(when, self._fire)
        self._timer_when = when

    def _fire(self) -> None:
        self._timer = None
        due = max(self._loop.time(), self._timer_when)
        expired = [deadline for deadline in self._pending if deadline.when <= due]
        for deadline in expired:
            self._pending.discard(deadline)
            deadline.expired = True
            deadline.task.cancel()
        if self._pending:
            self._arm(min(deadline.when for deadline in self._pending))

    @property
    def pending(self) -> int:
        return len(self._pending)


_watchdogs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Watchdog] = (
    weakref.WeakKeyDictionary()
)
_last_watchdog: _Watchdog | None = None


def _watchdog() -> _Watchdog:
    global _last_watchdog
    loop = asyncio.get_running_loop()
    last = _last_watchdog
    if last is not None and last._loop is loop:
        return last
    watchdog = _watchdogs.get(loop)
    if watchdog is None:
        watchdog = _watchdogs[loop] = _Watchdog(loop)
    _last_watchdog = watchdog
    return watchdog


async def _in_thread(
    target: Callable[[Any], Any], argument: Any, executor: Executor | HandlerThreads | None
) -> None:
    if isinstance(executor, HandlerThreads):
        result = await executor.run(target, argument)
    elif executor is None:
        result = await asyncio.to_thread(target, argument)
    else:
        call = functools.partial(contextvars.copy_context().run, target, argument)
        result = await asyncio.get_running_loop().run_in_executor(executor, call)
    if inspect.isawaitable(result):  # a plain def that returned a coroutine (a sync wrapper)
        await result


def _classify(exc: Exception, permanent_types: frozenset[str]) -> HandlerOutcome:
    if isinstance(exc, DecodeError):
        return _undecodable(exc, str(exc))
    if isinstance(exc, ValidationError):
        return _undecodable(exc, _validation_detail(exc, None))
    if isinstance(exc, Permanent):
        return Failed.from_exception(exc, permanent=True)
    if isinstance(exc, Retry):
        return Failed.from_exception(exc, retry_delay_s=exc.delay_s)
    permanent = bool(permanent_types) and _listed_permanent(type(exc), permanent_types)
    return Failed.from_exception(exc, permanent=permanent)


def _undecodable(exc: Exception, detail: str) -> Undecodable:
    failed = Failed.from_exception(exc)
    if isinstance(exc, ValidationError):
        # pydantic's own text quotes the input values (input_value=...): the body, decrypted
        # fields included. The stored and logged traceback keeps the frames and ends with the
        # value-free detail instead.
        frames = "".join(traceback_module.format_tb(exc.__traceback__))
        text = f"Traceback (most recent call last):\n{frames}{failed.exc_type}: {detail}\n"
        return Undecodable(detail, exc_type=failed.exc_type, traceback=text)
    return Undecodable(detail, exc_type=failed.exc_type, traceback=failed.traceback_text())


_listed_cache: dict[tuple[type[BaseException], frozenset[str]], bool] = {}


def _listed_permanent(exc_type: type[BaseException], permanent_types: frozenset[str]) -> bool:
    key = (exc_type, permanent_types)
    listed = _listed_cache.get(key)
    if listed is None:
        # The same matching decide() applies to QueuePolicy.permanent_errors, so both agree.
        names = [
            qualified_type_name(t) for t in exc_type.__mro__ if t not in (object, BaseException)
        ]
        listed = _policy_for(permanent_types).is_permanent(names)
        if len(_listed_cache) >= 1024:  # exception types made at run time: stay bounded
            _listed_cache.clear()
        _listed_cache[key] = listed
    return listed


@functools.lru_cache(maxsize=16)
def _policy_for(permanent_types: frozenset[str]) -> QueuePolicy:
    return QueuePolicy(
        queue="",
        parking_queue="",
        retry_delays_ms=(),
        max_attempts=1,
        wait_queues=(),
        permanent_errors=permanent_types,
    )


_MAX_ERRORS_SHOWN = 5


def _validation_detail(exc: ValidationError, annotation: Any) -> str:
    """One line: what the body was validated as and the first few errors with their location."""
    errors = exc.errors(include_url=False, include_input=False)
    shown = []
    for error in errors[:_MAX_ERRORS_SHOWN]:
        location = ".".join(str(part) for part in error["loc"])
        shown.append(f"{location}: {error['msg']}" if location else error["msg"])
    if len(errors) > _MAX_ERRORS_SHOWN:
        shown.append(f"and {len(errors) - _MAX_ERRORS_SHOWN} more")
    target = type_label(annotation) if annotation is not None else exc.title
    return one_line(f"the body does not validate as {target}: " + "; ".join(shown))


__all__ = ["HandlerInput", "LoadedHandler", "load_handler", "run_handler"]

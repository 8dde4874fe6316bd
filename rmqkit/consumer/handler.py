"""Load a handler from ``module:function`` and run it on one message, classifying how it ended.

``load_handler`` does all the inspection once (import, signature, annotations, sync or async,
how to build the argument); ``run_handler`` is the per-message hot path and only calls what was
prepared.

What a handler receives depends on the annotation of its one parameter:

* none, or ``rmqkit.Message``: the Message;
* ``bytes``: the body; ``str``: the body decoded as UTF-8;
* a pydantic ``BaseModel`` subclass: ``Model.model_validate_json(body)``;
* any other type pydantic can validate (``dict``, ``dict[str, Any]``, ``list[Item]``, ``Any``, a
  TypedDict ...): the body parsed as JSON and validated against it.

A body that fails that decoding or validation never reaches the handler: the outcome is
``Undecodable`` (parked as ``undecodable``).

``async def`` handlers are awaited in the event loop; plain ``def`` handlers run in a thread pool
(``asyncio.to_thread``, an executor, or the consumer's HandlerThreads given to run_handler) so
they cannot block it.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import importlib
import inspect
import sys
import types
import typing
import weakref
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from rmqkit.consumer.decision import (
    Failed,
    HandlerTimeout,
    Outcome,
    QueuePolicy,
    Success,
    Undecodable,
    qualified_type_name,
)
from rmqkit.consumer.message import DecodeError, Message, Permanent, Retry
from rmqkit.consumer.threads import HandlerThreads
from rmqkit.errors import ConfigError


class HandlerInput(Enum):
    """What the handler's parameter receives."""

    MESSAGE = "message"  # the rmqkit.Message
    BODY = "body"  # the body as bytes
    TEXT = "text"  # the body decoded as UTF-8
    MODEL = "model"  # the body validated as a pydantic model or type


@dataclass(frozen=True, slots=True)
class LoadedHandler:
    """A handler ready to run: the callable plus everything run_handler needs, found once.

    ``target``: the object to call with one argument. ``is_async``: awaited in the event loop
    (else run in a thread). ``input`` / ``input_type``: what the argument is (``input_type`` is
    the annotation the body is validated against when ``input`` is MODEL, else None).
    """

    spec: str
    target: Callable[[Any], Any]
    is_async: bool
    parameter: str | None  # name of the parameter that receives the argument (None: *args)
    input: HandlerInput
    input_type: Any = None
    # Builds the argument from the Message; None for MESSAGE (the Message itself is passed).
    convert: Callable[[Message], Any] | None = None

    def describe(self) -> str:
        """One line for the startup log, e.g. ``async orders.handlers:handle(order: Order)``."""
        kind = "async" if self.is_async else "sync (thread pool)"
        if self.input is HandlerInput.MODEL:
            shown = _type_label(self.input_type)
        else:
            shown = {
                HandlerInput.MESSAGE: "Message",
                HandlerInput.BODY: "bytes",
                HandlerInput.TEXT: "str",
            }[self.input]
        return f"{kind} {self.spec}({self.parameter or '*args'}: {shown})"


# --- loading -------------------------------------------------------------------------------------

_MESSAGE_NAMES = frozenset({"Message", "rmqkit.Message", "rmqkit.consumer.message.Message"})
_FORM = "expected 'module:function' (e.g. 'myapp.handlers:handle')"


def load_handler(spec: str, *, cwd: Path | None = None) -> LoadedHandler:
    """Import ``pkg.module:function`` (or ``module:obj.attr``) and check it can be a handler.

    The module is imported with ``cwd`` (default: the current directory) first on ``sys.path``,
    as uvicorn does, and the directory stays there (the handler may import more local modules
    later). Every problem raises ConfigError (exit 78) with one line naming it.
    """
    module_name, colon, attr_path = spec.strip().partition(":")
    if not colon or not _dotted_names(module_name) or not _dotted_names(attr_path):
        raise _load_error(spec, _FORM)

    directory = str((cwd if cwd is not None else Path.cwd()).resolve())
    if not sys.path or sys.path[0] != directory:
        sys.path.insert(0, directory)
    importlib.invalidate_caches()
    module = _import(spec, module_name, directory)

    target: Any = module
    for depth, name in enumerate(attr_path.split(".")):
        try:
            target = getattr(target, name)
        except AttributeError:
            if depth == 0:
                owner = f"module '{module_name}'"
            else:
                walked = ".".join(attr_path.split(".")[:depth])
                owner = f"'{module_name}:{walked}'"
            raise _load_error(spec, f"{owner} has no attribute '{name}'") from None

    if not callable(target):
        raise _load_error(spec, f"'{spec}' is not callable (its type is {type(target).__name__})")
    if inspect.isgeneratorfunction(target) or inspect.isasyncgenfunction(target):
        raise _load_error(
            spec,
            f"'{spec}' is a generator function; a handler is an 'async def' or 'def' function "
            "that returns when the message is handled",
        )

    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError) as exc:
        raise _load_error(spec, f"cannot read the signature of '{spec}': {exc}") from None
    parameter = _message_parameter(spec, signature)
    annotation = _resolve_annotation(spec, target, parameter)
    handler_input, input_type, convert = _input_for(spec, parameter, annotation)
    return LoadedHandler(
        spec=spec,
        target=target,
        is_async=_is_async(target),
        parameter=None if parameter.kind is inspect.Parameter.VAR_POSITIONAL else parameter.name,
        input=handler_input,
        input_type=input_type,
        convert=convert,
    )


def _dotted_names(text: str) -> bool:
    return bool(text) and all(part.isidentifier() for part in text.split("."))


def _load_error(spec: str, detail: str) -> ConfigError:
    return ConfigError(f"cannot load handler '{spec}': {_one_line(detail)}")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _import(spec: str, module_name: str, directory: str) -> types.ModuleType:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            detail = f"module '{module_name}' not found (searched {directory} and the Python path)"
        elif missing:
            detail = f"importing module '{module_name}' failed: module '{missing}' not found"
        else:
            detail = f"importing module '{module_name}' failed: {exc}"
        raise _load_error(spec, detail) from exc
    except Exception as exc:  # the module's own code raised while it was imported
        detail = f"importing module '{module_name}' failed: {type(exc).__name__}: {exc}"
        raise _load_error(spec, detail) from exc


def _message_parameter(spec: str, signature: inspect.Signature) -> inspect.Parameter:
    """The parameter that receives the argument; the handler must take exactly one."""
    positional = [
        p
        for p in signature.parameters.values()
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    variadic = [
        p for p in signature.parameters.values() if p.kind is inspect.Parameter.VAR_POSITIONAL
    ]
    required = [p for p in positional if p.default is inspect.Parameter.empty]
    keyword_only = [
        p.name
        for p in signature.parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is inspect.Parameter.empty
    ]
    one = "a handler takes one argument (the message)"
    if len(required) > 1:
        names = ", ".join(p.name for p in required)
        raise _load_error(
            spec, f"'{spec}' takes {len(required)} required arguments ({names}); {one}"
        )
    if keyword_only:
        names = ", ".join(keyword_only)
        raise _load_error(spec, f"'{spec}' has required keyword-only arguments ({names}); {one}")
    if positional:
        return positional[0]
    if variadic:
        return variadic[0]
    raise _load_error(spec, f"'{spec}' takes no argument; {one}")


def _annotation_scope(target: Any) -> dict[str, Any]:
    """The globals the target's string annotations are evaluated in."""
    candidate = target
    for _ in range(10):  # unwrap partials, bound methods, decorators and callable instances
        if isinstance(candidate, functools.partial):
            candidate = candidate.func
        elif inspect.ismethod(candidate):
            candidate = candidate.__func__
        elif hasattr(candidate, "__wrapped__"):
            candidate = candidate.__wrapped__
        elif not inspect.isfunction(candidate) and not inspect.isclass(candidate):
            candidate = type(candidate).__call__ if callable(candidate) else candidate
            if not inspect.isfunction(candidate):
                break
        else:
            break
    if inspect.isclass(candidate):
        module = sys.modules.get(candidate.__module__)
        return dict(vars(module)) if module is not None else {}
    scope = getattr(candidate, "__globals__", None)
    return scope if isinstance(scope, dict) else {}


def _resolve_annotation(spec: str, target: Any, parameter: inspect.Parameter) -> Any:
    """The parameter's annotation as an object, resolving strings (``from __future__ import
    annotations``) with typing.get_type_hints in the handler's module. Only this one annotation
    is resolved, so an unresolvable annotation elsewhere in the signature does not matter."""
    raw = parameter.annotation
    if raw is inspect.Parameter.empty or parameter.kind is inspect.Parameter.VAR_POSITIONAL:
        return inspect.Parameter.empty
    holder = types.SimpleNamespace(__annotations__={parameter.name: raw})
    try:
        return typing.get_type_hints(holder, globalns=_annotation_scope(target))[parameter.name]
    except Exception as exc:
        if isinstance(raw, str) and raw.strip() in _MESSAGE_NAMES:
            return Message  # imported under TYPE_CHECKING only: still the Message
        raise _load_error(
            spec,
            f"cannot resolve the annotation {raw!r} of parameter '{parameter.name}': "
            f"{type(exc).__name__}: {exc}",
        ) from None


def _input_for(
    spec: str, parameter: inspect.Parameter, annotation: Any
) -> tuple[HandlerInput, Any, Callable[[Message], Any] | None]:
    if annotation is inspect.Parameter.empty or annotation is Message:
        return HandlerInput.MESSAGE, None, None
    if annotation is bytes:
        return HandlerInput.BODY, None, _body
    if annotation is str:
        return HandlerInput.TEXT, None, _text
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        validate_json = annotation.model_validate_json
        return HandlerInput.MODEL, annotation, lambda message: validate_json(message.body)
    try:
        adapter: TypeAdapter[Any] = TypeAdapter(annotation)
    except Exception as exc:
        raise _load_error(
            spec,
            f"parameter '{parameter.name}' is annotated {_type_label(annotation)}, which rmqkit "
            f"cannot build from a message body ({type(exc).__name__}); annotate it with "
            "rmqkit.Message, bytes, str, a pydantic model or a JSON type such as dict",
        ) from None
    validate = adapter.validate_json
    return HandlerInput.MODEL, annotation, lambda message: validate(message.body)


def _body(message: Message) -> bytes:
    return message.body


def _text(message: Message) -> str:
    try:
        return message.body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError(f"the body is not valid UTF-8: {exc}") from exc


def _type_label(annotation: Any) -> str:
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__qualname__
    return repr(annotation).replace("typing.", "")


def _is_async(target: Any) -> bool:
    if inspect.iscoroutinefunction(target):
        return True
    # an instance of a class with ``async def __call__``
    return not inspect.isroutine(target) and inspect.iscoroutinefunction(type(target).__call__)


# --- running -------------------------------------------------------------------------------------

_SUCCESS = Success()


async def run_handler(
    handler: LoadedHandler,
    message: Message,
    *,
    timeout_s: float | None,
    permanent_types: frozenset[str],
    executor: Executor | HandlerThreads | None = None,
) -> Outcome:
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
    """
    if handler.convert is None:
        argument: Any = message
    else:
        try:
            argument = handler.convert(message)
        except ValidationError as exc:
            return Undecodable(_validation_detail(exc, handler.input_type))
        except DecodeError as exc:
            return Undecodable(str(exc))

    if timeout_s is None:
        try:
            if handler.is_async:
                await handler.target(argument)
            else:
                await _in_thread(handler.target, argument, executor)
        except Exception as exc:
            return _classify(exc, permanent_types)
        return _SUCCESS

    if isinstance(executor, HandlerThreads) and not handler.is_async and executor.full:
        await executor.wait_for_thread()  # the timeout counts from the handler's start
    watchdog = _watchdog()
    deadline = watchdog.start(timeout_s)
    try:
        if handler.is_async:
            await handler.target(argument)
        else:
            await _in_thread(handler.target, argument, executor)
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


def _classify(exc: Exception, permanent_types: frozenset[str]) -> Outcome:
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
    target = _type_label(annotation) if annotation is not None else exc.title
    return _one_line(f"the body does not validate as {target}: " + "; ".join(shown))


__all__ = ["HandlerInput", "LoadedHandler", "load_handler", "run_handler"]

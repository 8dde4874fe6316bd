"""Hooks on the consumer's outcomes: ``on_success``, ``on_retry``, ``on_park``.

A hook is told about an outcome once that outcome is settled: the handler returned and the
delivery is marked for the batched ack (success), or the retry or parking copy was confirmed by
the broker (retry, park). So the message's fate never depends on a hook: a hook that raises,
hangs or is slow cannot lose, duplicate or hold back a message, nor delay its ack.

The dispatcher only *emits* an event (appends it to a bounded queue, no await); one task per
consumer (``HookRunner.run``) calls the hooks, one call at a time in the order the outcomes were
settled, each bounded by ``Hooks.timeout_s``: an ``async def`` hook is cancelled at the timeout,
a ``def`` hook runs in a daemon thread of its own that is abandoned at the timeout (a thread
cannot be stopped; a daemon one never holds the process at exit). A hook's exception or timeout
is logged with the hook's name and nothing else happens.

The event (rmqkit.consumer.hook_events) never carries the body, and on a delivery whose fields
were decrypted for the handler it carries the error text as the parked copy records it
(withheld, rmqkit.crypto.masking) and no exception object: as rmqkit.consumer.copies and the
log lines do.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import threading
import types
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from time import monotonic
from typing import TYPE_CHECKING, Any, Final

from rmqkit.consumer.hook_events import (
    OUTCOME_KINDS,
    OutcomeEvent,
    OutcomeKind,
    copy_event,
    internal_error_event,
    success_event,
)
from rmqkit.errors import ConfigError, UsageError

if TYPE_CHECKING:
    from rmqkit.consumer.loading import LoadedHandler

__all__ = [
    "MODULE_HOOKS",
    "HookRunner",
    "Hooks",
    "OutcomeEvent",
    "copy_event",
    "hooks_for",
    "internal_error_event",
    "success_event",
]

log = logging.getLogger("rmqkit.consumer.hooks")

# The module-level name ``rmqkit consume module:handler`` reads the hooks from.
MODULE_HOOKS: Final = "rmqkit_hooks"
DEFAULT_TIMEOUT_S: Final = 5.0
DEFAULT_MAX_PENDING: Final = 10_000
# ``def`` hooks hung past their timeout that may hold threads before further calls of them are
# skipped (each hung call keeps its thread until it returns, if ever).
MAX_HUNG_THREADS: Final = 8
DROPPED_LOG_EVERY: Final = 1000

Hook = Callable[[OutcomeEvent], Any]


@dataclass(frozen=True)
class Hooks:
    """The hooks of a consumer: each a function of one ``OutcomeEvent``, ``def`` or
    ``async def``, or None. ``timeout_s``: how long one call may take before it is abandoned.
    ``max_pending``: events waiting for their hook beyond this are dropped (and counted in a
    warning) rather than held in memory without bound."""

    on_success: Hook | None = None
    on_retry: Hook | None = None
    on_park: Hook | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_pending: int = DEFAULT_MAX_PENDING

    def __post_init__(self) -> None:
        for kind in OUTCOME_KINDS:
            hook = getattr(self, f"on_{kind}")
            if hook is not None and not callable(hook):
                raise ConfigError(f"Hooks(on_{kind}=...) must be callable, not {hook!r}")
        if not (isinstance(self.timeout_s, int | float) and self.timeout_s > 0):
            raise ConfigError(f"Hooks(timeout_s=...) must be above 0, not {self.timeout_s!r}")
        if not (isinstance(self.max_pending, int) and self.max_pending >= 1):
            raise ConfigError(f"Hooks(max_pending=...) must be 1 or more, not {self.max_pending!r}")

    def hook(self, kind: OutcomeKind) -> Hook | None:
        """The hook for outcomes of ``kind`` (None: none set)."""
        hook: Hook | None = getattr(self, f"on_{kind}")
        return hook

    @property
    def empty(self) -> bool:
        return self.on_success is None and self.on_retry is None and self.on_park is None

    def describe(self) -> str:
        """One line for the start-up log, e.g. ``on_park=app.alerts.on_park (timeout 5s)``."""
        named = [
            f"on_{kind}={hook_name(hook)}"
            for kind in OUTCOME_KINDS
            if (hook := getattr(self, f"on_{kind}")) is not None
        ]
        return f"{', '.join(named) or 'none'} (timeout {self.timeout_s:g}s)"


def hook_name(hook: object) -> str:
    """``module.qualname`` of a hook (partials and callable objects included), for the log."""
    target = hook.func if isinstance(hook, functools.partial) else hook
    name = getattr(target, "__qualname__", None) or type(target).__qualname__
    module = getattr(target, "__module__", None) or type(target).__module__
    return f"{module}.{name}" if module else str(name)


def _is_async(hook: object) -> bool:
    target = hook.func if isinstance(hook, functools.partial) else hook
    return inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(
        getattr(target, "__call__", None)  # noqa: B004 - a callable object's async __call__
    )


def hooks_for(explicit: Hooks | None, handler: LoadedHandler) -> Hooks | None:
    """The hooks in effect: ``explicit`` if given, else the handler module's ``rmqkit_hooks``
    (a routed handler: its routes' modules'; None: no hook). Raises ConfigError (78) for an
    ``rmqkit_hooks`` that is not ``rmqkit.Hooks`` or routes in several modules that each
    define one, UsageError for an ``explicit`` that is not ``rmqkit.Hooks``."""
    if explicit is not None:
        if not isinstance(explicit, Hooks):
            raise UsageError(f"hooks must be rmqkit.Hooks(...), not {type(explicit).__name__}")
        return None if explicit.empty else explicit
    found: dict[int, tuple[str, Hooks]] = {}
    for module in _modules_of(handler):
        hooks = getattr(module, MODULE_HOOKS, None)
        if hooks is None:
            continue
        if not isinstance(hooks, Hooks):
            raise ConfigError(
                f"{module.__name__}.{MODULE_HOOKS} must be rmqkit.Hooks(...), not "
                f"{type(hooks).__name__} — define rmqkit_hooks = rmqkit.Hooks(on_park=...)"
            )
        found.setdefault(id(hooks), (module.__name__, hooks))
    if len(found) > 1:
        names = ", ".join(sorted(f"{name}.{MODULE_HOOKS}" for name, _ in found.values()))
        raise ConfigError(
            f"the handler's routes come from modules that each define hooks ({names}) — "
            "define rmqkit_hooks in one of them (or import it into the others)"
        )
    hooks = next(iter(found.values()))[1] if found else None
    return None if hooks is None or hooks.empty else hooks


def _modules_of(handler: LoadedHandler) -> list[types.ModuleType]:
    """The modules the handler's function is defined in: one, or each route's."""
    routes = getattr(handler, "routes", None)
    targets = [handler.target] if routes is None else [r.target for r in routes.handlers.values()]
    modules: list[types.ModuleType] = []
    for target in targets:
        module = inspect.getmodule(target)
        if module is not None and module not in modules:
            modules.append(module)
    return modules


# --- calling the hooks ----------------------------------------------------------------------


class HookRunner:
    """Calls the hooks of one consumer, off the delivery path: ``emit`` queues an event and
    returns at once; ``run`` (one task) calls each event's hook, one at a time, in order,
    each bounded by ``timeout_s``."""

    def __init__(self, hooks: Hooks) -> None:
        self.hooks = hooks
        self._pending: deque[OutcomeEvent] = deque()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        # Copies in flight whose confirm fires their event: (tracker id, tag) -> event.
        self._expected: dict[tuple[int, int], OutcomeEvent] = {}
        self._hung_threads = 0
        self._abandoned: set[asyncio.Task[Any]] = set()  # async calls past their timeout
        self.dropped = 0
        self.called = 0
        self.failed = 0  # raised or timed out

    def wants(self, kind: OutcomeKind) -> bool:
        return self.hooks.hook(kind) is not None

    # --- the dispatcher's side: never awaits, never raises ------------------------------------
    def emit(self, event: OutcomeEvent) -> None:
        """Queue ``event`` for its hook (dropped, and counted, past ``max_pending``)."""
        if self.hooks.hook(event.kind) is None:
            return
        if len(self._pending) >= self.hooks.max_pending:
            self.dropped += 1
            if self.dropped % DROPPED_LOG_EVERY == 1:
                log.warning(
                    "hook events dropped: %d so far (%d waiting; the hooks are slower than the "
                    "messages settle); the messages themselves are settled as usual",
                    self.dropped,
                    len(self._pending),
                )
            return
        self._pending.append(event)
        self._idle.clear()
        self._wake.set()

    def expect(self, tracker: object, tag: int, event: OutcomeEvent) -> None:
        """``event`` is emitted if (and when) the copy of ``tag`` is confirmed."""
        self._expected[(id(tracker), tag)] = event

    def confirmed(self, tracker: object, tag: int) -> None:
        event = self._expected.pop((id(tracker), tag), None)
        if event is not None:
            self.emit(event)

    def forget(self, tracker: object, tag: int) -> None:
        """The copy of ``tag`` was not confirmed (or its event went out already)."""
        self._expected.pop((id(tracker), tag), None)

    # --- the task -----------------------------------------------------------------------------
    async def run(self) -> None:
        """Call the hooks until cancelled."""
        while True:
            while not self._pending:
                self._idle.set()
                self._wake.clear()
                await self._wake.wait()
            event = self._pending.popleft()
            await self.call(event)

    async def drain(self, within_s: float) -> None:
        """Wait up to ``within_s`` for the events queued so far to be handed to their hooks."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout=within_s)

    def close(self) -> None:
        """Say what is left undone (the task itself is cancelled by its owner)."""
        left = len(self._pending)
        self._pending.clear()
        for task in self._abandoned:
            task.cancel()
        if left:
            log.warning(
                "stopped with %d hook event(s) not delivered to their hooks (the messages "
                "themselves were settled)",
                left,
            )

    async def call(self, event: OutcomeEvent) -> None:
        """Call ``event``'s hook, bounded by the timeout; log (never raise) what went wrong."""
        hook = self.hooks.hook(event.kind)
        if hook is None:
            return
        name = f"on_{event.kind}"
        timeout_s = self.hooks.timeout_s
        started = monotonic()
        self.called += 1
        try:
            if _is_async(hook):
                finished = await self._call_async(hook, event, timeout_s)
            else:
                finished = await self._call_sync(hook, event, timeout_s, name)
        except Exception as exc:
            self.failed += 1
            log.error(
                "hook %s (%s) raised %s; the message's outcome (%s) stands",
                name,
                hook_name(hook),
                _describe(exc),
                event.kind,
                exc_info=exc,
                extra=_extra(event),
            )
            return
        if not finished:
            self.failed += 1
            log.warning(
                "hook %s (%s) did not return within %gs; abandoned it (the message's outcome "
                "(%s) stands; the next events go on)",
                name,
                hook_name(hook),
                timeout_s,
                event.kind,
                extra=_extra(event),
            )
        elif monotonic() - started > timeout_s / 2:
            log.info(
                "hook %s (%s) took %.2fs (timeout %gs)",
                name,
                hook_name(hook),
                monotonic() - started,
                timeout_s,
                extra=_extra(event),
            )

    async def _call_async(self, hook: Hook, event: OutcomeEvent, timeout_s: float) -> bool:
        # A task, not wait_for: a hook that swallows its cancellation must not hold this loop
        # past the timeout either (it is left to end by itself; cancelled again at close).
        task = asyncio.ensure_future(hook(event))
        try:
            done, _ = await asyncio.wait({task}, timeout=timeout_s)
        except asyncio.CancelledError:  # the consumer stops: the call in hand goes too
            task.cancel()
            raise
        if done:
            if task.cancelled():  # the hook cancelled itself: not this caller's cancellation
                raise HookFailed("the hook's task was cancelled")
            task.result()  # its exception, if any, is the caller's to log
            return True
        task.cancel()
        self._abandoned.add(task)
        task.add_done_callback(self._abandoned.discard)
        task.add_done_callback(_consume_result)
        return False

    async def _call_sync(
        self, hook: Hook, event: OutcomeEvent, timeout_s: float, name: str
    ) -> bool:
        if self._hung_threads >= MAX_HUNG_THREADS:
            raise HookSkipped(
                f"{self._hung_threads} earlier calls hung past the timeout still hold threads"
            )
        loop = asyncio.get_running_loop()
        result: asyncio.Future[Any] = loop.create_future()
        hung = False

        def ended(value: Any, error: BaseException | None) -> None:
            if hung:
                self._hung_threads -= 1
            if result.done():
                return
            if isinstance(error, Exception):
                result.set_exception(error)
            elif error is not None:  # SystemExit from a hook thread must not end the consumer
                result.set_exception(HookFailed(f"{type(error).__name__}: {error}"))
            else:
                result.set_result(value)

        def target() -> None:
            try:
                value, error = hook(event), None
            except BaseException as exc:  # reported on the loop; a thread has no one to tell
                value, error = None, exc
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(ended, value, error)

        # A daemon thread of its own: one that hangs is never joined at exit, and it holds no
        # thread another hook or a handler needs.
        threading.Thread(target=target, name=f"rmqkit-hook-{name}", daemon=True).start()
        done, _ = await asyncio.wait({result}, timeout=timeout_s)
        if not done:
            hung = True
            self._hung_threads += 1
            result.cancel()
            return False
        value = result.result()
        if inspect.isawaitable(value):  # a def that returned a coroutine: await it, bounded
            return await self._call_async(lambda _event: value, event, timeout_s)
        return True


class HookFailed(Exception):
    """A hook ended by something other than an exception (cancelled itself, ``sys.exit()``)."""


class HookSkipped(HookFailed):
    """A ``def`` hook not called: too many of its earlier calls still hang in their threads."""


def _consume_result(task: asyncio.Task[Any]) -> None:
    # An abandoned call that ends later: its exception is not "never retrieved" noise.
    if not task.cancelled():
        task.exception()


def _describe(exc: BaseException) -> str:
    try:
        text = " ".join(str(exc).split())[:300]
    except Exception:
        text = ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _extra(event: OutcomeEvent) -> dict[str, Any]:
    return {
        "message_id": event.message_id,
        "attempt": event.attempt,
        "queue": event.queue,
        "decision": event.kind,
        "reason": event.reason,
    }

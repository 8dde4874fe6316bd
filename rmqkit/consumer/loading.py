"""Loading a handler: ``module:function`` (or a module of routed handlers) to a
``LoadedHandler``, checked once at startup.

Owns everything done before the first message: importing the module (with the working directory
first on ``sys.path``), walking to the attribute, checking the signature (not a generator; which
parameter receives what: rmqkit.consumer.signature) and, for a module spec with no
``:function``, collecting its ``@rmqkit.handler`` routes (rmqkit.consumer.routing). Every problem
is a ConfigError (exit 78) naming it on one line. Running a loaded handler on a message is
rmqkit.consumer.handler's job.

The forms of a spec:

* ``pkg.module:function`` (or ``pkg.module:obj.attr``): one handler;
* ``pkg.module``: the module's ``@rmqkit.handler`` functions, routed by the ``type`` header;
* ``pkg.module[ROUTE-BY]`` (``[routing-key]``, ``[header:event]``): routed by that instead
  (``rmqkit consume --route-by`` writes it so, for the workers to load the same table).

A body that fails its handler's decoding or validation never reaches the handler: the outcome
is ``Undecodable`` (parked as ``undecodable``).

A model that marks fields ``rmqkit.Sensitive`` (rmqkit.crypto.model) has them listed in
``LoadedHandler.sensitive`` (a mark no field path can name is a ConfigError here); the consumer
adds them to the fields it decrypts first and warns about those its topology does not encrypt
(rmqkit.consumer.config, given the LoadedHandler by ``rmqkit consume``).
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rmqkit.consumer.message import Message
from rmqkit.consumer.routing import DEFAULT_ROUTE_BY, RouteBy, Router, Routes, router_of_module
from rmqkit.consumer.signature import (
    HandlerInput,
    HandlerSignature,
    Role,
    analyse,
    type_label,
)
from rmqkit.crypto.model import sensitive_fields
from rmqkit.errors import ConfigError, UsageError

# Builds the call of one message: bind(target, message, transaction) -> call(body_argument).
Binder = Callable[[Callable[..., Any], Message, Any], Callable[[Any], Any]]


@dataclass(frozen=True, slots=True)
class LoadedHandler:
    """A handler ready to run: the callable plus everything run_handler needs, found once.

    ``target``: the object to call. ``is_async``: awaited in the event loop (else run in a
    thread). ``input`` / ``input_type``: what the body parameter is (``input_type`` is the
    annotation the body is validated against when ``input`` is MODEL, else None).
    ``routes``: set for a routed module or Router; each message then runs the route its type
    names (its own LoadedHandler), and ``target`` is not called.
    """

    spec: str
    target: Callable[..., Any]
    is_async: bool
    parameter: str | None  # the parameter receiving the body, else the Message (None: *args)
    input: HandlerInput
    input_type: Any = None
    # Builds the body argument from the Message; None for MESSAGE (the Message itself is passed).
    convert: Callable[[Message], Any] | None = None
    # Takes a parameter annotated rmqkit.Transaction (consume --dedupe).
    takes_transaction: bool = False
    # The JSON paths the input model marks rmqkit.Sensitive, and the blind-indexed ones.
    sensitive: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    # The full parameter plan (None: built by hand, one argument as ``parameter`` says).
    signature: HandlerSignature | None = None
    # Set when the call is not ``target(argument)`` / ``target(argument, tx)``.
    bind: Binder | None = None
    routes: Routes | None = None

    def describe(self) -> str:
        """One line for the startup log, e.g. ``async orders.handlers:handle(order: Order)``;
        a routed module lists its routes: ``orders.handlers by header:type {order.created:
        async orders.handlers:created(order: Order), ...}``."""
        if self.routes is not None:
            shown = ", ".join(
                f"{name}: {route.describe()}"
                for name, route in sorted(self.routes.handlers.items())
            )
            return f"{self.spec} routed by {self.routes.route_by} {{{shown}}}"
        kind = "async" if self.is_async else "sync (thread pool)"
        if self.signature is not None:
            return f"{kind} {self.spec}({self.signature.shown()})"
        if self.input is HandlerInput.MODEL:
            shown = type_label(self.input_type)
        else:
            shown = {
                HandlerInput.MESSAGE: "Message",
                HandlerInput.BODY: "bytes",
                HandlerInput.TEXT: "str",
            }[self.input]
        tx = ", tx: Transaction" if self.takes_transaction else ""
        return f"{kind} {self.spec}({self.parameter or '*args'}: {shown}{tx})"


# --- loading -------------------------------------------------------------------------------------

_FORM = "expected 'module:function' (e.g. 'myapp.handlers:handle')"
_ROUTED_FORM = (
    f"{_FORM}, or a module of @rmqkit.handler functions ('myapp.handlers', optionally "
    "'myapp.handlers[routing-key]')"
)


def load_handler(
    spec: str, *, cwd: Path | None = None, route_by: str | None = None
) -> LoadedHandler:
    """Import ``pkg.module:function`` (or ``module:obj.attr``, or a routed ``pkg.module``) and
    check it can be a handler.

    ``route_by`` (``--route-by``): for a module spec, where each message's type is read
    (``header:NAME`` or ``routing-key``; default ``header:type``); a UsageError (64) with a
    ``:function`` spec. The module is imported with ``cwd`` (default: the current directory)
    first on ``sys.path``, as uvicorn does, and the directory stays there (the handler may
    import more local modules later). Every problem raises ConfigError (exit 78) with one line
    naming it.
    """
    text = spec.strip()
    # ``module[header:NAME]``: the route-by holds a colon of its own, so look at the brackets
    # before splitting ``module:function``.
    bracketed = text.endswith("]") and ":" not in text.partition("[")[0]
    module_name, colon, attr_path = (text, "", "") if bracketed else text.partition(":")
    routed = not colon
    if routed:
        module_name, route_by = _routed_spec(spec, module_name, route_by)
    elif route_by is not None:
        raise UsageError(
            f"--route-by applies to a module of @rmqkit.handler functions, not to the one "
            f"handler '{spec}': give the module alone (e.g. '{module_name}')"
        )
    if not _dotted_names(module_name) or (not routed and not _dotted_names(attr_path)):
        raise _load_error(spec, _ROUTED_FORM if routed else _FORM)

    directory = str((cwd if cwd is not None else Path.cwd()).resolve())
    if not sys.path or sys.path[0] != directory:
        sys.path.insert(0, directory)
    importlib.invalidate_caches()
    module = _import(spec, module_name, directory, routed)
    if routed:
        return handler_from_module(module, route_by or DEFAULT_ROUTE_BY)

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
    return handler_from_callable(target, spec)


def _routed_spec(spec: str, text: str, route_by: str | None) -> tuple[str, str | None]:
    """``module`` or ``module[ROUTE-BY]``: the module's name and where types are read."""
    if not text.endswith("]") or "[" not in text:
        return text, route_by
    module_name, _, inside = text[:-1].partition("[")
    written = str(RouteBy.parse(inside))
    if route_by is not None and str(RouteBy.parse(route_by)) != written:
        raise UsageError(
            f"'{spec}' routes by {written} and --route-by says {route_by}: give one of them"
        )
    return module_name, written


def handler_from_module(
    module: types.ModuleType | Router, route_by: str = DEFAULT_ROUTE_BY
) -> LoadedHandler:
    """The routed handler of ``module``'s ``@rmqkit.handler`` functions (``route_by``: where a
    message's type is read), or of a Router (its own ``route_by``). Each route is checked as
    ``handler_from_callable`` checks one handler; two routes for one type, a module with none,
    or routes taking a Transaction that are not all async or all sync are ConfigErrors."""
    if isinstance(module, Router):
        router, spec = module, module.name
    else:
        router = router_of_module(module, route_by)
        spec = module.__name__
        if str(router.route_by) != DEFAULT_ROUTE_BY:
            spec = f"{spec}[{router.route_by}]"  # what the workers load again
    handlers = {
        message_type: handler_from_callable(function, name)
        for message_type, (name, function) in router.routes.items()
    }
    loaded = list(handlers.values())
    with_tx = [h for h in loaded if h.takes_transaction]
    if with_tx and len({h.is_async for h in loaded}) > 1:
        # One --dedupe store connection kind serves them all (an async or a thread one).
        raise ConfigError(
            f"cannot load handler '{spec}': its routes take a rmqkit.Transaction but mix "
            "'async def' and 'def' handlers; make them all one kind"
        )
    paths = sorted({p for h in loaded for p in h.sensitive[0]})
    indexed = sorted({p for h in loaded for p in h.sensitive[1]})
    return LoadedHandler(
        spec=spec,
        target=_routed_target,
        is_async=all(h.is_async for h in loaded),
        parameter=None,
        input=HandlerInput.MESSAGE,
        takes_transaction=bool(with_tx),
        sensitive=(tuple(paths), tuple(indexed)),
        routes=Routes(router.route_by, handlers),
    )


def _routed_target(*args: Any) -> None:
    raise RuntimeError("a routed handler runs its routes through run_handler")


def handler_from_callable(target: Any, spec: str | None = None) -> LoadedHandler:
    """Check that ``target`` (a function or callable object) can be a handler, as
    ``load_handler`` checks an imported one; ``spec`` names it in messages and logs (default:
    ``module:qualname``). A module object or a ``Router`` gives a routed handler
    (``handler_from_module``). Every problem raises ConfigError (exit 78) naming it."""
    if isinstance(target, types.ModuleType | Router):
        return handler_from_module(target)
    if spec is None:
        spec = callable_spec(target)
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
    try:
        plan = analyse(spec, target, signature)
    except ConfigError as exc:
        raise _load_error(spec, str(exc)) from None
    sensitive: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    if plan.input is HandlerInput.MODEL:
        try:
            sensitive = sensitive_fields(plan.input_type)
        except ConfigError as exc:
            raise _load_error(spec, str(exc)) from None
    body = next((p for p in plan.parameters if p.role is Role.BODY), None)
    shown = body or plan.parameters[0]
    return LoadedHandler(
        spec=spec,
        target=target,
        is_async=_is_async(target),
        parameter=None if shown.variadic else shown.name,
        input=plan.input,
        input_type=plan.input_type,
        convert=plan.convert,
        takes_transaction=plan.takes_transaction,
        sensitive=sensitive,
        signature=plan,
        bind=_binder(plan),
    )


_FAST_PATH = frozenset(
    {
        (Role.BODY,),
        (Role.MESSAGE,),
        (Role.BODY, Role.TRANSACTION),
        (Role.MESSAGE, Role.TRANSACTION),
    }
)


def _binder(plan: HandlerSignature) -> Binder | None:
    """None when the call is ``target(argument)`` or ``target(argument, tx)`` (run_handler's
    fast path), else how to build the arguments, in declared order, from one message."""
    roles = tuple(p.role for p in plan.parameters)
    by_position = not any(p.keyword for p in plan.parameters)
    if by_position and roles in _FAST_PATH:
        return None
    positional = tuple(p.role for p in plan.parameters if not p.keyword)
    named = tuple((p.name, p.role) for p in plan.parameters if p.keyword)

    def bind(
        target: Callable[..., Any], message: Message, transaction: Any
    ) -> Callable[[Any], Any]:
        def call(body: Any) -> Any:
            values = {Role.BODY: body, Role.MESSAGE: message, Role.TRANSACTION: transaction}
            return target(
                *[values[role] for role in positional], **{n: values[r] for n, r in named}
            )

        return call

    return bind


def callable_spec(target: Any) -> str:
    """How a handler given as an object is named: ``module:qualname`` where it has them."""
    module = getattr(target, "__module__", None) or type(target).__module__
    name = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{module}:{name}"


def _dotted_names(text: str) -> bool:
    return bool(text) and all(part.isidentifier() for part in text.split("."))


def _load_error(spec: str, detail: str) -> ConfigError:
    return ConfigError(f"cannot load handler '{spec}': {one_line(detail)}")


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) as one space."""
    return " ".join(text.split())


def _import(spec: str, module_name: str, directory: str, routed: bool) -> types.ModuleType:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            detail = f"module '{module_name}' not found (searched {directory} and the Python path)"
            if routed:  # perhaps a ':function' was left out rather than a module misnamed
                detail += f"; {_ROUTED_FORM}"
        elif missing:
            detail = f"importing module '{module_name}' failed: module '{missing}' not found"
        else:
            detail = f"importing module '{module_name}' failed: {exc}"
        raise _load_error(spec, detail) from exc
    except Exception as exc:  # the module's own code raised while it was imported
        detail = f"importing module '{module_name}' failed: {type(exc).__name__}: {exc}"
        raise _load_error(spec, detail) from exc


def _is_async(target: Any) -> bool:
    if inspect.iscoroutinefunction(target):
        return True
    # an instance of a class with ``async def __call__``
    return not inspect.isroutine(target) and inspect.iscoroutinefunction(type(target).__call__)


__all__ = [
    "HandlerInput",
    "LoadedHandler",
    "callable_spec",
    "handler_from_callable",
    "load_handler",
    "one_line",
    "type_label",
]

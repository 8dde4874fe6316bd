"""Loading a handler: ``module:function`` to a ``LoadedHandler``, checked once at startup.

Owns everything done before the first message: importing the module (with the working directory
first on ``sys.path``), walking to the attribute, checking the signature (one argument, not a
generator), resolving the parameter's annotation and choosing how the argument is built from a
message. Every problem is a ConfigError (exit 78) naming it on one line. Running a loaded handler
on a message is rmqkit.consumer.handler's job.

What a handler receives depends on the annotation of its one parameter:

* none, or ``rmqkit.Message``: the Message;
* ``bytes``: the body; ``str``: the body decoded as UTF-8;
* a pydantic ``BaseModel`` subclass: ``Model.model_validate_json(body)``;
* any other type pydantic can validate (``dict``, ``dict[str, Any]``, ``list[Item]``, ``Any``, a
  TypedDict ...): the body parsed as JSON and validated against it.

A body that fails that decoding or validation never reaches the handler: the outcome is
``Undecodable`` (parked as ``undecodable``).

A model that marks fields ``rmqkit.Sensitive`` (rmqkit.crypto.model) has them listed in
``LoadedHandler.sensitive`` (a mark no field path can name is a ConfigError here); the consumer
adds them to the fields it decrypts first and warns about those its topology does not encrypt
(rmqkit.consumer.config, given the LoadedHandler by ``rmqkit consume``).

A second positional parameter annotated ``rmqkit.Transaction`` receives the open transaction of
``consume --dedupe`` (rmqkit.idempotency): ``takes_transaction`` is then set.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, TypeAdapter

from rmqkit.consumer.message import DecodeError, Message
from rmqkit.crypto.model import sensitive_fields
from rmqkit.errors import ConfigError
from rmqkit.idempotency.record import Transaction


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
    # A second parameter annotated rmqkit.Transaction: called as target(argument, transaction).
    takes_transaction: bool = False
    # The JSON paths the input model marks rmqkit.Sensitive, and the blind-indexed ones.
    sensitive: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())

    def describe(self) -> str:
        """One line for the startup log, e.g. ``async orders.handlers:handle(order: Order)``."""
        kind = "async" if self.is_async else "sync (thread pool)"
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

_MESSAGE_NAMES = frozenset({"Message", "rmqkit.Message", "rmqkit.consumer.message.Message"})
_TRANSACTION_NAMES = frozenset({"Transaction", "rmqkit.Transaction"})
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
    return handler_from_callable(target, spec)


def handler_from_callable(target: Any, spec: str | None = None) -> LoadedHandler:
    """Check that ``target`` (a function or callable object) can be a handler, as
    ``load_handler`` checks an imported one; ``spec`` names it in messages and logs (default:
    ``module:qualname``). Every problem raises ConfigError (exit 78) naming it."""
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
    transaction = _transaction_parameter(target, signature)
    parameter = _message_parameter(spec, signature, transaction)
    annotation = _resolve_annotation(spec, target, parameter)
    handler_input, input_type, convert = _input_for(spec, parameter, annotation)
    sensitive: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    if handler_input is HandlerInput.MODEL:
        try:
            sensitive = sensitive_fields(input_type)
        except ConfigError as exc:
            raise _load_error(spec, str(exc)) from None
    loaded = LoadedHandler(
        spec=spec,
        target=target,
        is_async=_is_async(target),
        parameter=None if parameter.kind is inspect.Parameter.VAR_POSITIONAL else parameter.name,
        input=handler_input,
        input_type=input_type,
        convert=convert,
        takes_transaction=transaction is not None,
        sensitive=sensitive,
    )
    return loaded


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


def _positional(signature: inspect.Signature) -> list[inspect.Parameter]:
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p for p in signature.parameters.values() if p.kind in kinds]


def _transaction_parameter(target: Any, signature: inspect.Signature) -> str | None:
    """The name of a second positional parameter annotated rmqkit.Transaction, if any."""
    positional = _positional(signature)
    if len(positional) < 2 or positional[1].annotation is inspect.Parameter.empty:
        return None
    raw = positional[1].annotation
    if isinstance(raw, str) and raw.strip() in _TRANSACTION_NAMES:
        return positional[1].name
    holder = types.SimpleNamespace(__annotations__={positional[1].name: raw})
    try:
        hint = typing.get_type_hints(holder, globalns=_annotation_scope(target))
    except Exception:
        return None
    return positional[1].name if hint[positional[1].name] is Transaction else None


def _message_parameter(
    spec: str, signature: inspect.Signature, transaction: str | None = None
) -> inspect.Parameter:
    """The parameter that receives the argument; the handler must take exactly one (besides
    the transaction)."""
    positional = [p for p in _positional(signature) if p.name != transaction]
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
            f"parameter '{parameter.name}' is annotated {type_label(annotation)}, which rmqkit "
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


def type_label(annotation: Any) -> str:
    """How an annotation is named in messages: ``Order``, ``dict[str, int]``."""
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__qualname__
    return repr(annotation).replace("typing.", "")


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

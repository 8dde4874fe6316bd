"""A handler's signature: which parameter receives what, found once at load time.

A handler's parameters are chosen by annotation, in any order:

* ``rmqkit.Message`` (or no annotation): the Message (id, attempt, headers, routing key,
  redelivered, ...);
* ``rmqkit.Transaction``: the open transaction of ``consume --dedupe`` (rmqkit.idempotency);
* anything else is the body: ``bytes`` as received, ``str`` decoded as UTF-8, a pydantic model
  (``Model.model_validate_json``) or any type pydantic validates (``dict``, ``list[Item]``,
  ``Any``, a TypedDict ...) from the body parsed as JSON.

At most one parameter of each kind. Every parameter without a default is filled; one with a
default keeps it unless annotated ``rmqkit.Message`` or ``rmqkit.Transaction`` (so
``def handle(order: Order, retries: int = 3)`` still works). A handler whose only parameters
are ``*args`` receives the Message as its one positional argument. Required keyword-only
parameters and ``**kwargs``-only handlers are refused. Each problem is a ConfigError naming it
(rmqkit.consumer.loading adds the handler's spec).
"""

from __future__ import annotations

import functools
import inspect
import sys
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from pydantic import BaseModel, TypeAdapter

from rmqkit.consumer.message import DecodeError, Message
from rmqkit.errors import ConfigError
from rmqkit.idempotency.record import Transaction

ACCEPTED = (
    "a handler takes, chosen by annotation and in any order, at most one body parameter "
    "(a pydantic model, dict, bytes, str or another type pydantic validates), one rmqkit.Message "
    "(or one unannotated parameter) and, with --dedupe, one rmqkit.Transaction"
)


class HandlerInput(Enum):
    """What the handler's body parameter receives (MESSAGE: it takes no body parameter)."""

    MESSAGE = "message"  # the rmqkit.Message only
    BODY = "body"  # the body as bytes
    TEXT = "text"  # the body decoded as UTF-8
    MODEL = "model"  # the body validated as a pydantic model or type


class Role(Enum):
    """What one parameter receives."""

    BODY = "body"
    MESSAGE = "message"
    TRANSACTION = "transaction"


@dataclass(frozen=True, slots=True)
class Parameter:
    """One parameter the call fills: its name, what it receives, how it is passed."""

    name: str
    role: Role
    label: str  # the annotation as shown, e.g. ``Order``, ``Message``
    keyword: bool = False  # passed as name=value (after a parameter left at its default)
    variadic: bool = False  # ``*args``: the Message as the one positional argument


@dataclass(frozen=True, slots=True)
class HandlerSignature:
    """How a handler is called: its filled parameters in declared order and the body's form."""

    parameters: tuple[Parameter, ...]
    input: HandlerInput
    input_type: Any = None
    # Builds the body argument from the Message; None when no parameter takes the body.
    convert: Callable[[Message], Any] | None = None

    @property
    def takes_transaction(self) -> bool:
        return any(p.role is Role.TRANSACTION for p in self.parameters)

    def shown(self) -> str:
        """The parameters as in ``(order: Order, message: Message, tx: Transaction)``."""
        parts = []
        for p in self.parameters:
            parts.append(f"*args: {p.label}" if p.variadic else f"{p.name}: {p.label}")
        return ", ".join(parts)


_MESSAGE_NAMES = frozenset({"Message", "rmqkit.Message", "rmqkit.consumer.message.Message"})
_TRANSACTION_NAMES = frozenset({"Transaction", "rmqkit.Transaction"})
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def analyse(spec: str, target: Any, signature: inspect.Signature) -> HandlerSignature:
    """The call plan of ``target`` (named ``spec`` in messages); ConfigError if it cannot be
    a handler."""
    params = list(signature.parameters.values())
    keyword_only = [
        p.name
        for p in params
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is inspect.Parameter.empty
    ]
    if keyword_only:
        names = ", ".join(keyword_only)
        raise ConfigError(
            f"'{spec}' has required keyword-only arguments ({names}), which rmqkit cannot "
            f"fill; {ACCEPTED}"
        )
    positional = [p for p in params if p.kind in _POSITIONAL]
    if not positional:
        if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
            only = Parameter("args", Role.MESSAGE, "Message", variadic=True)
            return HandlerSignature((only,), HandlerInput.MESSAGE)
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            raise ConfigError(
                f"'{spec}' takes only **kwargs; name its parameters instead; {ACCEPTED}"
            )
        raise ConfigError(f"'{spec}' takes no argument; {ACCEPTED}")

    roles: list[tuple[inspect.Parameter, Role, Any]] = []
    for p in positional:
        hint = _resolve(spec, target, p)
        role = _role_of(hint)
        if p.default is not inspect.Parameter.empty and role is Role.BODY:
            continue  # a parameter with a default keeps it: only context is passed to one
        if p.default is not inspect.Parameter.empty and hint is inspect.Parameter.empty:
            continue  # unannotated with a default: keeps it too (``extra=1``)
        roles.append((p, role, hint))
    if not roles:
        # Every parameter has a default: the first still receives what its annotation says
        # (``def handle(message=None)``), as a one-argument handler always did.
        first = positional[0]
        hint = _resolve(spec, target, first)
        roles.append((first, _role_of(hint), hint))

    for role in Role:
        same = [p for p, r, _ in roles if r is role]
        if len(same) > 1:
            names = ", ".join(_shown_param(p) for p in same)
            raise ConfigError(
                f"'{spec}' takes {len(same)} required arguments ({names}) that would each "
                f"receive the {_ROLE_TEXT[role]}; {ACCEPTED}"
            )

    handler_input, input_type, convert = HandlerInput.MESSAGE, None, None
    built: list[Parameter] = []
    filled = {p.name for p, _, _ in roles}
    keyword = False
    for p in positional:
        if p.name not in filled:
            keyword = True  # everything after a parameter left at its default goes by name
            continue
        if keyword and p.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise ConfigError(
                f"'{spec}' has positional-only parameter '{p.name}' after one left at its "
                f"default; make it positional-or-keyword or drop the default; {ACCEPTED}"
            )
        _, role, hint = next(item for item in roles if item[0] is p)
        if role is Role.BODY:
            handler_input, input_type, convert = _body_input(p, hint)
            label = _type_label_of(handler_input, input_type)
        else:
            label = "Message" if role is Role.MESSAGE else "Transaction"
        built.append(Parameter(p.name, role, label, keyword=keyword))
    return HandlerSignature(tuple(built), handler_input, input_type, convert)


_ROLE_TEXT = {
    Role.BODY: "message body",
    Role.MESSAGE: "rmqkit.Message (an unannotated parameter receives it)",
    Role.TRANSACTION: "rmqkit.Transaction",
}


def _shown_param(p: inspect.Parameter) -> str:
    if p.annotation is inspect.Parameter.empty:
        return p.name
    raw = p.annotation
    return f"{p.name}: {raw if isinstance(raw, str) else type_label(raw)}"


def _role_of(hint: Any) -> Role:
    args = typing.get_args(hint)
    if type(None) in args and typing.get_origin(hint) in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and rest[0] in (Message, Transaction):
            hint = rest[0]  # ``Message | None = None``: still the Message
    if hint is inspect.Parameter.empty or hint is Message:
        return Role.MESSAGE
    if hint is Transaction:
        return Role.TRANSACTION
    return Role.BODY


def _resolve(spec: str, target: Any, parameter: inspect.Parameter) -> Any:
    """The parameter's annotation as an object, resolving strings (``from __future__ import
    annotations``) with typing.get_type_hints in the handler's module. Only this parameter's
    annotation is resolved: an unresolvable one elsewhere does not matter."""
    raw = parameter.annotation
    if raw is inspect.Parameter.empty:
        return raw
    if isinstance(raw, str) and raw.strip() in _TRANSACTION_NAMES:
        return Transaction  # imported under TYPE_CHECKING only: still the Transaction
    holder = types.SimpleNamespace(__annotations__={parameter.name: raw})
    try:
        return typing.get_type_hints(holder, globalns=_annotation_scope(target))[parameter.name]
    except Exception as exc:
        if isinstance(raw, str) and raw.strip() in _MESSAGE_NAMES:
            return Message
        raise ConfigError(
            f"cannot resolve the annotation {raw!r} of parameter '{parameter.name}': "
            f"{type(exc).__name__}: {exc}"
        ) from None


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


def _body_input(
    parameter: inspect.Parameter, annotation: Any
) -> tuple[HandlerInput, Any, Callable[[Message], Any]]:
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
        raise ConfigError(
            f"parameter '{parameter.name}' is annotated {type_label(annotation)}, which rmqkit "
            f"cannot build from a message body ({type(exc).__name__}); annotate it with "
            "rmqkit.Message, bytes, str, a pydantic model or a JSON type such as dict"
        ) from None
    validate = adapter.validate_json
    return HandlerInput.MODEL, annotation, lambda message: validate(message.body)


def _type_label_of(handler_input: HandlerInput, input_type: Any) -> str:
    if handler_input is HandlerInput.MODEL:
        return type_label(input_type)
    return {HandlerInput.BODY: "bytes", HandlerInput.TEXT: "str"}.get(handler_input, "Message")


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


__all__ = [
    "ACCEPTED",
    "HandlerInput",
    "HandlerSignature",
    "Parameter",
    "Role",
    "analyse",
    "type_label",
]

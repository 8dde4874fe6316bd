"""Several handlers on one queue: ``@rmqkit.handler("order.created")`` and routing by type.

A module's functions decorated ``@rmqkit.handler(TYPE)`` are its routes. ``rmqkit consume
app.handlers --queue q`` (a module, no ``:function``) loads them all and hands each message to
the one whose TYPE equals the message's type, read as ``--route-by`` says:

* ``header:NAME`` (default ``header:type``): the value of header NAME, a string;
* ``routing-key``: the routing key the producer published with (a retried copy keeps it, from
  its ``rmqkit-original-routing-key`` header).

The match is exact (no case folding, no trimming) and a plain dict lookup: a type names a route,
never an attribute of the module. A message with no type, a type that is not a string, or a type
no route names is not handled: its outcome is UnroutableType, parked as ``unroutable_type``.
Each route has its own signature (rmqkit.consumer.signature) and its own body decoding; a body
its route cannot decode is ``undecodable`` as for a single handler.

``Router`` is the same table built in code, for ``rmqkit.Consumer(handler=router)`` or
``rmqkit.testing.run_handler(router, ...)``; a module object is accepted there too.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from rmqkit import headers as h
from rmqkit.consumer.message import Message
from rmqkit.consumer.outcomes import UnroutableType
from rmqkit.errors import ConfigError, UsageError

if TYPE_CHECKING:
    from rmqkit.consumer.loading import LoadedHandler

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_ROUTE_BY = "header:type"
# Set on a decorated function: ((module, type), ...) in decoration order.
_MARK = "__rmqkit_routes__"
_SHOWN_MAX = 80  # characters of a producer's type value quoted in the parking reason


def handler(message_type: str) -> Callable[[F], F]:
    """Register the decorated function as its module's handler for ``message_type``.

    ``rmqkit consume MODULE`` (no ``:function``) routes each message to the handler whose type
    equals the message's (``--route-by``, default the ``type`` header). Stack the decorator to
    give one function several types. The function is returned unchanged: it can still be named
    as ``module:function`` or called in tests."""
    if (
        not isinstance(message_type, str)
        or not message_type
        or message_type != message_type.strip()
    ):
        raise ConfigError(
            f"@rmqkit.handler needs a non-empty type without surrounding spaces, not "
            f"{message_type!r}"
        )

    def register(function: F) -> F:
        module = getattr(function, "__module__", None) or ""
        marks = getattr(function, _MARK, ())
        setattr(function, _MARK, (*marks, (module, message_type)))
        return function

    return register


@dataclass(frozen=True, slots=True)
class RouteBy:
    """Where a message's type is read: a header (``name``) or, ``name`` None, the routing key."""

    header: str | None

    @classmethod
    def parse(cls, text: str) -> RouteBy:
        """``header:NAME`` or ``routing-key``; UsageError (64) on anything else."""
        kind, colon, name = text.strip().partition(":")
        if kind == "routing-key" and not colon:
            return cls(None)
        if kind == "header" and colon and name.strip() and name == name.strip():
            return cls(name)
        raise UsageError(
            f"--route-by {text!r}: expected 'header:NAME' (e.g. 'header:type') or 'routing-key'"
        )

    def __str__(self) -> str:
        return "routing-key" if self.header is None else f"header:{self.header}"

    def read(self, message: Message) -> str | None:
        """The message's type, or None (absent, or not a string)."""
        if self.header is None:
            # A retry copy comes back from its wait queue with the work queue's name as routing
            # key; the producer's is kept in ORIGINAL_ROUTING_KEY from the first failure on.
            original = message.headers.get(h.ORIGINAL_ROUTING_KEY) if message.headers else None
            if isinstance(original, str) and original:
                return original
            return message.routing_key or None
        value = message.headers.get(self.header) if message.headers else None
        if isinstance(value, bytes | bytearray):
            try:
                value = bytes(value).decode("utf-8")
            except UnicodeDecodeError:
                return None
        return value if isinstance(value, str) else None

    def where(self) -> str:
        return "the routing key" if self.header is None else f"header '{self.header}'"


class Router:
    """A table of handlers by message type, built in code (the module form is the decorator).

    ``router = Router(route_by="header:event")``; ``router.add("order.created", handle)`` or
    ``@router.handler("order.created")``. Pass it where a handler goes (``rmqkit.Consumer``,
    ``rmqkit.testing.run_handler``)."""

    def __init__(self, route_by: str = DEFAULT_ROUTE_BY, *, name: str = "router") -> None:
        self.route_by = RouteBy.parse(route_by)
        self.name = name
        self._routes: dict[str, tuple[str, Callable[..., Any]]] = {}

    def add(self, message_type: str, function: Callable[..., Any], *, name: str = "") -> None:
        """Route ``message_type`` to ``function``; ConfigError if the type has a handler."""
        handler(message_type)  # the same check of the type as the decorator's
        shown = name or getattr(function, "__qualname__", repr(function))
        if message_type in self._routes:
            raise ConfigError(
                f"{self.name}: two handlers for type {message_type!r}: "
                f"{self._routes[message_type][0]} and {shown}; keep one"
            )
        self._routes[message_type] = (shown, function)

    def handler(self, message_type: str) -> Callable[[F], F]:
        """Decorator form of ``add``."""

        def register(function: F) -> F:
            self.add(message_type, function)
            return function

        return register

    @property
    def routes(self) -> Mapping[str, tuple[str, Callable[..., Any]]]:
        return dict(self._routes)


def router_of_module(module: types.ModuleType, route_by: str = DEFAULT_ROUTE_BY) -> Router:
    """The routes ``module`` registered with ``@rmqkit.handler``, in a Router.

    Only functions decorated in this module count (one imported from another module routes
    there). Two handlers for one type, or none at all, are ConfigErrors naming the fix."""
    name = module.__name__
    router = Router(route_by, name=f"module '{name}'")
    # An alias of a decorated function is one route, named by the function's own name.
    named: dict[int, tuple[str, Any]] = {}
    for attr, value in sorted(vars(module).items()):
        marks = getattr(value, _MARK, None) if callable(value) else None
        if not isinstance(marks, tuple):
            continue
        if id(value) not in named or attr == getattr(value, "__name__", None):
            named[id(value)] = (attr, value)
    for attr, value in sorted(named.values(), key=lambda item: item[0]):
        for owner, message_type in getattr(value, _MARK):
            if owner == name:
                router.add(message_type, value, name=f"{name}:{attr}")
    if not router.routes:
        raise ConfigError(
            f"module '{name}' has no handler decorated @rmqkit.handler(\"TYPE\"): decorate its "
            f"handlers, or name one handler as 'module:function' (e.g. '{name}:handle')"
        )
    return router


@dataclass(frozen=True, slots=True)
class Routes:
    """A loaded router: each type's LoadedHandler and where the type is read."""

    route_by: RouteBy
    handlers: Mapping[str, LoadedHandler]

    def select(self, message: Message) -> LoadedHandler | UnroutableType:
        """The route for ``message``, or the UnroutableType outcome saying why there is none."""
        message_type = self.route_by.read(message)
        if message_type is not None:
            chosen = self.handlers.get(message_type)
            if chosen is not None:
                return chosen
            shown = message_type[:_SHOWN_MAX] + ("…" if len(message_type) > _SHOWN_MAX else "")
            detail = f"no handler for type {shown!r} ({self.route_by.where()})"
        else:
            detail = f"the message has no type ({self.route_by.where()} is missing or not text)"
        known = ", ".join(sorted(self.handlers))
        return UnroutableType(f"{detail}; handled types: {known}")


__all__ = ["DEFAULT_ROUTE_BY", "RouteBy", "Router", "Routes", "handler", "router_of_module"]

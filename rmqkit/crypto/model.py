"""Sensitive fields marked on a pydantic model (issue 16): ``Annotated[str, rmqkit.Sensitive()]``.

The other way to say what is sensitive, beside a work queue's ``sensitive_fields`` in the
topology file: the model a handler takes, or a publisher sends, marks its fields, and
``sensitive_fields(Model)`` lists them as the dotted paths ``encrypt_fields`` takes::

    class Customer(BaseModel):
        name: Annotated[str, rmqkit.Sensitive()]

    class Order(BaseModel):
        id: str
        customer: Customer | None = None
        tax_id: Annotated[str, rmqkit.Sensitive(blind_index=True)] = Field(alias="taxId")

    sensitive_fields(Order)  # (("customer.name", "taxId"), ("taxId",))

Paths use each field's JSON key (its serialization alias or alias, if set): they name places in
the JSON body. The walk steps into nested models (also ``Model | None``) and into the items of
lists, tuples and sets (``customers[].name``; a handler taking ``list[Order]``: ``[].tax_id``),
but not into dicts: a path cannot name their values, so a mark found inside one is a
ConfigError when the model is walked, never a field silently left in plaintext. The same for a
recursive model with marks (its paths would never end) and for a key containing a dot or a
bracket.

pydantic is imported when a model is walked, not when this module is: ``rmqkit.Sensitive`` is
usable in a model definition without making ``import rmqkit`` (the CLI's start) pay for it.
"""

from __future__ import annotations

import collections.abc
import contextlib
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any

from rmqkit.errors import ConfigError

Marked = tuple[tuple[str, ...], tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class Sensitive:
    """Marks a pydantic model field as sensitive: ``Annotated[str, rmqkit.Sensitive()]``.

    ``blind_index=True``: the field also gets a blind index, so ``parking list --match
    FIELD=VALUE`` can find messages by its value without decrypting them.
    """

    blind_index: bool = False


_CACHE: dict[tuple[Any, bool], Marked] = {}
_BAD_KEY = frozenset(".[]")
_UNION_ORIGINS: tuple[Any, ...] = (typing.Union, types.UnionType)


def sensitive_fields(model: Any, *, by_alias: bool = True) -> Marked:
    """The fields ``model`` marks ``Sensitive`` as dotted paths, and those of them with a blind
    index: ``((paths...), (blind-indexed paths...))``; both empty for a model without marks.

    ``model``: a pydantic model class, or a type built from one (``Order | None``, which the
    handler of a consumer may be annotated with). ``by_alias=False``: the paths by field name,
    as ``model_dump_json()`` writes them without ``by_alias``. Cached per type. ConfigError
    (78) for a mark a path cannot name (inside a dict, in a recursive model, under a
    key with a dot).
    """
    key = (model, by_alias)
    try:
        return _CACHE[key]
    except (KeyError, TypeError):  # TypeError: an unhashable annotation, walked each time
        pass
    found: dict[str, bool] = {}
    _walk_type(model, "", by_alias, (), found, _label(model))
    marked: Marked = (tuple(found), tuple(p for p, indexed in found.items() if indexed))
    with contextlib.suppress(TypeError):
        _CACHE[key] = marked
    return marked


def _label(tp: Any) -> str:
    """``Order``, ``list[Order]``, ``Order | None``: a type as the model's author wrote it."""
    args = typing.get_args(tp)
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return _label(args[0])
    if origin in _UNION_ORIGINS:
        return " | ".join("None" if a is type(None) else _label(a) for a in args)
    if origin is not None and args:
        return f"{_label(origin)}[{', '.join(_label(a) for a in args)}]"
    name = getattr(tp, "__qualname__", None)
    return name if isinstance(name, str) else repr(tp).replace("typing.", "")


def _model_class(tp: Any) -> type | None:
    """``tp`` if it is a pydantic model class, else None."""
    if not isinstance(tp, type):
        return None
    from pydantic import BaseModel

    return tp if issubclass(tp, BaseModel) else None


def _markers(metadata: typing.Iterable[Any]) -> list[Sensitive]:
    return [m for m in metadata if isinstance(m, Sensitive)]


def _walk_type(
    tp: Any,
    path: str,
    by_alias: bool,
    stack: tuple[type, ...],
    found: dict[str, bool],
    top: str,
) -> None:
    """Record the marks reachable from a value of type ``tp`` found at ``path``."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        marks = _markers(tp.__metadata__)
        if marks and path:
            found[path] = found.get(path, False) or any(m.blind_index for m in marks)
            return  # the whole value is encrypted: nothing under it to name
        _walk_type(tp.__origin__, path, by_alias, stack, found, top)
        return
    if origin in _UNION_ORIGINS:
        for arg in typing.get_args(tp):
            _walk_type(arg, path, by_alias, stack, found, top)
        return
    model = _model_class(tp)
    if model is not None:
        if model in stack:
            if _has_marks(model, set()):
                raise ConfigError(
                    f"{top}: {model.__qualname__} is recursive and marks fields Sensitive; "
                    "their paths would never end — list them in the topology file instead"
                )
            return
        _walk_model(model, path, by_alias, (*stack, model), found, top)
        return
    item = _item_type(tp, origin)
    if item is not None:
        _walk_type(item, f"{path}[]", by_alias, stack, found, top)
        return
    if origin is not None and any(_has_marks(arg, set()) for arg in typing.get_args(tp)):
        where = f"field {path}" if path else "the model"
        raise ConfigError(
            f"{top}: {where} is a {_label(tp)} whose items mark fields Sensitive; a field path "
            "cannot name dict values (or the items of this type), so they would go "
            f"unencrypted — mark the whole field (Annotated[{_label(tp)}, rmqkit.Sensitive()]) "
            "or change the model"
        )


_SEQUENCES: tuple[Any, ...] = (
    list,
    set,
    frozenset,
    collections.abc.Sequence,
    collections.abc.MutableSequence,
    collections.abc.Set,
    collections.abc.MutableSet,
    collections.abc.Iterable,
)


def _item_type(tp: Any, origin: Any) -> Any:
    """The item type of a list-like annotation (``list[X]``, ``tuple[X, ...]``, ``set[X]``,
    ``Sequence[X]``), whose JSON is a list a ``[]`` path step names; else None."""
    args = typing.get_args(tp)
    if origin in _SEQUENCES and len(args) == 1:
        return args[0]
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return args[0]
    return None


def _walk_model(
    model: type,
    prefix: str,
    by_alias: bool,
    stack: tuple[type, ...],
    found: dict[str, bool],
    top: str,
) -> None:
    fields = _fields(model, top)
    for name, info in fields.items():
        key = name
        if by_alias:
            key = info.serialization_alias or info.alias or name
        if _BAD_KEY & set(key) and (_markers(info.metadata) or _has_marks(info.annotation, set())):
            raise ConfigError(
                f"{top}: field {prefix}{key} of {model.__qualname__} has a dot or a bracket in "
                "its JSON key and marks (or holds) a Sensitive field; a path cannot name it"
            )
        path = f"{prefix}.{key}" if prefix else key
        marks = _markers(info.metadata)
        if marks:
            found[path] = found.get(path, False) or any(m.blind_index for m in marks)
            continue
        _walk_type(info.annotation, path, by_alias, stack, found, top)


def _fields(model: type, top: str) -> dict[str, Any]:
    """The model's fields, with every annotation resolved: a model defined before a class its
    fields name has forward references that pydantic resolves only on a rebuild, and a walk
    over them would miss the marks behind them."""
    if not getattr(model, "__pydantic_complete__", True):
        try:
            model.model_rebuild()  # type: ignore[attr-defined]
        except Exception as exc:
            raise ConfigError(
                f"{top}: {model.__qualname__} is not fully defined "
                f"({(str(exc).splitlines() or [''])[0]}): its Sensitive fields cannot be listed"
            ) from None
    fields: dict[str, Any] = getattr(model, "model_fields", {})
    return fields


def _has_marks(tp: Any, seen: set[int]) -> bool:
    """Whether anything reachable from type ``tp`` is marked Sensitive (no paths: any depth)."""
    if id(tp) in seen:
        return False
    seen.add(id(tp))
    if typing.get_origin(tp) is Annotated:
        return bool(_markers(tp.__metadata__)) or _has_marks(tp.__origin__, seen)
    model = _model_class(tp)
    if model is not None:
        fields = _fields(model, _label(model))
        return any(
            _markers(info.metadata) or _has_marks(info.annotation, seen) for info in fields.values()
        )
    return any(_has_marks(arg, seen) for arg in typing.get_args(tp))


__all__ = ["Sensitive", "sensitive_fields"]

"""Job arguments checked against a task's annotations, for the types JSON can carry: built
once per task when it is registered, run at each enqueue.

Checked: ``int``, ``float`` (an int too), ``str``, ``bool``, ``None``, ``list[T]`` /
``Sequence[T]`` (a list or tuple), ``dict[str, T]`` / ``Mapping[str, T]``, ``Optional`` and
unions, ``Literal``, ``TypedDict`` (its required keys, no others, each value), through
``Annotated`` and ``NewType``. Anything else (``Any``, ``object``, a class of the
application's, a ``datetime``, a type variable, an annotation that cannot be resolved) is
not checked: the value goes through as JSON gave it."""

from __future__ import annotations

import collections.abc
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, Union, get_args, get_origin

import typing_extensions
from typing_extensions import is_typeddict

#: Whether a value fits; None: nothing to check.
Check = Callable[[Any], bool]

_SCALARS: dict[Any, Check] = {
    int: lambda v: isinstance(v, int),
    float: lambda v: isinstance(v, int | float),
    str: lambda v: isinstance(v, str),
    bool: lambda v: isinstance(v, bool),
    type(None): lambda v: v is None,
    None: lambda v: v is None,
}
_LISTS = {list, collections.abc.Sequence, collections.abc.MutableSequence, typing.List}  # noqa: UP006
_DICTS = {dict, collections.abc.Mapping, collections.abc.MutableMapping, typing.Dict}  # noqa: UP006


_REQUIRED = {typing.Required, typing_extensions.Required}
_NOT_REQUIRED = {typing.NotRequired, typing_extensions.NotRequired}


def checker(annotation: Any) -> Check | None:
    """A check of values against ``annotation``, or None when it is not one pgq checks."""
    if isinstance(annotation, typing.NewType):
        return checker(annotation.__supertype__)
    if annotation in _SCALARS:
        return _SCALARS[annotation]
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is typing.Annotated:
        return checker(args[0])
    if origin is Union or origin is types.UnionType:
        checks = [checker(a) for a in args]
        if any(c is None for c in checks):
            return None  # a member pgq does not check: any value may be it
        members = [c for c in checks if c is not None]
        return lambda v: any(c(v) for c in members)
    if origin is Literal:
        allowed = [(type(a), a) for a in args]
        return lambda v: (type(v), v) in allowed
    if annotation in _LISTS or origin in _LISTS:
        item = checker(args[0]) if args else None
        if item is None:
            return lambda v: isinstance(v, list | tuple)
        return lambda v: isinstance(v, list | tuple) and all(item(x) for x in v)
    if annotation in _DICTS or origin in _DICTS:
        key = checker(args[0]) if args else None
        value = checker(args[1]) if len(args) > 1 else None
        return lambda v: (
            isinstance(v, dict)
            and all((key is None or key(k)) and (value is None or value(x)) for k, x in v.items())
        )
    if is_typeddict(annotation):
        return _typed_dict(annotation)
    return None


def _typed_dict(td: Any) -> Check | None:
    try:
        hints = typing.get_type_hints(td, include_extras=True)
    except Exception:  # an annotation that cannot be resolved: leave the whole dict be
        return None
    fields: dict[str, Check | None] = {}
    required = set(td.__required_keys__)
    for name, tp in hints.items():
        # Read from the hints too: under `from __future__ import annotations` Python 3.11
        # cannot see NotRequired when it builds the class.
        origin = get_origin(tp)
        if origin in _NOT_REQUIRED:
            required.discard(name)
        elif origin in _REQUIRED:
            required.add(name)
        while get_origin(tp) in _NOT_REQUIRED | _REQUIRED | {typing.Annotated}:
            tp = get_args(tp)[0]
        fields[name] = checker(tp)
    known = frozenset(hints)

    def check(v: Any) -> bool:
        if not isinstance(v, dict) or not required <= v.keys() or not v.keys() <= known:
            return False
        return all(c is None or c(v[k]) for k, c in fields.items() if k in v)

    return check


def describe(annotation: Any) -> str:
    """The annotation as a reader writes it: ``int``, ``list[str]``, ``str | None``."""
    if annotation is None or annotation is type(None):
        return "None"
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is typing.Annotated:
        return describe(args[0])
    if origin is Union or origin is types.UnionType:
        return " | ".join(describe(a) for a in args)
    if origin is Literal:
        return f"Literal[{', '.join(map(repr, args))}]"
    if origin is not None and args:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(describe(a) for a in args)}]"
    return getattr(annotation, "__name__", None) or repr(annotation).replace("typing.", "")


def shown(value: Any) -> str:
    """A value in an error message: its type and a short repr."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def checks_of(fn: Callable[..., Any], names: list[str]) -> tuple[tuple[str, Check, str], ...]:
    """``(name, check, expected)`` for each of ``names`` whose annotation pgq checks."""
    hints = resolved_hints(fn)
    found = []
    for name in names:
        if name in hints:
            check = checker(hints[name])
            if check is not None:
                found.append((name, check, describe(hints[name])))
    return tuple(found)


def resolved_hints(fn: Callable[..., Any]) -> Mapping[str, Any]:
    """``fn``'s annotations resolved (strings under ``from __future__ import annotations``
    included); empty when one cannot be (a name imported under ``TYPE_CHECKING``)."""
    try:
        return typing.get_type_hints(fn, include_extras=True)
    except Exception:
        return {}

"""JSON encoding of arguments, metadata and results, with errors that name the bad value."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from pgq.errors import SerializationError

_encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _make_encode() -> Any:
    """``_encoder.encode``, minus the C encoder it builds anew for every value.

    The stdlib's C encoder is built once here with ``_encoder``'s settings, so the output
    and the errors are the same (without circular-reference markers, a cycle raises
    RecursionError, which :func:`dumps` reports as one). Where the C encoder is missing or
    differs, ``_encoder.encode`` is used as is.
    """
    try:
        from json.encoder import (  # type: ignore[attr-defined]
            c_make_encoder,
            encode_basestring,
        )

        assert c_make_encoder is not None
        chunks = c_make_encoder(
            None, _encoder.default, encode_basestring, None, ":", ",", False, False, False
        )
        if "".join(chunks({"a": [1, 2.5, None, True, "\u00e9"]}, 0)) != (
            '{"a":[1,2.5,null,true,"\u00e9"]}'
        ):
            raise ValueError("unexpected output")
    except (ImportError, AssertionError, TypeError, ValueError):  # pragma: no cover
        return _encoder.encode
    join = "".join
    return lambda value: join(chunks(value, 0))


_encode = _make_encode()
#: The standard library's decoder: every integer exactly, whatever its size.
_decode_exact: Callable[[str], Any] = json.JSONDecoder().decode
_decode_fast: Callable[[str], Any] | None = None
_encode_flat: Callable[[Any], bytes] | None = None
try:  # the "speed" extra: decoding job rows is on the worker's hot path
    import orjson

    _decode_fast = orjson.loads
    _encode_flat = orjson.dumps
except ImportError:  # pragma: no cover - depends on the installation
    pass

#: orjson reads an integer below -2**63 or above 2**64 - 1 as the nearest float: one with
#: 20 digits or more, or a minus and 19. The look for them maps every digit of the text's
#: bytes to a 9 (one pass in C) and searches for those runs. (jsonb writes numbers without
#: exponents, so a float of 1e20 stored through it reads as such an integer too; it then
#: decodes as that integer, its value exact, as without orjson.)
_DIGITS_TO_NINES = bytes.maketrans(b"0123456789", b"9999999999")
_LONG_POSITIVE = b"9" * 20
_LONG_NEGATIVE = b"-" + b"9" * 19
#: The magnitude from which a float of orjson's may be such an integer.
_INEXACT_FROM = 2.0**63
#: The values of a flat dict that orjson decodes exactly, whatever their text.
_EXACT_TYPES = frozenset({str, int, bool, type(None)})

#: The value types a flat mapping may hold for the fast encoder: each is written the same
#: way by both encoders (floats too, once finite), and none is one that orjson writes but
#: the standard encoder refuses (datetime, UUID, Enum, dataclass).
_FLAT_TYPES = frozenset({str, int, bool, type(None)})


def _flat_text(value: dict[Any, Any]) -> str | None:
    """``value`` as JSON text by orjson (four to six times faster than the standard
    encoder), when it is a flat dict of plain values, the common shape of job arguments;
    None otherwise, and whenever orjson refuses it (a non-string key, an integer beyond 64
    bits, a lone surrogate): the standard encoder then writes or explains it."""
    assert _encode_flat is not None
    for item in value.values():
        kind = type(item)
        if kind not in _FLAT_TYPES and (kind is not float or not math.isfinite(item)):
            return None
    try:
        return _encode_flat(value).decode()
    except TypeError:  # orjson.JSONEncodeError
        return None


#: The most JSON text pgq writes in one value, in UTF-8 bytes. PostgreSQL's jsonb holds at
#: most 2^28 - 1 bytes in a string or a container; a text longer than that cannot fit.
MAX_JSON_BYTES = 2**28 - 1

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def dumps(value: Any, what: str = "args") -> str:
    """Encode ``value`` as JSON text, or raise :class:`SerializationError` naming the path
    of the first value that JSON (or PostgreSQL's jsonb) cannot hold
    (``args['user']['born']``)."""
    text: str | None = None
    if _encode_flat is not None and type(value) is dict:
        text = _flat_text(value)
    flat = text is not None  # orjson wrote it: every key is a string
    try:
        if text is None:
            text = _encode(value)
    except (TypeError, ValueError, RecursionError):
        path, problem = _find_bad(value, what)
        if problem in ("fine", _DEEPER_THAN_PYTHON):  # too deep for the encoder, not circular
            deep = _too_deep(value, what)
            raise _nested_too_deeply(deep if deep is not None else what) from None
        raise SerializationError(
            f"{path} is {problem}: job {what.split('[')[0]} must be JSON "
            "(dict, list, str, int, float, bool, None); convert it before enqueueing, "
            "e.g. a datetime to .isoformat()",
            path,
        ) from None
    # Each level opens a bracket: fewer brackets than the limit need no walk.
    if not flat and text.count("[") + text.count("{") > MAX_JSON_DEPTH:
        deep = _too_deep(value, what)
        if deep is not None:
            raise _nested_too_deeply(deep)
    if what in _STRING_KEYS_ONLY and not flat and not _keys_are_strings(value):
        path, key = _first_odd_key(value, what)
        raise SerializationError(
            f"{path} has the key {key!r}, of type {type(key).__name__}: JSON keys are "
            "strings, and pgq does not convert keys silently (1 and '1' would become one "
            "key, and the task would receive '1'); use string keys",
            path,
        )
    if len(text) > MAX_JSON_BYTES // 4:  # a UTF-8 character takes at most 4 bytes
        size = len(text.encode(errors="replace"))
        if size > MAX_JSON_BYTES:
            raise SerializationError(
                f"{what} is {size:,} bytes of JSON, more than PostgreSQL's jsonb can hold "
                f"({MAX_JSON_BYTES:,} bytes): store large data elsewhere (a table, object "
                "storage) and pass a reference",
                what,
            )
    if "\\u0000" in text:  # maybe a NUL, which jsonb refuses (or an escaped backslash)
        nul_at = _find_string(value, what, lambda s: "\x00" in s)
        if nul_at is not None:
            raise SerializationError(
                f"{nul_at} is a string with a NUL character (\\u0000), which PostgreSQL "
                "cannot store in jsonb: remove it, or encode the value (e.g. as base64)",
                nul_at,
            )
    if not text.isascii() and _LONE_SURROGATE.search(text):
        at = _find_string(value, what, lambda s: _LONE_SURROGATE.search(s) is not None) or what
        raise SerializationError(
            f"{at} is a string with a lone surrogate (such as \\ud800), which is not valid "
            "UTF-8 and cannot be stored: decode the text that produced it with "
            "errors='replace', or encode the value (e.g. as base64)",
            at,
        )
    return text


_CONTAINERS = (dict, list, tuple)
#: The deepest nesting of lists and dicts pgq stores. Every decoder that reads a value back
#: (the standard library's, which recurses, and orjson's, which stops at 1,024) takes it
#: from whatever call stack a task, a client or a page reads it in.
MAX_JSON_DEPTH = 256
_DEEPER_THAN_PYTHON = "nested too deeply to be stored as JSON"


def _too_deep(value: Any, what: str) -> str | None:
    """The field of ``value`` (its key, when it is a dict; else ``what``) that nests lists
    and dicts more than :data:`MAX_JSON_DEPTH` levels, or None. Without recursion, and
    never further than the limit (a circular value is too deep too)."""
    stack: list[tuple[Any, int, str]] = [(value, 1, what)]
    while stack:
        item, depth, field = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return field
        if isinstance(item, dict):
            for key, inner in item.items():
                if isinstance(inner, _CONTAINERS):
                    stack.append((inner, depth + 1, f"{what}[{key!r}]" if depth == 1 else field))
        elif isinstance(item, list | tuple):
            stack.extend(
                (inner, depth + 1, field) for inner in item if isinstance(inner, _CONTAINERS)
            )
    return None


def _nested_too_deeply(field: str) -> SerializationError:
    return SerializationError(
        f"{field} is nested too deeply: more than {MAX_JSON_DEPTH} levels of lists and "
        "dicts, the most pgq stores; flatten it, or store the data elsewhere and pass a "
        "reference",
        field,
    )


#: What is refused, rather than written with its keys turned into text, when a dict in it
#: has a key that is not a string: what a caller enqueues (who can fix it). A task's
#: result keeps the encoder's conversion: the work is done, and storing it matters more.
_STRING_KEYS_ONLY = frozenset({"args", "metadata"})


def _keys_are_strings(value: Any) -> bool:
    """Whether every key of every dict in ``value`` (as the JSON encoder walks it: dicts,
    lists, tuples) is a string; the encoder would write an int, float, bool or None key as
    text. Without recursion: ``value`` may be nested as deep as the encoder goes."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, inner in item.items():
                if not isinstance(key, str):
                    return False
                if isinstance(inner, _CONTAINERS):
                    stack.append(inner)
        elif isinstance(item, list | tuple):
            stack.extend(inner for inner in item if isinstance(inner, _CONTAINERS))
    return True


def _first_odd_key(value: Any, path: str) -> tuple[str, Any]:
    """The path of a dict holding a key that is not a string, and that key."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, dict):
            for key, inner in item.items():
                if not isinstance(key, str):
                    return at, key
                stack.append((inner, f"{at}[{key!r}]"))
        elif isinstance(item, list | tuple):
            stack.extend((inner, f"{at}[{i}]") for i, inner in enumerate(item))
    raise AssertionError("no such key")  # pragma: no cover - called once one was seen


def _find_string(value: Any, path: str, bad: Callable[[str], bool]) -> str | None:
    """The path of the first string (value or key) in ``value`` for which ``bad`` holds."""
    if isinstance(value, str):
        return path if bad(value) else None
    if isinstance(value, Mapping | list | tuple):
        items = value.items() if isinstance(value, Mapping) else enumerate(value)
        for key, item in items:
            if isinstance(key, str) and bad(key):
                return f"{path}[{key!r}]"
            found = _find_string(item, f"{path}[{key!r}]", bad)
            if found is not None:
                return found
    return None


def loads(text: str | None) -> Any:
    """Decode JSON text read from the database (None stays None), every number as it was
    written: an integer of any size stays that integer."""
    if text is None:
        return None
    if text == "{}":  # most metadata: skip the decoder
        return {}
    if text == "[]":  # most errors lists
        return []
    if _decode_fast is None:  # pragma: no cover - depends on the installation
        return _decode_exact(text)
    try:
        value = _decode_fast(text)
    except ValueError:  # orjson.JSONDecodeError: a number beyond a float's range
        return _decode_exact(text)
    if len(text) < 20:  # no room for such an integer
        return value
    if type(value) is dict:  # job arguments, most often a flat dict of str and int
        for item in value.values():
            if type(item) not in _EXACT_TYPES:
                break
        else:
            return value
    nines = text.encode().translate(_DIGITS_TO_NINES)
    if _LONG_POSITIVE not in nines and _LONG_NEGATIVE not in nines:
        return value
    try:
        return _decode_exact(text)
    except RecursionError:
        # Nested deeper than the standard decoder goes: orjson's value stands unless it
        # holds a float that may be an integer it could not read.
        if _holds_inexact_float(value):
            raise
        return value


def _holds_inexact_float(value: Any) -> bool:
    """Whether ``value`` (orjson's) holds a float of 2**63 or more either way, which may be an
    integer orjson read as the nearest float; walked without recursion."""
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is float:
            if not -_INEXACT_FROM < item < _INEXACT_FROM:
                return True
        elif type(item) is dict:
            stack.extend(item.values())
        elif type(item) is list:
            stack.extend(item)
    return False


def _find_bad(value: Any, path: str) -> tuple[str, str]:
    try:
        return _find_bad_in(value, path, set())
    except RecursionError:
        return path, _DEEPER_THAN_PYTHON


def _find_bad_in(value: Any, path: str, seen: set[int]) -> tuple[str, str]:
    if value is None or isinstance(value, str | bool | int):
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                repr(value)
            except ValueError:  # more digits than Python converts to text
                return path, "an integer too large to write as JSON"
        return path, "fine"
    if isinstance(value, float):
        return path, "fine" if math.isfinite(
            value
        ) else f"the float {value!r} (JSON has no NaN or infinity)"
    if isinstance(value, Mapping | list | tuple):
        if id(value) in seen:
            return path, "a circular reference"
        seen.add(id(value))
        items = value.items() if isinstance(value, Mapping) else enumerate(value)
        for key, item in items:
            if isinstance(value, Mapping) and not isinstance(key, str | int | float | bool):
                return f"{path}[{key!r}]", f"a key of type {type(key).__name__}"
            found = _find_bad_in(item, f"{path}[{key!r}]", seen)
            if found[1] != "fine":
                return found
        seen.discard(id(value))
        return path, "fine"
    return path, f"of type {type(value).__name__}, which is not JSON serializable"


class UndecodableArgs(dict[str, Any]):
    """The arguments of a claimed job whose stored JSON Python could not decode (an integer
    of more digits than ``int()`` converts, nesting deeper than the decoder goes): empty,
    with the reason, so that the job fails with it instead of the claim around it."""

    __slots__ = ("problem",)

    def __init__(self, problem: str) -> None:
        super().__init__()
        self.problem = problem


def unreadable(value: Any) -> str | None:
    """For operators' views: why ``value`` is not shown, when it stands in for arguments
    Python could not decode (the stored JSON is left as it was), else None."""
    if value.__class__ is UndecodableArgs:
        return str(value.problem)
    return None


def undecodable(exc: BaseException) -> UndecodableArgs:
    """The arguments of a job whose row raised ``exc`` when decoded."""
    return UndecodableArgs(
        "its stored arguments, metadata or result could not be decoded "
        f"({type(exc).__name__}: {exc}); pgq refuses such values at enqueue: fix the row, "
        "or enqueue the job again through pgq"
    )

"""JSON encoding of arguments, metadata and results, with errors that name the bad value."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from pgq.errors import SerializationError

_encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
_decode: Any = json.JSONDecoder().decode
try:  # the "speed" extra: decoding job rows is on the worker's hot path
    import orjson

    _decode = orjson.loads
except ImportError:  # pragma: no cover - depends on the installation
    pass


def dumps(value: Any, what: str = "args") -> str:
    """Encode ``value`` as JSON text, or raise :class:`SerializationError` naming the path
    of the first value that JSON cannot hold (``args['user']['born']``)."""
    try:
        return _encoder.encode(value)
    except (TypeError, ValueError, RecursionError):
        path, problem = _find_bad(value, what, set())
        raise SerializationError(
            f"{path} is {problem}: job {what.split('[')[0]} must be JSON "
            "(dict, list, str, int, float, bool, None); convert it before enqueueing, "
            "e.g. a datetime to .isoformat()",
            path,
        ) from None


def loads(text: str | None) -> Any:
    """Decode JSON text read from the database (None stays None)."""
    if text is None:
        return None
    if text == "{}":  # most metadata: skip the decoder
        return {}
    return _decode(text)


def _find_bad(value: Any, path: str, seen: set[int]) -> tuple[str, str]:
    if value is None or isinstance(value, str | bool | int):
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
            found = _find_bad(item, f"{path}[{key!r}]", seen)
            if found[1] != "fine":
                return found
        seen.discard(id(value))
        return path, "fine"
    return path, f"of type {type(value).__name__}, which is not JSON serializable"

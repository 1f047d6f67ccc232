import json
import math
from datetime import datetime

import pytest

from pgq import serde
from pgq.errors import SerializationError


def test_round_trip() -> None:
    value = {"a": [1, 2.5, "x", None, True], "b": {"c": "é"}}
    assert serde.loads(serde.dumps(value)) == value


@pytest.mark.parametrize(
    ("value", "path", "problem"),
    [
        ({"user": {"born": datetime(2000, 1, 1)}}, "args['user']['born']", "datetime"),
        ({"items": [1, {2, 3}]}, "args['items'][1]", "set"),
        ({"x": math.nan}, "args['x']", "NaN"),
        ({"k": {(1, 2): "tuple key"}}, "args['k'][(1, 2)]", "key of type tuple"),
    ],
)
def test_error_names_the_path_of_the_bad_value(value: object, path: str, problem: str) -> None:
    with pytest.raises(SerializationError, match="must be JSON") as info:
        serde.dumps(value, "args")
    assert info.value.path == path
    assert problem in str(info.value)
    assert str(info.value).startswith(path)


def test_circular_reference_is_reported() -> None:
    value: dict[str, object] = {}
    value["self"] = value
    with pytest.raises(SerializationError, match="circular"):
        serde.dumps(value)


@pytest.mark.parametrize(
    "value",
    [
        {"i": 1},
        {},
        [],
        "x",
        -0.0,
        10**30,
        {"a": {"b": [1, 'é\n"\\', 1e300, None, True, False]}, "c": 2.5},
        {1: "int keys become strings", 2.5: "so do floats", None: "and None"},
    ],
)
def test_encodes_exactly_as_the_standard_library(value: object) -> None:
    expected = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    assert serde.dumps(value) == expected


def test_a_nul_character_is_refused_with_its_path() -> None:
    with pytest.raises(SerializationError, match=r"args\['s'\]\[1\] is a string with a NUL"):
        serde.dumps({"s": ["ok", "a\x00b"]})
    assert serde.dumps({"s": "\\u0000"}) == '{"s":"\\\\u0000"}', "a backslash is not a NUL"

import json
import math
from datetime import datetime

import pytest

from pgq import _serde as serde
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


def test_a_value_nested_deeper_than_json_goes_is_refused_with_a_reason() -> None:
    value: list[object] = []
    for _ in range(100_000):
        value = [value]
    with pytest.raises(SerializationError, match="nested too deeply") as info:
        serde.dumps(value, "result")
    assert info.value.path == "result"


def test_a_lone_surrogate_is_refused_with_its_path() -> None:
    # Not valid UTF-8: the driver could not even send it.
    with pytest.raises(SerializationError, match="lone surrogate") as info:
        serde.dumps({"name": "caf\udce9"}, "args")
    assert info.value.path == "args['name']"


def test_json_beyond_what_jsonb_holds_is_refused_naming_its_size() -> None:
    with pytest.raises(SerializationError, match=r"268,435,46\d bytes of JSON") as info:
        serde.dumps({"blob": "x" * serde.MAX_JSON_BYTES}, "args")
    assert "jsonb" in str(info.value)
    # Fewer characters than the limit, more bytes: 150 million two-byte characters.
    with pytest.raises(SerializationError, match=r"300,000,0\d\d bytes of JSON"):
        serde.dumps({"blob": "\u00e9" * 150_000_000}, "args")

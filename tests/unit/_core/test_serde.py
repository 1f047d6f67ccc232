import enum
import json
import math
import uuid
from datetime import datetime

import pytest

from pgq._core import serde as serde
from pgq.errors import SerializationError


class _Colour(enum.Enum):
    RED = "red"


class _Level(enum.IntEnum):
    HIGH = 2


class _Name(enum.StrEnum):
    ADA = "ada"


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
        {1: "in a result, int keys become strings", 2.5: "so do floats", None: "and None"},
    ],
)
def test_encodes_exactly_as_the_standard_library(value: object) -> None:
    expected = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    assert serde.dumps(value, "result") == expected
    if not (isinstance(value, dict) and any(not isinstance(k, str) for k in value)):
        assert serde.dumps(value, "args") == expected


def test_args_with_a_key_that_is_not_a_string_are_refused_at_any_depth() -> None:
    deep: dict[str, object] = {"k": 1}
    for _ in range(120):  # 241 levels: within MAX_JSON_DEPTH
        deep = {"k": [deep]}
    assert serde.dumps(deep, "args").count('"k"') == 121
    with pytest.raises(SerializationError, match=r"has the key 2\.5, of type float") as info:
        serde.dumps({"a": [0, {"b": {2.5: 1}}]}, "metadata")
    assert info.value.path == "metadata['a'][1]['b']"


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


def _args_nested(levels: int) -> dict[str, object]:
    """Job arguments nesting ``levels`` levels: the args dict, then lists in lists."""
    inner: list[object] = []
    for _ in range(levels - 2):
        inner = [inner]
    return {"fine": [[1]], "tree": inner}


@pytest.mark.parametrize("levels", [serde.MAX_JSON_DEPTH + 1, 5_000])
def test_args_nested_past_the_limit_are_refused_naming_the_field(levels: int) -> None:
    """Past the limit every decoder takes (5,000: deeper than the encoder itself goes), the
    error names the argument, not a traceback's RecursionError."""
    with pytest.raises(SerializationError, match="nested too deeply: more than 256") as info:
        serde.dumps(_args_nested(levels), "args")
    assert info.value.path == "args['tree']"
    assert "datetime" not in str(info.value)


def test_args_nested_to_the_limit_are_stored() -> None:
    text = serde.dumps(_args_nested(serde.MAX_JSON_DEPTH), "args")
    assert text.count("[") == serde.MAX_JSON_DEPTH - 1 + 2


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


# A flat dict of plain values, the usual shape of job arguments, is written by orjson when
# the "speed" extra is installed. Its text may differ from the standard library's in how a
# float is spelt (1e16 against 1e+16), never in the value it holds, and it refuses what the
# standard encoder refuses.
FLAT_VALUES = [
    {"i": 1},
    {"user_id": 12345, "email": "someone@example.com", "admin": True, "note": None},
    {"text": 'é\n"\\\t\u2028 \U0001f600', "": 0},
    {"f": 2.5, "g": -0.0, "h": 1e16, "j": 1e-7, "k": 5e-324, "m": 1.7976931348623157e308},
    {"big": 2**70, "neg": -(2**63), "edge": 2**64 - 1},
    {1: "an int key, in a result", "s": 1},
]


@pytest.fixture(params=["orjson", "standard"])
def encoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "orjson":
        if serde._encode_flat is None:
            pytest.skip("orjson (the speed extra) is not installed")
    else:
        monkeypatch.setattr(serde, "_encode_flat", None)
    return str(request.param)


@pytest.mark.parametrize("value", FLAT_VALUES)
def test_flat_arguments_hold_the_same_values_with_either_encoder(
    value: dict[object, object], encoder: str
) -> None:
    expected = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    text = serde.dumps(value, "result")  # arguments refuse a key that is not a string
    assert json.loads(text) == json.loads(expected)
    if not any(isinstance(v, float) for v in value.values()):
        assert text == expected


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"x": math.inf}, "infinity"),
        ({"when": datetime(2000, 1, 1)}, "datetime"),
        ({"id": uuid.UUID(int=1)}, "UUID"),
        ({"colour": _Colour.RED}, "_Colour"),
        ({"s": "caf\udce9"}, "lone surrogate"),
        ({"s": "a\x00b"}, "NUL"),
    ],
)
def test_flat_arguments_are_refused_alike_by_either_encoder(
    value: dict[str, object], problem: str, encoder: str
) -> None:
    with pytest.raises(SerializationError, match=problem) as info:
        serde.dumps(value, "args")
    assert info.value.path == f"args[{next(iter(value))!r}]"


def test_subclasses_of_plain_types_are_written_by_the_standard_encoder(encoder: str) -> None:
    value = {"level": _Level.HIGH, "name": _Name.ADA}
    assert serde.dumps(value) == '{"level":2,"name":"ada"}'


@pytest.mark.parametrize(
    "text",
    [
        '{"n":123456789012345678901234567890}',  # beyond 64 bits: orjson makes it a float
        '{"n":-9223372036854775809}',
        '{"a":[1,{"b":18446744073709551616}],"c":0.5}',  # nested, beside a float
        "[" + "9" * 400 + "]",  # beyond a float's range: orjson refuses it
        '{"n":' + "7" * 400 + "}",
        "12345678901234567890123",
        '{"x":1.5,"y":"1234567890123456789012"}',  # a long run of digits in a string
        '{"x":[1.5],"ns":1764739200123456789,"u":18446744073709551615}',  # exact in orjson
        '{"x":[1],"n":-9999999999999999999}',
        "[" + "1" * 20 + "]",
        '{"x":1.5,"y":[2.25,-0.125]}',
        '{"i":1,"s":"a","b":true,"z":null}',
    ],
)
def test_loads_keeps_every_number_as_the_standard_decoder_reads_it(text: str) -> None:
    value = serde.loads(text)
    assert value == json.loads(text)
    # Equal is not enough: 10**30 == 1e30 is False, but a float can compare equal to an int.
    assert repr(value) == repr(json.loads(text))


def test_a_big_integer_round_trips_exactly() -> None:
    for n in (2**64, -(2**63) - 1, 10**30 + 1, 7**500):
        assert serde.loads(serde.dumps({"n": n})) == {"n": n}
        assert type(serde.loads(serde.dumps({"n": [n]}))["n"][0]) is int


def test_loads_of_deep_nesting_with_long_digits_keeps_what_it_decoded() -> None:
    # Deeper than the standard decoder goes from a few frames down, within orjson's reach:
    # the look for long integers must not turn a value that decodes into an error.
    text = "[" * 1000 + '"1234567890123456789012", 1.5' + "]" * 1000
    value = serde.loads(text)
    for _ in range(1000):
        value = value[0] if len(value) == 1 else value
    assert value == ["1234567890123456789012", 1.5]


def test_loads_too_deep_for_the_standard_decoder_with_an_inexact_float_raises() -> None:
    # orjson would read the integer as 1e24: better an error (the job fails, saying why)
    # than a wrong value.
    text = "[" * 1000 + "1000000000000000000000001" + "]" * 1000
    with pytest.raises(RecursionError):
        serde.loads(text)

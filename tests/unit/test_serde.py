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

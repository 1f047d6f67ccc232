"""A type checker sees through pgq's typed enqueue: good code passes, bad code fails where
it is bad (mypy --strict, as a user would run it)."""

from __future__ import annotations

import re
from pathlib import Path

from mypy import api

CASES = Path(__file__).resolve().parents[1] / "typing_cases"


def _mypy(path: Path) -> tuple[str, int]:
    out, err, status = api.run(["--strict", "--no-incremental", "--no-error-summary", str(path)])
    return out + err, status


def test_typed_enqueue_type_checks() -> None:
    out, status = _mypy(CASES / "good.py")
    assert status == 0, out


def test_wrong_arguments_and_results_fail_type_checking() -> None:
    out, status = _mypy(CASES / "bad.py")
    assert status == 1
    errors = {int(m.group(1)) for m in re.finditer(r"bad\.py:(\d+): error", out)}
    lines = (CASES / "bad.py").read_text().splitlines()
    expected = {i for i, line in enumerate(lines, 1) if "# BAD" in line}
    assert errors == expected, out
    assert 'Unexpected keyword argument "signupid"' in out
    assert 'incompatible type "int"; expected "str"' in out
    assert 'Unexpected keyword argument "stale_afer" for "Worker"' in out
    assert 'Argument "concurrency" to "Worker" has incompatible type "str"; expected "int"' in out

"""``pgq.Worker``'s setting keywords are typed, and are the settings table itself: one
keyword per field of :class:`pgq.WorkerSettings`, of the field's type (tests/typing_cases
shows mypy refusing a misspelt one)."""

from __future__ import annotations

import inspect
from dataclasses import fields
from typing import get_type_hints

import pgq
from pgq.settings import WorkerOverrides, WorkerSettings


def test_every_setting_is_a_keyword_of_its_own_type() -> None:
    settings = get_type_hints(WorkerSettings)
    assert get_type_hints(WorkerOverrides) == {
        f.name: settings[f.name] for f in fields(WorkerSettings)
    }


def test_every_setting_keyword_may_be_left_out() -> None:
    assert WorkerOverrides.__required_keys__ == frozenset()


def test_the_worker_takes_its_settings_as_those_keywords() -> None:
    parameters = inspect.signature(pgq.Worker).parameters
    (var_keyword,) = (p for p in parameters.values() if p.kind is p.VAR_KEYWORD)
    assert var_keyword.annotation == "Unpack[WorkerOverrides]"
    named = {name for name, p in parameters.items() if p.kind is not p.VAR_KEYWORD}
    assert named.isdisjoint(WorkerOverrides.__annotations__)

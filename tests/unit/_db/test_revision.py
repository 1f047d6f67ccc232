"""The rolling-upgrade rule, judged on what a database records: code runs on its own
revision, or on a newer one whose oldest served code revision is at or below its own."""

from __future__ import annotations

import pytest

import pgq
from pgq._db.revision import (
    KNOWN_REVISIONS,
    SCHEMA_REVISION,
    Revision,
    require_current,
    serves_this_code,
)


def test_the_current_revision_is_accepted() -> None:
    require_current(Revision(SCHEMA_REVISION))


@pytest.mark.parametrize("minimum", [SCHEMA_REVISION, KNOWN_REVISIONS[0]])
def test_a_newer_revision_that_still_serves_this_code_is_accepted(minimum: str) -> None:
    found = Revision("pgq_9999", min_code=minimum)
    assert serves_this_code(found)
    require_current(found)


def test_a_newer_revision_whose_minimum_is_above_this_code_is_refused() -> None:
    with pytest.raises(pgq.SchemaMismatch) as info:
        require_current(Revision("pgq_9999", min_code="pgq_9998"))
    message = str(info.value)
    assert "serves pgq code from revision pgq_9998 on" in message
    assert f"this pgq is at {SCHEMA_REVISION}" in message
    assert "run a pgq release that ships revision pgq_9998 or later" in message
    assert "run `pgq migrate`" not in message
    assert info.value.min_code == "pgq_9998"


def test_a_newer_revision_that_records_no_minimum_is_refused() -> None:
    with pytest.raises(pgq.SchemaMismatch, match="run the pgq release that ships it"):
        require_current(Revision("pgq_9999"))


@pytest.mark.parametrize("older", KNOWN_REVISIONS[:-1])
def test_an_older_revision_is_refused_with_the_advice_to_migrate(older: str) -> None:
    # A minimum recorded or not, an older schema lacks what this code needs.
    with pytest.raises(
        pgq.SchemaMismatch,
        match=rf"schema at revision {older}, this pgq needs {SCHEMA_REVISION}: run `pgq migrate`$",
    ):
        require_current(Revision(older, min_code=KNOWN_REVISIONS[0]))


def test_no_schema_is_refused_with_the_advice_to_migrate() -> None:
    with pytest.raises(pgq.SchemaMismatch, match="revision none .*: run `pgq migrate`$"):
        require_current(Revision(None))

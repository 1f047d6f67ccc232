import gc
from collections.abc import Iterator

import pytest

import pgq


@pytest.fixture
def restored_gc() -> Iterator[None]:
    """The collector's settings as Python set them, after the test."""
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_tune_gc_freezes_what_lives_now_and_raises_the_first_threshold(
    restored_gc: None,
) -> None:
    _, second, third = gc.get_threshold()
    frozen = pgq.tune_gc()
    assert frozen == gc.get_freeze_count() > 1_000  # this process's modules, at least
    assert gc.get_threshold() == (10_000, second, third)
    created_after = [object() for _ in range(3)], {"a": [1]}
    assert all(gc.is_tracked(o) for o in created_after)  # new objects are collected as before
    assert gc.get_freeze_count() == frozen

    assert pgq.tune_gc(2_000) >= frozen
    assert gc.get_threshold()[0] == 2_000


@pytest.mark.parametrize("bad", [0, -5, 1.5, "10000", True, 2**31])
def test_tune_gc_refuses_a_threshold_that_is_not_a_positive_whole_number(
    restored_gc: None, bad: object
) -> None:
    threshold = gc.get_threshold()
    with pytest.raises(ValueError, match="threshold must be a whole number from 1 to"):
        pgq.tune_gc(bad)  # type: ignore[arg-type]
    assert gc.get_threshold() == threshold and gc.get_freeze_count() == 0


def test_a_busy_worker_is_told_of_a_collector_at_pythons_settings_and_a_tuned_one_is_not(
    restored_gc: None,
) -> None:
    from pgq._core.gc import BUSY_CONCURRENCY, GC_THRESHOLD, untuned_note

    gc.set_threshold(700)
    note = untuned_note(1_000)
    assert note is not None and "first generation at 700" in note
    assert "1000 jobs in flight" in note and "pgq.tune_gc()" in note
    assert untuned_note(BUSY_CONCURRENCY - 1) is None  # few jobs in flight: nothing to say
    gc.set_threshold(GC_THRESHOLD)
    assert untuned_note(1_000) is None  # tuned
    gc.set_threshold(700)
    gc.disable()
    try:
        assert untuned_note(1_000) is None  # the host collects by itself
    finally:
        gc.enable()

"""Garbage-collector settings for a process whose main work is a pgq worker."""

from __future__ import annotations

import gc

#: The first generation's threshold a tuned process runs with (Python's default is 700 up
#: to 3.12, 2,000 from 3.13).
GC_THRESHOLD = 10_000
#: The largest threshold the collector takes (a C int).
_MOST = 2**31 - 1
#: Jobs in flight from which a worker says, as it starts, that the collector runs at
#: Python's settings: the more jobs in flight, the more of their objects each collection
#: walks. With jobs of 10 ms on Python 3.11, the collector took 9 % of the worker's CPU at
#: 100 in flight, 19 % at 300, 25 % at 1,000 (benchmarks/bench_gc_share.py,
#: docs/embedding.md).
BUSY_CONCURRENCY = 300


def untuned_note(concurrency: int) -> str | None:
    """What a worker running up to ``concurrency`` jobs at once should say of this
    process's collector when it runs at Python's own first threshold (below
    ``GC_THRESHOLD``) and that many jobs are in flight; None when there is nothing to say
    (few jobs, a tuned or disabled collector)."""
    first = gc.get_threshold()[0]
    if concurrency < BUSY_CONCURRENCY or not gc.isenabled() or first >= GC_THRESHOLD:
        return None
    return (
        f"the garbage collector runs at Python's settings (first generation at {first}); "
        f"with {concurrency} jobs in flight it can take a fifth of a busy worker's CPU or "
        "more. pgq worker tunes it unless given --gc default; where an embedded worker does "
        "most of its process's work, call pgq.tune_gc() at the end of start-up "
        "(docs/embedding.md)"
    )


def tune_gc(threshold: int = GC_THRESHOLD) -> int:
    """Set up the garbage collector for a worker process; returns how many objects are
    frozen now (:func:`gc.get_freeze_count`).

    Call it once, at the end of start-up: the App imported, before the process serves
    anything or runs jobs. It raises the first generation's threshold to ``threshold`` net
    new objects (Python's default is 700 up to 3.12, 2,000 from 3.13, crossed many times per
    claim of a few hundred jobs), collects what is garbage now, then moves every object
    alive (modules, classes, the App) out of the collector's reach with :func:`gc.freeze`,
    so that the full collections a backlog sets off no longer walk them. Together they cut
    a busy worker's CPU per job by about a fifth on Python 3.11 (docs/performance.md).
    Reference counting frees what jobs leave as before; reference cycles wait longer to
    be collected (up to ``threshold`` new objects in the young generation, about ten times
    that once promoted), and an object frozen here is never collected, even if it later
    becomes garbage in a cycle: call it when what is alive will live as long as the process.
    ``pgq worker`` calls it unless started with ``--gc default``; a process whose jobs leave
    many cycles holding large buffers is better off with Python's settings.
    """
    if isinstance(threshold, bool) or not isinstance(threshold, int) or not 1 <= threshold <= _MOST:
        raise ValueError(f"threshold must be a whole number from 1 to {_MOST}, not {threshold!r}")
    _, second, third = gc.get_threshold()
    gc.set_threshold(threshold, second, third)
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()

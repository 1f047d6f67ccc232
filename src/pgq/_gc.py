"""Garbage-collector settings for a process whose main work is a pgq worker."""

from __future__ import annotations

import gc

#: The first generation's threshold a tuned process runs with (Python's default: 700).
GC_THRESHOLD = 10_000


def tune_gc(threshold: int = GC_THRESHOLD) -> int:
    """Set up the garbage collector for a worker process; returns how many objects it froze.

    Call it once, after start-up (the App imported, before jobs run): it collects what is
    garbage now, then moves every object alive (modules, classes, the App: what lives as long
    as the process) out of the collector's reach with :func:`gc.freeze`, so that the full
    collections a backlog sets off no longer walk them; and it raises the first generation's
    threshold to ``threshold`` net new objects (Python's default is 700, crossed many times
    per claim of a few hundred jobs). Together they cut a busy worker's CPU per job by about
    a fifth (docs/performance.md). Reference counting frees what jobs leave as before; only
    reference cycles wait longer, up to ``threshold`` objects. ``pgq worker`` calls it unless
    started with ``--gc default``; call it yourself where a worker runs embedded, if the
    process is yours to tune.
    """
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
        raise ValueError(f"threshold must be a whole number >= 1, not {threshold!r}")
    gc.collect()
    gc.freeze()
    _, second, third = gc.get_threshold()
    gc.set_threshold(threshold, second, third)
    return gc.get_freeze_count()

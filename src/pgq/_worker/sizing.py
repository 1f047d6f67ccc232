"""Claim-ahead sizing: how many jobs a producer claims beyond its free slots, and how long a
job claimed ahead may wait for a slot, from the running times of its claims and its jobs."""

from __future__ import annotations

#: How much the running averages of claim time and job duration move with each sample.
EWMA = 0.1
#: Claim ahead enough jobs for this many claim round trips' worth of finishing jobs.
AHEAD_ROUND_TRIPS = 2.0
#: A job claimed ahead is handed back if no slot frees within this many average job
#: durations (at least MIN_PATIENCE_S): a worker must not sit on jobs another could run.
PATIENCE_JOBS = 4.0
MIN_PATIENCE_S = 0.25
#: The most jobs a producer claims ahead of its free slots, however short its jobs.
MAX_AHEAD = 500
#: ... and at most this many per slot: a worker killed outright takes its claimed jobs with
#: it until they are rescued, attempts spent, so what one worker holds stays bounded.
MAX_AHEAD_PER_SLOT = 4


class AheadSizing:
    """``ahead``: as many jobs as finish, on average, during two claim round trips (from
    running averages of both), at most four per slot and ``MAX_AHEAD`` in all, none when
    jobs take long; or ``claim_ahead`` of them, when that is 0 or more. A job that waited
    past its patience sets it to none until a job ends."""

    __slots__ = ("_claim_s", "_factor", "_fixed", "_job_s", "_most", "ahead")

    def __init__(self, concurrency: int, claim_ahead: int = -1) -> None:
        #: Jobs to claim ahead of free slots now.
        self.ahead = max(claim_ahead, 0)
        self._fixed = claim_ahead if claim_ahead >= 0 else None
        self._claim_s: float | None = None
        self._job_s: float | None = None
        # For job_took, once per job: ahead = _factor * claim time / job time (the jobs
        # that finish during AHEAD_ROUND_TRIPS claims), at most _most.
        self._factor = concurrency * AHEAD_ROUND_TRIPS
        self._most = min(MAX_AHEAD, MAX_AHEAD_PER_SLOT * concurrency)

    def claim_took(self, claim_s: float) -> None:
        """Fold a claim's round trip into its running average."""
        current = self._claim_s
        self._claim_s = claim_s if current is None else current + EWMA * (claim_s - current)

    def job_took(self, job_s: float) -> None:
        """Fold a job's duration into the running average, and size ``ahead`` from it."""
        # Once per job: the average and the limits inlined.
        average = self._job_s
        average = job_s if average is None else average + EWMA * (job_s - average)
        self._job_s = average
        if self._fixed is not None:
            self.ahead = self._fixed
            return
        claim_s = self._claim_s
        if claim_s is None:
            return
        finishing = round(self._factor * claim_s / (average if average > 1e-6 else 1e-6))
        self.ahead = finishing if finishing < self._most else self._most

    def patience(self) -> float | None:
        """How long a claimed job may wait for a slot before it is handed back: a few job
        durations as learnt (no limit while nothing is learnt)."""
        if self._job_s is None:
            return None
        return max(MIN_PATIENCE_S, PATIENCE_JOBS * self._job_s)

    def waited_too_long(self) -> None:
        """A job claimed ahead found no slot within its patience: the jobs ahead of it take
        longer than learnt. Claim none ahead until a job ends (so that it is not claimed
        straight back), and learn job durations afresh."""
        self.ahead, self._job_s = 0, None

"""Prometheus metrics (the ``metrics`` extra): a worker's job counters and histograms, its
liveness read from its stats at scrape time, and the queue gauges (of counts the database
layer reads).

Job metrics are fed by the worker's built-in event hooks: a decided outcome, the attempt's
duration, the pickup latency (scheduled -> started, both on the database clock). Liveness
(heartbeat failures, producer health, rejected outcomes) is read from ``Worker.stats()``
when scraped, so the hot path pays nothing for it.
"""

from __future__ import annotations

import functools
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

from pgq._core.hooks import EventName, Hook, JobEvent
from pgq.errors import ConfigError
from pgq.job import JobState

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric

#: Seconds: from a millisecond to an hour, for attempts; to a minute, for pickup.
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
                    120, 300, 600, 1800, 3600)  # fmt: skip
PICKUP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
                  60)  # fmt: skip
#: The ``outcome`` label of each state (a dict: an enum's ``.value`` is a Python-level
#: descriptor, read once per job).
_OUTCOME_LABELS: dict[JobState | None, str] = {None: "unknown", **{s: s.value for s in JobState}}
#: Name, help text and labels of the job series.
_JOBS = ("pgq_jobs", "Attempts by their outcome (the state the job went to)",
         ("queue", "task", "outcome"))  # fmt: skip
_DURATIONS = ("pgq_job_duration_seconds", "How long attempts ran", ("queue", "task"))
_PICKUPS = ("pgq_pickup_latency_seconds", "From a job's scheduled time to its attempt's start",
            ("queue",))  # fmt: skip
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _Observer(Protocol):
    def observe(self, value: float, /) -> None: ...


class _Incrementer(Protocol):
    def inc(self) -> None: ...


def available() -> bool:
    """Whether prometheus_client is installed."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return False
    return True


def require() -> None:
    """Raise a clear error when the extra is missing."""
    if not available():
        raise ConfigError("metrics need the metrics extra: pip install 'pgq-async[metrics]'")


class WorkerMetrics:
    """One worker's metrics, in ``registry`` (a private one by default: the worker serves it
    on its health port's ``/metrics``; pass your own to export through your app)."""

    def __init__(
        self, stats: Callable[[], dict[str, Any]], registry: CollectorRegistry | None = None
    ) -> None:
        require()
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        # Each job's series, found once per label set and kept.
        self._pickups: dict[str, _Observer]
        self._outcomes: dict[tuple[str, str, str], _Incrementer]
        self._durations: dict[tuple[str, str], _Observer]
        self._new_pickup: Callable[[str], _Observer]
        self._new_outcome: Callable[[tuple[str, str, str]], _Incrementer]
        self._new_duration: Callable[[tuple[str, str]], _Observer]
        if _multiprocess():
            # prometheus_client's multiprocess mode aggregates the values its own metrics
            # keep in files, and nothing else: use them, whatever they cost per job.
            jobs = Counter(*_JOBS, registry=r)
            durations = Histogram(*_DURATIONS, registry=r, buckets=DURATION_BUCKETS)
            pickups = Histogram(*_PICKUPS, registry=r, buckets=PICKUP_BUCKETS)
            self._new_outcome = lambda key: jobs.labels(*key)
            self._new_duration = lambda pair: durations.labels(*pair)
            self._new_pickup = pickups.labels
            self._pickups, self._outcomes, self._durations = {}, {}, {}
        else:
            # Counted in plain Python and turned into metric families when scraped: a
            # prometheus_client Counter or Histogram takes a lock per update, and a
            # histogram scans its buckets one by one, costs a busy worker pays per job.
            counted = _JobCollector()
            r.register(counted)
            self._new_outcome = lambda key: _Counter()
            self._new_duration = lambda pair: _Histogram(DURATION_BUCKETS)
            self._new_pickup = lambda queue: _Histogram(PICKUP_BUCKETS)
            # The collector reads the very dicts the hooks fill (its own, typed exactly).
            self._pickups, self._outcomes = counted.pickups, counted.outcomes  # type: ignore[assignment]
            self._durations = counted.durations  # type: ignore[assignment]
        self.rescued = Counter(
            "pgq_jobs_rescued", "Jobs this worker took back from a producer, by reason", ["reason"],
            registry=r,
        )  # fmt: skip
        r.register(_StatsCollector(stats))

    def hooks(self) -> dict[EventName, list[Hook]]:
        """The event hooks that feed the job metrics."""
        return {
            "job_started": [self._started],
            "job_finished": [self._finished],
            "job_rescued": [self._rescued],
        }

    def _started(self, event: JobEvent) -> None:
        job = event.job
        if job.scheduled_at is not None and job.attempted_at is not None:
            wait = (job.attempted_at - job.scheduled_at).total_seconds()
            pickup = self._pickups.get(job.queue)
            if pickup is None:
                pickup = self._pickups[job.queue] = self._new_pickup(job.queue)
            pickup.observe(wait if wait > 0.0 else 0.0)

    def _finished(self, event: JobEvent) -> None:
        job = event.job
        key = (job.queue, job.task, _OUTCOME_LABELS[event.state])
        outcomes = self._outcomes.get(key)
        if outcomes is None:
            outcomes = self._outcomes[key] = self._new_outcome(key)
        outcomes.inc()
        if event.duration_s is not None:
            duration = self._durations.get(key[:2])
            if duration is None:
                duration = self._durations[key[:2]] = self._new_duration(key[:2])
            duration.observe(event.duration_s)

    def _rescued(self, event: JobEvent) -> None:
        self.rescued.labels(event.reason or "unknown").inc()

    def render(self) -> bytes:
        """The registry in the Prometheus text format."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


class _Counter:
    """One counter series: its value, and when it was first counted."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0
        self.created = time.time()

    def inc(self) -> None:
        self.value += 1


class _Histogram:
    """One histogram series: a count per bucket (the last for values above every bound),
    the sum, and when it was first counted."""

    __slots__ = ("bounds", "counts", "created", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, value: float) -> None:
        # The first bound at or above the value: Prometheus' bucket "le" (less or equal).
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative counts by bound, as the exposition format has them."""
        counts = list(self.counts)  # one read, should a scrape run in another thread
        total, out = 0, []
        for le, count in zip(_le_labels(self.bounds), counts, strict=True):
            total += count
            out.append((le, float(total)))
        return out


@functools.cache
def _le_labels(bounds: tuple[float, ...]) -> tuple[str, ...]:
    """The ``le`` label of each bucket, "+Inf" last, spelt as prometheus_client spells it."""
    from prometheus_client.utils import floatToGoString

    spell = cast(Callable[[float], str], floatToGoString)
    return (*(spell(b) for b in bounds), "+Inf")


class _JobCollector:
    """The job counters and histograms, fed by the worker's hooks on its event loop and
    read when scraped: the same series, names and help texts as prometheus_client's own
    ``Counter`` and ``Histogram`` would export (a test holds them equal)."""

    def __init__(self) -> None:
        self.outcomes: dict[tuple[str, str, str], _Counter] = {}
        self.durations: dict[tuple[str, str], _Histogram] = {}
        self.pickups: dict[str, _Histogram] = {}

    def describe(self) -> Iterator[Metric]:
        """The families, without samples (the registry checks their names are free)."""
        return iter(self.families())

    def collect(self) -> Iterator[Metric]:
        jobs, durations, pickups = self.families()
        created = _created_wanted()
        # copy(): one read of each dict, should a scrape run in another thread.
        for key, counter in self.outcomes.copy().items():
            jobs.add_metric(key, counter.value, created=counter.created if created else None)
        for pair, histogram in self.durations.copy().items():
            _add_histogram(durations, _DURATIONS[2], pair, histogram, created)
        for queue, histogram in self.pickups.copy().items():
            _add_histogram(pickups, _PICKUPS[2], (queue,), histogram, created)
        return iter((jobs, durations, pickups))

    @staticmethod
    def families() -> tuple[CounterMetricFamily, HistogramMetricFamily, HistogramMetricFamily]:
        """The three families, without samples."""
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        return (
            CounterMetricFamily(_JOBS[0], _JOBS[1], labels=_JOBS[2]),
            HistogramMetricFamily(_DURATIONS[0], _DURATIONS[1], labels=_DURATIONS[2]),
            HistogramMetricFamily(_PICKUPS[0], _PICKUPS[1], labels=_PICKUPS[2]),
        )


def _add_histogram(
    family: HistogramMetricFamily,
    names: tuple[str, ...],
    labels: tuple[str, ...],
    histogram: _Histogram,
    created: bool,
) -> None:
    """One series into ``family``, with the ``_created`` sample prometheus_client's own
    ``Histogram`` exports beside it (unless its created series are turned off)."""
    from prometheus_client.samples import Sample

    family.add_metric(labels, histogram.buckets(), histogram.sum)
    if created:
        label_set = dict(zip(names, labels, strict=True))
        family.samples.append(Sample(family.name + "_created", label_set, histogram.created, None))


def _created_wanted() -> bool:
    """Whether ``_created`` series are exported: prometheus_client's own switch
    (``PROMETHEUS_DISABLE_CREATED_SERIES``, ``disable_created_metrics()``), which its metrics
    read when collected."""
    from prometheus_client import metrics

    return bool(getattr(metrics, "_use_created", True))


def _multiprocess() -> bool:
    """Whether prometheus_client runs in its multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``
    set when it was imported): its metrics then keep their values in files."""
    from prometheus_client import values

    return values.ValueClass is not values.MutexValue


class _StatsCollector:
    """The worker's liveness, read from its stats when scraped."""

    def __init__(self, stats: Callable[[], dict[str, Any]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s = self._stats()
        producers = s["producers"]
        yield CounterMetricFamily(
            "pgq_heartbeat_failures", "Heartbeats that did not land",
            value=s["heartbeat_failures"],
        )  # fmt: skip
        yield CounterMetricFamily(
            "pgq_outcomes_rejected",
            "Outcomes refused by their fencing token (the job was rescued meanwhile)",
            value=sum(p["rejected_outcomes"] for p in producers),
        )
        resources = CounterMetricFamily(
            "pgq_resource_failures",
            "Attempts that failed for want of memory, file descriptors or disk",
            labels=["queue", "task"],
        )
        for p in producers:
            for task, n in sorted(p["resource_failures"].items()):
                resources.add_metric([p["queue"], task], n)
        yield resources
        healthy = GaugeMetricFamily(
            "pgq_producer_healthy", "1 while the producer claims, 0 while fenced", labels=["queue"]
        )
        running = GaugeMetricFamily("pgq_producer_running", "Jobs running", labels=["queue"])
        slots = GaugeMetricFamily("pgq_producer_slots", "Concurrency", labels=["queue"])
        for p in producers:
            healthy.add_metric([p["queue"]], 1.0 if p["healthy"] else 0.0)
            running.add_metric([p["queue"]], p["running"])
            slots.add_metric([p["queue"]], p["concurrency"])
        yield from (healthy, running, slots)
        yield GaugeMetricFamily(
            "pgq_worker_leader", "1 while this worker leads", value=1.0 if s["leader"] else 0.0
        )
        yield CounterMetricFamily(
            "pgq_outcomes_salvaged", "Outcomes written in a fallback form",
            value=s["outcomes_salvaged"],
        )  # fmt: skip
        yield GaugeMetricFamily(
            "pgq_outcomes_pending", "Outcomes not yet durable", value=s["outcomes_pending"]
        )
        unrunnable = GaugeMetricFamily(
            "pgq_unrunnable_jobs",
            "Jobs waiting whose task no live worker of their queue serves (the leader's count)",
            labels=["queue", "task"],
        )
        for u in s.get("unrunnable", []):
            unrunnable.add_metric([u["queue"], u["task"]], u["count"])
        yield unrunnable


class QueueCounts(Protocol):
    """Jobs by queue and state, as the database counted them (``pgq._db.inspect``)."""

    @property
    def by_queue(self) -> Mapping[str, Mapping[JobState, int]]: ...

    @property
    def exact(self) -> bool: ...


def queue_families(counts: QueueCounts, oldest: Mapping[str, float]) -> list[Metric]:
    """The queue gauges of ``counts`` and ``oldest`` (``pgq._db.inspect.queue_gauges`` reads
    them): jobs by queue and state, and the age of each queue's oldest available job. When
    the count of finished jobs was cut short (not ``exact``), only the unfinished states
    are exported."""
    require()
    from prometheus_client.core import GaugeMetricFamily

    jobs = GaugeMetricFamily("pgq_queue_jobs", "Jobs by queue and state", labels=["queue", "state"])
    for queue, by_state in sorted(counts.by_queue.items()):
        for state in JobState:
            if counts.exact or not state.is_final:
                jobs.add_metric([queue, state.value], by_state[state])
    age = GaugeMetricFamily(
        "pgq_queue_oldest_available_seconds",
        "Age of the oldest available job (0: none waiting)",
        labels=["queue"],
    )
    for queue in sorted(counts.by_queue):
        age.add_metric([queue], max(oldest.get(queue, 0.0), 0.0))
    return [jobs, age]


def render_families(families: Iterable[Metric]) -> bytes:
    """Metric families in the Prometheus text format."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    fixed = list(families)

    class _Fixed:
        def collect(self) -> Iterator[Metric]:
            return iter(fixed)

    registry.register(_Fixed())
    return generate_latest(registry)

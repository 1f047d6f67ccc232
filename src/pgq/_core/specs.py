"""From :class:`~pgq.JobSpec` to a checked, serialized row: every check an enqueue makes
before anything is written."""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pgq._core import serde
from pgq._core.names import check_queue_name, check_task_name
from pgq.app import INT4_MAX, INT4_MIN, App, JobSpec, Task
from pgq.errors import ConfigError, SerializationError
from pgq.job import DEFAULT_QUEUE, MAX_SECONDS, Job, JobState, unique_mask

#: States a unique key is taken in unless a spec says otherwise: until the job is final.
DEFAULT_UNIQUE_STATES = tuple(s for s in JobState if not s.is_final)

# The latest time both Python and PostgreSQL can hold (PostgreSQL goes on to 294276 AD; a
# row past Python's year 9999 could be written but not read back). A day is kept in hand
# for the distance between this machine's clock and the database's.
_LATEST = datetime.max.replace(tzinfo=UTC) - timedelta(days=1)


@dataclass(slots=True)
class NewJob:
    """One job to enqueue, checked and serialized: what every enqueue path writes."""

    queue: str
    task: str
    args: dict[str, Any]
    args_json: str
    priority: int
    max_attempts: int | None
    run_at: datetime | None
    delay_s: float | None
    tags: list[str]
    metadata: dict[str, Any]
    metadata_json: str
    unique_key: str | None
    unique_states: int | None
    limit_key: str | None = None
    #: The parents' ids (distinct, in the order given), None without dependencies.
    depends_on: tuple[int, ...] | None = None
    on_parent_failure: str = "cancel"

    def values(self) -> tuple[Any, ...]:
        """The parameters of one row of the enqueue statements (tags as JSON text: SQL
        arrays of arrays cannot be ragged)."""
        return (
            self.queue,
            self.task,
            self.args_json,
            self.priority,
            self.max_attempts,
            self.run_at,
            self.delay_s,
            serde.dumps(self.tags, "tags") if self.tags else "[]",
            self.metadata_json,
            self.unique_key,
            self.unique_states,
            self.limit_key,
        )


def prepare(index: int, spec: JobSpec[Any], app: App | None) -> NewJob:
    """Check and serialize ``spec`` (the ``index``-th of a batch, for error messages).

    Runs once per job of a batch: the common case (a registered task, no options) takes the
    fewest steps; every check still runs."""
    if not isinstance(spec, JobSpec):
        raise ConfigError(
            f"{_where(index)}expected a JobSpec (task.spec(...) or pgq.JobSpec(name, args)), "
            f"not {type(spec).__name__}; nothing was enqueued"
        )
    task = spec.task
    if type(task) is Task:
        if _sets_no_option(spec, task):
            return _prepare_plain(index, spec.args, task)
        defaults: Task | None = task
        name = task.name
    else:
        name = check_task_name(task)
        defaults = app.get(name) if app is not None else None
    if spec.queue is not None:
        queue = check_queue_name(spec.queue)
    else:
        queue = defaults.queue if defaults else DEFAULT_QUEUE
    priority = spec.priority
    if priority is None:
        priority = defaults.priority if defaults else 0
    else:
        _check_int(index, "priority", priority, INT4_MIN)
    max_attempts = spec.max_attempts
    if max_attempts is None and defaults:
        max_attempts = defaults.max_attempts
    if max_attempts is not None:
        _check_int(index, "max_attempts", max_attempts, 1)
    args = _args(index, spec.args)
    if defaults is not None:
        problem = defaults.argument_problem(args)
        if problem is not None:
            raise ConfigError(f"{_where(index)}{problem}; nothing was enqueued")
    delay_s: float | None = None
    if spec.delay is not None:
        if spec.run_at is not None:
            raise ConfigError(f"{_where(index)}give delay or run_at, not both")
        delay_s = _delay_seconds(spec.delay, name, index)
    elif spec.run_at is not None:
        _check_run_at(spec.run_at, name, index)
    tags = _tags(index, spec.tags) if spec.tags else []
    metadata, metadata_json = _metadata(index, spec.metadata)
    args_json = _json(index, args, "args")  # checked before a unique key is derived from it
    key, states = _unique(index, spec, name, queue, args)
    row = NewJob(
        queue, name, args, args_json, priority, max_attempts, spec.run_at,
        delay_s, tags, metadata, metadata_json, key, states,
    )  # fmt: skip
    if spec.limit_key is not None or (defaults is not None and defaults.limit_key_arg):
        row.limit_key = _limit_key(index, spec, defaults, args)
    if spec.depends_on is not None or spec.on_parent_failure is not None:
        row.depends_on, row.on_parent_failure = _dependencies(index, spec)
    return row


def _json(index: int, value: dict[str, Any], what: str) -> str:
    """The JSON text of a spec's ``what`` (args, metadata); an error names the spec's place
    in its batch."""
    try:
        return serde.dumps(value, what)
    except SerializationError as exc:
        if not index:
            raise
        raise SerializationError(f"{_where(index)}{exc}", exc.path) from exc.__cause__


def _metadata(index: int, given: Mapping[str, Any] | None) -> tuple[dict[str, Any], str]:
    """The job's metadata, checked, and its JSON text."""
    if given is not None and not isinstance(given, Mapping):
        raise ConfigError(
            f"{_where(index)}metadata must be a mapping (a dict), not "
            f"{type(given).__name__}; nothing was enqueued"
        )
    if not given:
        return {}, "{}"
    metadata = dict(given)
    return metadata, _json(index, metadata, "metadata")


def _sets_no_option(spec: JobSpec[Any], task: Task) -> bool:
    """Whether ``spec`` leaves every option to its task's defaults."""
    return (
        spec.queue is None
        and spec.priority is None
        and spec.max_attempts is None
        and spec.delay is None
        and spec.run_at is None
        and not spec.tags
        and not spec.metadata
        and spec.unique_key is None
        and not spec.unique
        and spec.unique_states is None
        and spec.limit_key is None
        and spec.depends_on is None
        and spec.on_parent_failure is None
        and task.limit_key_arg is None
    )


def _prepare_plain(index: int, args: Mapping[str, Any], task: Task) -> NewJob:
    """:func:`prepare` of a spec that sets no option: the task's defaults, checked as a
    spec's would be."""
    max_attempts = task.max_attempts
    _check_int(index, "max_attempts", max_attempts, 1)
    args = _args(index, args)
    problem = task.argument_problem(args)
    if problem is not None:
        raise ConfigError(f"{_where(index)}{problem}; nothing was enqueued")
    return NewJob(
        task.queue, task.name, args, _json(index, args, "args"), task.priority, max_attempts,
        None, None, [], {}, "{}", None, None,
    )  # fmt: skip


#: The longest limit key, in UTF-8 bytes (it is part of an index entry, which PostgreSQL
#: caps near 2.7 kB: 1,000 characters of CJK text did not fit).
MAX_LIMIT_KEY_BYTES = 1024
#: What PostgreSQL's text cannot hold (NUL), and what is no UTF-8 (a lone surrogate).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
#: The most tags a job may have, and the longest tag, in characters: a page lists them all.
MAX_TAGS = 32
MAX_TAG_CHARS = 128
#: The longest unique key, in UTF-8 bytes: it is an index entry, which PostgreSQL caps near
#: 2.7 kB *after* compression, so a bound on the raw bytes is the one that always holds.
MAX_UNIQUE_KEY_BYTES = 1024


def _tags(index: int, given: object) -> list[str]:
    if isinstance(given, str | bytes) or not isinstance(given, Sequence | set | frozenset):
        raise ConfigError(f"{_where(index)}tags must be a list of strings, not {given!r:.80}")
    tags = list(given)
    if len(tags) > MAX_TAGS:
        raise ConfigError(
            f"{_where(index)}tags: at most {MAX_TAGS} tags a job, got {len(tags):,}; nothing "
            "was enqueued (put longer lists in metadata)"
        )
    for tag in tags:
        if not isinstance(tag, str) or not 0 < len(tag) <= MAX_TAG_CHARS or _UNSTORABLE.search(tag):
            shown = f"{tag!r:.60}" + ("…" if isinstance(tag, str) and len(tag) > 50 else "")
            raise ConfigError(
                f"{_where(index)}tags: each tag must be a string of 1 to {MAX_TAG_CHARS} "
                f"characters without NUL or lone surrogate, not {shown}"
                + (f" ({len(tag):,} characters)" if isinstance(tag, str) else "")
                + "; nothing was enqueued"
            )
    return tags


def _limit_key(
    index: int, spec: JobSpec[Any], defaults: Task | None, args: dict[str, Any]
) -> str | None:
    key: object = spec.limit_key
    if key is None and defaults is not None and defaults.limit_key_arg is not None:
        value = args.get(defaults.limit_key_arg)
        # A string stays itself; another value is its JSON text (42 and "42" are one key).
        key = value if value is None or isinstance(value, str) else serde.dumps(value, "args")
    if key is None:
        return None
    if not isinstance(key, str):
        raise ConfigError(f"{_where(index)}limit_key must be a string, got {key!r}")
    # 256 characters are at most 1,024 bytes: a shorter key needs no encoding to measure.
    if _UNSTORABLE.search(key) or (
        len(key) > 256 and len(key.encode("utf-8", "surrogatepass")) > MAX_LIMIT_KEY_BYTES
    ):
        size = len(key.encode("utf-8", "surrogatepass"))
        raise ConfigError(
            f"{_where(index)}limit_key must be at most {MAX_LIMIT_KEY_BYTES:,} bytes of UTF-8 "
            f"without NUL or lone surrogate (got {size:,} bytes); nothing was enqueued"
        )
    return key


def _dependencies(index: int, spec: JobSpec[Any]) -> tuple[tuple[int, ...] | None, str]:
    mode = spec.on_parent_failure or "cancel"
    if mode not in ("cancel", "run"):
        raise ConfigError(
            f"{_where(index)}on_parent_failure must be 'cancel' or 'run', got {mode!r}"
        )
    if spec.depends_on is None:
        return None, mode
    if isinstance(spec.depends_on, (str, bytes, Job, int)):
        raise ConfigError(f"{_where(index)}depends_on takes a list of jobs or job ids")
    ids: dict[int, None] = {}
    for parent in spec.depends_on:
        parent_id = parent.id if isinstance(parent, Job) else parent
        if type(parent_id) is not int or not 1 <= parent_id < 2**63:
            raise ConfigError(f"{_where(index)}depends_on takes jobs or job ids, got {parent!r}")
        ids[parent_id] = None
    if not ids:
        return None, mode
    return tuple(ids), mode


def _check_int(index: int, option: str, value: object, low: int) -> None:
    if type(value) is not int or not low <= value <= INT4_MAX:
        raise ConfigError(
            f"{_where(index)}{option} must be an integer from {low} to {INT4_MAX}, got {value!r}"
        )


def _args(index: int, args: Mapping[str, Any]) -> dict[str, Any]:
    if type(args) is not dict:
        if not isinstance(args, Mapping):
            raise SerializationError(
                f"{_where(index)}args must be a mapping of keyword arguments, not "
                f"{type(args).__name__}",
                "args",
            )
        args = dict(args)
    for key in args:
        if type(key) is not str and not isinstance(key, str):
            raise SerializationError(f"{_where(index)}args keys must be strings", "args")
    return args


def _unique(
    index: int, spec: JobSpec[Any], name: str, queue: str, args: dict[str, Any]
) -> tuple[str | None, int | None]:
    key = spec.unique_key
    if spec.unique_period is not None and not spec.unique:
        raise ConfigError(
            f"{_where(index)}unique_period applies to unique=True (the key derived from "
            "task, queue and args per period); give unique=True too, or leave it out; "
            "nothing was enqueued"
        )
    if key is None and spec.unique:
        canonical = json.dumps(args, sort_keys=True, separators=(",", ":"))
        period_s = None if spec.unique_period is None else _period_seconds(index, spec)
        key = derive_unique_key(name, queue, canonical, period_s)
    elif key is not None and not isinstance(key, str):
        raise ConfigError(f"{_where(index)}unique_key must be a string")
    # 256 characters are at most 1,024 bytes: a shorter key needs no encoding to measure.
    elif key is not None and (not key or _UNSTORABLE.search(key) or len(key) > 256):
        size = len(key.encode("utf-8", "surrogatepass"))
        if size > MAX_UNIQUE_KEY_BYTES or not key or _UNSTORABLE.search(key):
            raise ConfigError(
                f"{_where(index)}unique_key must be 1 to {MAX_UNIQUE_KEY_BYTES:,} bytes of "
                f"UTF-8 without NUL or lone surrogate, got {size:,} bytes; nothing was "
                "enqueued (for a longer identity, pass a digest of it, or unique=True, which "
                "derives one from task, queue and args)"
            )
    if key is None:
        if spec.unique_states is not None:
            raise ConfigError(
                f"{_where(index)}unique_states applies to unique jobs: give unique_key= or "
                "unique=True as well, or leave unique_states out; nothing was enqueued"
            )
        return None, None
    if spec.unique_states is None:
        return key, unique_mask(DEFAULT_UNIQUE_STATES)
    try:
        return key, unique_mask(spec.unique_states)
    except ConfigError as e:
        raise ConfigError(f"{_where(index)}{e}; nothing was enqueued") from None


def derive_unique_key(
    task: str, queue: str, args_json: str, period_s: float | None, now: float | None = None
) -> str:
    """A key from what makes two jobs the same: task, queue and args (and the time bucket
    of ``period_s`` seconds, on this machine's clock, when given)."""
    digest = hashlib.sha256(f"{task}\0{queue}\0{args_json}".encode()).hexdigest()[:40]
    if period_s is None:
        return f"pgq:{task}:{digest}"
    bucket = int((time.time() if now is None else now) // period_s)
    return f"pgq:{task}:{digest}:{period_s:g}:{bucket}"


#: The shortest unique period, in seconds: a shorter one makes buckets too many to count.
MIN_UNIQUE_PERIOD_S = 0.001


def _period_seconds(index: int, spec: JobSpec[Any]) -> float:
    """``spec.unique_period`` as seconds, checked: a finite number in range."""
    period = spec.unique_period
    seconds: float | None = None
    if isinstance(period, timedelta):
        seconds = period.total_seconds()
    elif isinstance(period, int | float) and not isinstance(period, bool):
        seconds = float(period)
    if seconds is None or not MIN_UNIQUE_PERIOD_S <= seconds <= MAX_SECONDS:  # NaN fails too
        raise ConfigError(
            f"{_where(index)}unique_period must be a number of seconds (or a timedelta) from "
            f"{MIN_UNIQUE_PERIOD_S:g} to {MAX_SECONDS:g}, got {period!r:.40}; nothing was "
            "enqueued (for a key that lasts as long as its job, leave unique_period out)"
        )
    return seconds


def _delay_seconds(delay: float | timedelta, task: str, index: int) -> float:
    """``delay`` as seconds from now, checked: a negative delay means now."""
    try:
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
    except (TypeError, ValueError):
        raise ConfigError(
            f"{_where(index)}delay for task {task!r} must be a number of seconds or a "
            f"timedelta, got {delay!r}"
        ) from None
    if not math.isfinite(seconds) or seconds > (_LATEST - datetime.now(UTC)).total_seconds():
        raise ConfigError(
            f"{_where(index)}delay={delay!r} for task {task!r} is out of range: the job "
            f"must be due before {_LATEST:%Y-%m-%d}; nothing was enqueued"
        )
    return max(seconds, 0.0)


def _check_run_at(run_at: datetime, task: str, index: int) -> None:
    if not isinstance(run_at, datetime):
        raise ConfigError(
            f"{_where(index)}run_at for task {task!r} must be a datetime, got {run_at!r}"
        )
    if run_at.tzinfo is None:
        raise ConfigError(
            f"{_where(index)}run_at for task {task!r} must be timezone-aware "
            "(e.g. datetime.now(UTC))"
        )
    try:
        in_range = run_at.astimezone(UTC) <= _LATEST
    except OverflowError:
        in_range = False
    if not in_range:
        raise ConfigError(
            f"{_where(index)}run_at={run_at.isoformat()} for task {task!r} is out of range: "
            f"the job must be due before {_LATEST:%Y-%m-%d}; nothing was enqueued"
        )


def _where(index: int) -> str:
    """How an error names the spec at ``index`` of a batch (the first needs no name)."""
    return f"job {index}: " if index else ""

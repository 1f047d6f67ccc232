"""Worker settings: one table of names, defaults and environment variables.

Each setting is a keyword of :class:`pgq.Worker`, a ``pgq worker`` flag of the same name
(``--stale-after 30``) and an environment variable (``PGQ_STALE_AFTER=30``). Precedence:
keyword or flag > environment variable > default. Durations are seconds.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypedDict

from pgq.errors import ConfigError


def _setting(
    default: Any, help: str, *, minimum: float | None = 0.001, optional: bool = False
) -> Any:
    return field(default=default, metadata={"help": help, "minimum": minimum, "optional": optional})


#: The largest value of any setting (seconds, or a count): beyond it durations leave the
#: database's dates and counts its integer columns, and infinity is refused with it (but
#: for ``shutdown_timeout``, where it means: let running jobs finish, however long).
MAX_SETTING = 1e9


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """Every tunable of a worker, in seconds where it is a duration."""

    concurrency: int = _setting(
        10, "jobs run at once per queue, unless --queue NAME:N says", minimum=1
    )
    poll_interval: float = _setting(1.0, "seconds between fetches when no notification arrives")
    poll_only: bool = _setting(
        False,
        "never LISTEN; poll only (where LISTEN cannot work, e.g. behind PgBouncer in transaction mode)",
        minimum=None,
    )
    claim_ahead: int = _setting(
        -1,
        "jobs claimed ahead of free slots per queue, to start as slots free: -1 sizes it "
        "from the claim's and the jobs' running times, 0 never claims ahead",
        minimum=-1,
    )
    shutdown_timeout: float = _setting(
        30.0, "seconds running jobs get to finish on a graceful stop"
    )
    max_threads: int = _setting(16, "worker threads for plain `def` tasks", minimum=1)
    schedule_interval: float = _setting(
        1.0, "seconds between promotions of due scheduled/retryable jobs"
    )
    heartbeat_interval: float = _setting(5.0, "seconds between producer heartbeats")
    heartbeat_timeout: float = _setting(
        2.0,
        "seconds one heartbeat may take before it counts as failed (a new connection first "
        "gets as long per host of the DSN)",
    )
    max_heartbeat_failures: int = _setting(
        3, "consecutive failed heartbeats that make a producer stop claiming", minimum=1
    )
    stale_after: float = _setting(
        30.0, "seconds without a heartbeat after which peers rescue a producer's jobs"
    )
    rescue_interval: float = _setting(5.0, "seconds between the leader's rescue rounds")
    rescue_grace: float = _setting(
        10.0, "seconds past a job's own timeout before it counts as hung"
    )
    leader_ttl: float = _setting(15.0, "seconds a leader's lease lasts without renewal")
    retention_completed: float | None = _setting(
        86400.0, "seconds completed jobs are kept (none: forever)", optional=True
    )
    retention_cancelled: float | None = _setting(
        604800.0, "seconds cancelled jobs are kept (none: forever)", optional=True
    )
    retention_discarded: float | None = _setting(
        604800.0, "seconds discarded jobs are kept (none: forever)", optional=True
    )
    retention_interval: float = _setting(60.0, "seconds between the leader's retention rounds")
    reap_after: float = _setting(
        300.0, "seconds without a heartbeat after which a producer row is deleted"
    )
    log_jobs: bool = _setting(
        False, "log every job's outcome at INFO, successes too (failures are always logged)",
        minimum=None,
    )  # fmt: skip
    metrics: bool = _setting(
        True, "Prometheus metrics at /metrics on the health port (needs the metrics extra)",
        minimum=None,
    )  # fmt: skip
    queue_metrics: bool = _setting(
        False, "also export the queue gauges from this worker (one worker, or the dashboard)",
        minimum=None,
    )  # fmt: skip
    async_commit: bool = _setting(
        False,
        "commit claims and outcomes without waiting for the disk (synchronous_commit off for "
        "those transactions): a database crash may lose the last moments of them, and their "
        "jobs run again; enqueues and heartbeats still wait (docs/liveness.md)",
        minimum=None,
    )
    tracing: bool = _setting(
        False, "OpenTelemetry spans per attempt, continuing the enqueue's trace (otel extra)",
        minimum=None,
    )  # fmt: skip

    def __post_init__(self) -> None:
        for f in fields(self):
            value, minimum = getattr(self, f.name), f.metadata["minimum"]
            if value is None and f.metadata["optional"]:
                continue
            if minimum is None:
                if not isinstance(value, bool):
                    raise ConfigError(f"{f.name} must be true or false, got {value!r}")
            elif (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or (
                    not minimum <= value <= MAX_SETTING
                    and not (f.name == "shutdown_timeout" and value == math.inf)
                )
            ):
                raise ConfigError(
                    f"{f.name} must be a number from {minimum:g} to {MAX_SETTING:g}, got {value!r}"
                )
            elif isinstance(f.default, int) and not isinstance(value, int):
                raise ConfigError(f"{f.name} must be a whole number, got {value!r}")
        self._check_liveness()

    @property
    def fencing_bound(self) -> float:
        """Seconds after its last successful heartbeat was sent by which a producer has
        certainly stopped claiming: its own clock fences it then, however long its beats
        take (a connect may try every host of the DSN); failing beats that each end within
        ``heartbeat_timeout`` fence it no later by their count (docs/liveness.md)."""
        return self.heartbeat_interval * self.max_heartbeat_failures + self.heartbeat_timeout

    def _check_liveness(self) -> None:
        # The invariant of the liveness protocol: a producer whose heartbeats fail fences
        # itself (stops claiming) strictly before any peer may judge it stale.
        fenced_by = self.fencing_bound
        if not fenced_by < self.stale_after:
            raise ConfigError(
                "unsafe liveness settings: a producer whose heartbeats fail fences itself "
                f"after heartbeat_interval ({self.heartbeat_interval:g}s) x "
                f"max_heartbeat_failures ({self.max_heartbeat_failures}) + heartbeat_timeout "
                f"({self.heartbeat_timeout:g}s) = {fenced_by:g}s, which must be less than "
                f"stale_after ({self.stale_after:g}s), or peers could rescue jobs it still "
                "runs; raise stale_after or lower the others"
            )
        if self.heartbeat_timeout > self.heartbeat_interval:
            raise ConfigError(
                f"heartbeat_timeout ({self.heartbeat_timeout:g}s) must not exceed "
                f"heartbeat_interval ({self.heartbeat_interval:g}s)"
            )
        if self.reap_after <= self.stale_after:
            raise ConfigError(
                f"reap_after ({self.reap_after:g}s) must exceed stale_after "
                f"({self.stale_after:g}s): a producer row is deleted only after its jobs "
                "were rescued"
            )

    @classmethod
    def resolve(
        cls,
        overrides: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
        *,
        base: WorkerSettings | None = None,
    ) -> WorkerSettings:
        """Settings from ``overrides`` (None values ignored), then ``base`` (every field of
        it), else ``PGQ_*`` variables and defaults."""
        environ = os.environ if environ is None else environ
        optional = {f.name for f in fields(cls) if f.metadata["optional"]}
        # None means "not given", except for optional settings, where it means "never".
        overrides = {k: v for k, v in (overrides or {}).items() if v is not None or k in optional}
        unknown = set(overrides) - {f.name for f in fields(cls)}
        if unknown:
            raise ConfigError(f"unknown worker setting(s): {', '.join(sorted(unknown))}")
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in overrides:
                values[f.name] = overrides[f.name]
            elif base is not None:
                values[f.name] = getattr(base, f.name)
            elif (var := env_name(f.name)) in environ:
                values[f.name] = _parse(var, environ[var], f.default, f.metadata["optional"])
        return cls(**values)

    @classmethod
    def from_env(cls, name: str, environ: Mapping[str, str] | None = None) -> Any:
        """One setting as ``PGQ_<NAME>`` gives it, else its default, without checking the
        other settings (a bad unrelated variable must not break a command that needs one)."""
        environ = os.environ if environ is None else environ
        f = next((f for f in fields(cls) if f.name == name), None)
        if f is None:
            raise ConfigError(f"unknown worker setting {name!r}")
        var = env_name(name)
        if var in environ:
            return _parse(var, environ[var], f.default, f.metadata["optional"])
        return f.default


class WorkerOverrides(TypedDict, total=False):
    """The keywords of :class:`pgq.Worker` that override a setting: one per field of
    :class:`WorkerSettings`, of the field's type; a keyword left out falls back to
    ``settings=``, then its ``PGQ_*`` variable, then its default. (A test holds these and
    the fields equal, name for name and type for type.)"""

    concurrency: int
    poll_interval: float
    poll_only: bool
    claim_ahead: int
    shutdown_timeout: float
    max_threads: int
    schedule_interval: float
    heartbeat_interval: float
    heartbeat_timeout: float
    max_heartbeat_failures: int
    stale_after: float
    rescue_interval: float
    rescue_grace: float
    leader_ttl: float
    retention_completed: float | None
    retention_cancelled: float | None
    retention_discarded: float | None
    retention_interval: float
    reap_after: float
    log_jobs: bool
    metrics: bool
    queue_metrics: bool
    async_commit: bool
    tracing: bool


def env_name(setting: str) -> str:
    """``stale_after`` -> ``PGQ_STALE_AFTER``."""
    return "PGQ_" + setting.upper()


def _parse(var: str, raw: str, default: Any, optional: bool = False) -> Any:
    if optional and raw.strip().lower() in ("", "none", "forever", "never"):
        return None
    try:
        if isinstance(default, bool):
            if raw.strip().lower() in ("1", "true", "yes", "on"):
                return True
            if raw.strip().lower() in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(raw)
        if isinstance(default, int):
            return int(raw)
        return float(raw)
    except ValueError:
        kind = "true or false" if isinstance(default, bool) else type(default).__name__
        raise ConfigError(f"{var}={raw!r} is not a valid {kind}") from None


def setting_help() -> dict[str, tuple[Any, str]]:
    """Name -> (default, help) for every setting, for the CLI and the docs."""
    return {f.name: (f.default, f.metadata["help"]) for f in fields(WorkerSettings)}


def optional_setting(name: str) -> bool:
    """Whether ``name`` accepts None ("none" on the command line: keep forever)."""
    return bool(next(f for f in fields(WorkerSettings) if f.name == name).metadata["optional"])


FOREVER = float("inf")


def parse_optional_seconds(raw: str) -> float:
    """A CLI value for an optional duration: seconds, or none/forever (as ``FOREVER``)."""
    value = _parse("value", raw, 0.0, optional=True)
    return FOREVER if value is None else float(value)

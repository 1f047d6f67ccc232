"""What the dashboard reads from a request: the job filter of a listing, and form bodies."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlencode

from starlette.datastructures import QueryParams
from starlette.requests import Request

from pgq._core import serde
from pgq._core.names import check_queue_name, check_task_name
from pgq._db.inspect import JobFilter
from pgq.dashboard._security import MAX_BODY_BYTES
from pgq.errors import ConfigError, SerializationError
from pgq.job import MAX_JOB_ID, JobState

#: A form body larger than this is refused (the dashboard's forms are a few fields); the
#: guard stops reading at this size, so no larger body is ever held.
MAX_FORM_BYTES = MAX_BODY_BYTES
_STATE_NAMES = [s.value for s in JobState]


@dataclass(slots=True)
class Filters:
    """The job filter as the form shows it (text as typed) and as a query (checked)."""

    states: list[str] = field(default_factory=list)
    queue: str = ""
    task: str = ""
    tag: str = ""
    job_id: str = ""
    args: str = ""
    errors: list[str] = field(default_factory=list)

    @classmethod
    def from_params(cls, params: QueryParams | dict[str, list[str]]) -> Filters:
        """Read ``state`` (repeatable), ``queue``, ``task``, ``tag``, ``id`` and ``args``."""

        def one(name: str) -> str:
            values = params.getlist(name) if isinstance(params, QueryParams) else params.get(name)
            return (values or [""])[-1].strip()

        states = params.getlist("state") if isinstance(params, QueryParams) else params.get(
            "state", []
        )  # fmt: skip
        return cls(
            states=[s for s in states if s],
            queue=one("queue"),
            task=one("task"),
            tag=one("tag"),
            job_id=one("id"),
            args=one("args"),
        )

    def job_filter(self) -> JobFilter | None:
        """The checked filter, or None with :attr:`errors` saying what to fix."""
        self.errors = []
        unknown = [s for s in self.states if s not in _STATE_NAMES]
        if unknown:
            self.errors.append(
                f"unknown state {', '.join(unknown)}: choose from {', '.join(_STATE_NAMES)}"
            )
        job_id = None
        if self.job_id:
            try:
                job_id = int(self.job_id)
            except ValueError:
                job_id = None
            if job_id is None or not 1 <= job_id <= MAX_JOB_ID:
                self.errors.append(
                    f"id must be a whole number from 1 to {MAX_JOB_ID}, not {self.job_id!r}"
                )
        for name, value, check in (
            ("queue", self.queue, check_queue_name), ("task", self.task, check_task_name),
        ):  # fmt: skip
            if value:
                try:
                    check(value)
                except ConfigError as exc:
                    self.errors.append(f"{name}: {exc}")
        if "\x00" in self.tag:
            self.errors.append("tag cannot hold a NUL character (%00): no tag has one")
        args = None
        if self.args:
            args = self._args_object()
        if self.errors:
            return None
        return JobFilter(
            states=tuple(JobState(s) for s in self.states) or None,
            queue=self.queue or None,
            task=self.task or None,
            tag=self.tag or None,
            args=args,
            job_id=job_id,
        )

    def _args_object(self) -> str | None:
        try:
            value = json.loads(self.args, parse_constant=_no_constant)
        except json.JSONDecodeError as exc:
            self.errors.append(f'args must be JSON ({exc.msg}), like {{"user_id": 7}}')
            return None
        except ValueError as exc:  # NaN, Infinity
            self.errors.append(f"args must be JSON as PostgreSQL stores it: {exc}")
            return None
        except RecursionError:
            self.errors.append(
                'args nest too deeply: give the few keys to match, like {"user_id": 7}'
            )
            return None
        if not isinstance(value, dict):
            self.errors.append('args must be a JSON object, like {"user_id": 7}')
            return None
        try:
            # The checks of an enqueue: what jsonb refuses (NUL, lone surrogates) is named.
            return serde.dumps(value, "args")
        except SerializationError as exc:
            self.errors.append(str(exc))
            return None

    def pairs(self) -> list[tuple[str, str]]:
        """The filter as query pairs (empty fields left out)."""
        out = [("state", s) for s in self.states]
        for name, value in (
            ("queue", self.queue), ("task", self.task), ("tag", self.tag),
            ("id", self.job_id), ("args", self.args),
        ):  # fmt: skip
            if value:
                out.append((name, value))
        return out

    def query(self, **extra: str | int | None) -> str:
        """The filter as a query string, with ``extra`` pairs (None ones left out)."""
        pairs = self.pairs() + [(k, str(v)) for k, v in extra.items() if v is not None]
        return urlencode(pairs)

    @property
    def active(self) -> bool:
        """Whether any field is set."""
        return bool(self.pairs())


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number (give a number, like 1.5)")


async def read_form(request: Request) -> dict[str, list[str]]:
    """The urlencoded body of a POST (the dashboard's forms send nothing else)."""
    body = await request.body()  # bounded as it streams by the guard
    if len(body) > MAX_FORM_BYTES:
        raise ValueError("form too large")
    return parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)


def field_of(form: dict[str, list[str]], name: str) -> str:
    """The last value of field ``name``, or ''."""
    return (form.get(name) or [""])[-1]

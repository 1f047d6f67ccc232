"""Schedules for periodic jobs: 5-field cron expressions in a time zone, and intervals."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pgq.errors import ConfigError

_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = {
    m: i + 1
    for i, m in enumerate(
        ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
    )
}
_DAYS = {d: i for i, d in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])}
# The most days each month can have (February: in a leap year).
_MONTH_DAYS = {
    1: 31,
    2: 29,
    3: 31,
    4: 30,
    5: 31,
    6: 30,
    7: 31,
    8: 31,
    9: 30,
    10: 31,
    11: 30,
    12: 31,
}
# (name, low, high, names)
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 7, _DAYS),
)


class TimeSchedule(Protocol):
    """When a periodic job is due."""

    def latest(self, now: datetime) -> datetime:
        """The most recent slot at or before ``now`` (aware, UTC)."""
        ...

    def following(self, now: datetime) -> datetime:
        """The first slot after ``now`` (aware, UTC)."""
        ...

    def describe(self) -> str:
        """The schedule in words an operator reads (``*/5 * * * * (UTC)``, ``every 30s``)."""
        ...


def _field(text: str, name: str, low: int, high: int, names: dict[str, int]) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        body, _, step_text = part.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) < 1:
                raise ValueError(f"bad step {step_text!r} in the {name} field")
            step = int(step_text)
        if body == "*":
            start, end = low, high
        else:
            first, dash, last = body.partition("-")
            start = _value(first, name, low, high, names)
            end = _value(last, name, low, high, names) if dash else (high if step_text else start)
            if end < start:
                raise ValueError(f"range {body!r} runs backwards in the {name} field")
        values.update(range(start, end + 1, step))
    return frozenset(values)


def _value(text: str, name: str, low: int, high: int, names: dict[str, int]) -> int:
    value = names.get(text.lower()) if names else None
    if value is None:
        if not text.isdigit():
            raise ValueError(f"{text!r} is not valid in the {name} field")
        value = int(text)
    if not low <= value <= high:
        raise ValueError(f"{value} is out of range {low}-{high} in the {name} field")
    return value


@dataclass(frozen=True)
class Cron:
    """A 5-field cron expression (minute hour day-of-month month day-of-week), evaluated in
    ``timezone``. Names (``mon``, ``jan``), ranges, lists, steps and ``@daily``-style
    aliases are accepted. As in cron, when both day fields are restricted a day matching
    either is a match."""

    expression: str
    timezone: str = "UTC"
    _sets: tuple[frozenset[int], ...] = field(init=False, repr=False, compare=False)
    _zone: ZoneInfo = field(init=False, repr=False, compare=False)
    _dom_any: bool = field(init=False, repr=False, compare=False)
    _dow_any: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        text = _ALIASES.get(self.expression.strip().lower(), self.expression)
        parts = text.split()
        if len(parts) != 5:
            raise ConfigError(
                f"cron expression {self.expression!r} needs 5 fields (minute hour day month "
                "weekday), e.g. '*/5 * * * *'"
            )
        try:
            sets = tuple(_field(p, *spec) for p, spec in zip(parts, _FIELDS, strict=True))
        except ValueError as exc:
            raise ConfigError(f"cron expression {self.expression!r}: {exc}") from None
        dow = frozenset(d % 7 for d in sets[4])  # 7 is Sunday too
        object.__setattr__(self, "_sets", (*sets[:4], dow))
        object.__setattr__(self, "_dom_any", parts[2] == "*")
        object.__setattr__(self, "_dow_any", parts[4] == "*")
        if not self._can_match():
            raise ConfigError(
                f"cron expression {self.expression!r} never matches: no month it names has "
                "any of the days of the month it names (e.g. February 30th)"
            )
        try:
            object.__setattr__(self, "_zone", ZoneInfo(self.timezone))
        except (ZoneInfoNotFoundError, ValueError):
            raise ConfigError(
                f"unknown time zone {self.timezone!r} (use an IANA name such as 'Europe/Paris')"
            ) from None

    def _can_match(self) -> bool:
        # Only a restricted day of month with any day of week can name no real date: every
        # month has every weekday, and a restricted weekday matches on its own (OR).
        if self._dom_any or not self._dow_any:
            return True
        _, _, dom, months, _ = self._sets
        return any(day <= _MONTH_DAYS[month] for month in months for day in dom)

    def _day_matches(self, day: datetime) -> bool:
        _, _, dom, month, dow = self._sets
        if day.month not in month:
            return False
        in_dom = day.day in dom
        in_dow = (day.isoweekday() % 7) in dow
        if self._dom_any or self._dow_any:
            return in_dom and in_dow
        return in_dom or in_dow

    def latest(self, now: datetime) -> datetime:
        """The most recent matching minute at or before ``now``, as an aware UTC time."""
        minutes, hours = self._sets[0], self._sets[1]
        local = now.astimezone(self._zone).replace(second=0, microsecond=0, tzinfo=None)
        day = local.replace(hour=0, minute=0)
        for back in range(366 * 8):  # leap days and rare expressions included
            candidate_day = day - timedelta(days=back)
            if not self._day_matches(candidate_day):
                continue
            for hour in sorted(hours, reverse=True):
                for minute in sorted(minutes, reverse=True):
                    slot = candidate_day.replace(hour=hour, minute=minute)
                    if slot <= local:
                        return slot.replace(tzinfo=self._zone).astimezone(UTC)
        raise ConfigError(f"cron expression {self.expression!r} never matches")

    def following(self, now: datetime) -> datetime:
        """The first matching minute after ``now``, as an aware UTC time."""
        minutes, hours = sorted(self._sets[0]), sorted(self._sets[1])
        local = now.astimezone(self._zone).replace(second=0, microsecond=0, tzinfo=None)
        day = local.replace(hour=0, minute=0)
        for ahead in range(366 * 8):
            candidate_day = day + timedelta(days=ahead)
            if not self._day_matches(candidate_day):
                continue
            for hour in hours:
                for minute in minutes:
                    slot = candidate_day.replace(hour=hour, minute=minute)
                    if slot > local:
                        return slot.replace(tzinfo=self._zone).astimezone(UTC)
        raise ConfigError(f"cron expression {self.expression!r} never matches")

    def describe(self) -> str:
        """The expression and its time zone."""
        return f"{self.expression} ({self.timezone})"


@dataclass(frozen=True)
class Every:
    """Every ``seconds`` seconds, in slots aligned to the Unix epoch."""

    seconds: float

    def __post_init__(self) -> None:
        if not self.seconds > 0:
            raise ConfigError("every= must be a positive number of seconds")

    def latest(self, now: datetime) -> datetime:
        """The start of the slot ``now`` falls in."""
        ts = now.timestamp()
        return datetime.fromtimestamp(ts - ts % self.seconds, UTC)

    def following(self, now: datetime) -> datetime:
        """The start of the next slot."""
        return self.latest(now) + timedelta(seconds=self.seconds)

    def describe(self) -> str:
        """``every Ns``."""
        return f"every {self.seconds:g}s"


def make_schedule(cron: str | None, every: float | None, timezone: str) -> TimeSchedule:
    """A :class:`Cron` or :class:`Every` from the arguments of ``App.periodic``."""
    if (cron is None) == (every is None):
        raise ConfigError("give a cron expression or every=SECONDS (one of the two)")
    if cron is not None:
        return Cron(cron, timezone)
    assert every is not None
    return Every(every)

"""Cron expressions and the instants they name in a time zone (docs/schedules.md).

An expression has five fields, `minute hour day-of-month month day-of-week`, each `*`, a
number, a range `a-b`, a step `*/s`, `a-b/s` or `a/s`, or a comma-separated list of those;
months and weekdays may also be named (`jan`, `mon`). `@hourly`, `@daily`, `@weekly`,
`@monthly` and `@yearly` stand for their usual expressions. When both day fields are
restricted a day matches if either does (classic cron); a field that starts with `*` counts
as unrestricted, as in Vixie cron. Internally a sixth, leading seconds field is accepted
(`with_seconds`): the tests use it for schedules that tick every second; the API does not.

Matching happens on local wall-clock times of the schedule's zone, and each matching local
time names one instant (its *tick*):

- a local time that occurs once is that instant;
- one that occurs twice (clocks go back) is its first occurrence: it runs once;
- one that does not exist (clocks go forward) is the instant the gap ends, the next valid
  one; several skipped times that match are that one instant, so they run once.

This is monotone: a later local time never names an earlier instant, which is what lets
`next_after` and `latest_at_or_before` walk local time and stop at the first fit.
"""

from __future__ import annotations

import bisect
import calendar
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

SECOND = timedelta(seconds=1)
# Past this many years without a match there is none (the rarest match, 29 February on a
# restricted day-of-month, recurs within 8 years); a bound keeps a search finite.
_SEARCH_YEARS = 30

_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = {name.lower(): i for i, name in enumerate(calendar.month_abbr) if name}
# cron counts weekdays from Sunday = 0 (7 is Sunday too)
_WEEKDAYS = {name: i for i, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}


class CronError(ValueError):
    """The expression or the zone is not valid; the message says what is wrong."""


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    names: dict[str, int] | None = None


_SECOND = _Field("second", 0, 59)
_MINUTE = _Field("minute", 0, 59)
_HOUR = _Field("hour", 0, 23)
_DAY = _Field("day-of-month", 1, 31)
_MONTH = _Field("month", 1, 12, _MONTHS)
_WEEKDAY = _Field("day-of-week", 0, 7, _WEEKDAYS)


def _number(text: str, field: _Field) -> int:
    lowered = text.lower()
    if field.names is not None and lowered in field.names:
        return field.names[lowered]
    if not text.isdigit() or not text.isascii():
        raise CronError(f"{field.name}: {text!r} is not a number")
    value = int(text)
    if not field.low <= value <= field.high:
        raise CronError(f"{field.name}: {value} is outside {field.low}-{field.high}")
    return value


def _parse_field(text: str, field: _Field) -> tuple[int, ...]:
    values: set[int] = set()
    for part in text.split(","):
        span, slash, step_text = part.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or not step_text.isascii() or int(step_text) < 1:
                raise CronError(f"{field.name}: step {step_text!r} must be a positive number")
            step = int(step_text)
        if span == "*":
            low, high = field.low, field.high
        elif "-" in span:
            first, _, last = span.partition("-")
            low, high = _number(first, field), _number(last, field)
            if low > high:
                raise CronError(f"{field.name}: range {span!r} runs backwards")
        else:
            low = _number(span, field)
            # `a/s` runs from a to the end of the field
            high = field.high if slash else low
        values.update(range(low, high + 1, step))
    if field is _WEEKDAY and 7 in values:
        values = (values - {7}) | {0}
    return tuple(sorted(values))


@dataclass(frozen=True)
class Cron:
    """A parsed expression: the allowed values of each field, sorted."""

    expression: str
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: tuple[int, ...]
    months: tuple[int, ...]
    weekdays: tuple[int, ...]  # Sunday = 0
    days_restricted: bool
    weekdays_restricted: bool

    @classmethod
    def parse(cls, expression: str, *, with_seconds: bool = False) -> Cron:
        text = expression.strip()
        fields = _MACROS.get(text.lower(), text).split()
        if text.startswith("@") and text.lower() not in _MACROS:
            raise CronError(f"unknown macro {text!r}; use one of {', '.join(_MACROS)}")
        if with_seconds and len(fields) == 6:
            seconds = _parse_field(fields.pop(0), _SECOND)
        elif len(fields) == 5:
            seconds = (0,)
        else:
            raise CronError(
                f"expected five fields (minute hour day-of-month month day-of-week), "
                f"got {len(fields)}"
            )
        minute, hour, day, month, weekday = fields
        cron = cls(
            expression=text,
            seconds=seconds,
            minutes=_parse_field(minute, _MINUTE),
            hours=_parse_field(hour, _HOUR),
            days=_parse_field(day, _DAY),
            months=_parse_field(month, _MONTH),
            weekdays=_parse_field(weekday, _WEEKDAY),
            days_restricted=not day.startswith("*"),
            weekdays_restricted=not weekday.startswith("*"),
        )
        if not cron._can_match():
            raise CronError(f"{text!r} names no day that exists (e.g. 30 February)")
        return cron

    def _can_match(self) -> bool:
        if not self.days_restricted or self.weekdays_restricted:
            return True
        # only the day of month decides: some allowed month must have an allowed day
        # 2000 is a leap year: February may have a 29th
        return any(self.days[0] <= calendar.monthrange(2000, m)[1] for m in self.months)

    def matches_day(self, year: int, month: int, day: int) -> bool:
        if month not in self.months:
            return False
        by_day = day in self.days
        by_weekday = (calendar.weekday(year, month, day) + 1) % 7 in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return by_day or by_weekday
        return by_day and by_weekday

    def next_local(self, after: datetime) -> datetime | None:
        """The first matching wall-clock time after `after` (naive), or None within the
        search bound."""
        t = after.replace(microsecond=0) + SECOND
        limit = after.year + _SEARCH_YEARS
        while t.year <= limit:
            if t.month not in self.months:
                following = _after(self.months, t.month)
                year = t.year if following is not None else t.year + 1
                if year > limit:
                    return None
                t = datetime(year, following or self.months[0], 1)
            elif not self.matches_day(t.year, t.month, t.day):
                t = _start_of_day(t) + timedelta(days=1)
            elif t.hour not in self.hours:
                hour = _after(self.hours, t.hour)
                t = (
                    _start_of_day(t) + timedelta(days=1)
                    if hour is None
                    else t.replace(hour=hour, minute=0, second=0)
                )
            elif t.minute not in self.minutes:
                minute = _after(self.minutes, t.minute)
                t = (
                    t.replace(minute=0, second=0) + timedelta(hours=1)
                    if minute is None
                    else t.replace(minute=minute, second=0)
                )
            elif t.second not in self.seconds:
                second = _after(self.seconds, t.second)
                t = (
                    t.replace(second=0) + timedelta(minutes=1)
                    if second is None
                    else t.replace(second=second)
                )
            else:
                return t
        return None

    def latest_local(self, at: datetime) -> datetime | None:
        """The last matching wall-clock time at or before `at` (naive), or None within the
        search bound."""
        t = at.replace(microsecond=0)
        limit = at.year - _SEARCH_YEARS
        while t.year >= limit:
            if t.month not in self.months:
                earlier = _before(self.months, t.month)
                year = t.year if earlier is not None else t.year - 1
                if year < max(limit, 1):
                    return None
                month = earlier or self.months[-1]
                t = datetime(year, month, calendar.monthrange(year, month)[1], 23, 59, 59)
            elif not self.matches_day(t.year, t.month, t.day):
                t = _start_of_day(t) - SECOND
            elif t.hour not in self.hours:
                hour = _before(self.hours, t.hour)
                t = (
                    _start_of_day(t) - SECOND
                    if hour is None
                    else t.replace(hour=hour, minute=59, second=59)
                )
            elif t.minute not in self.minutes:
                minute = _before(self.minutes, t.minute)
                t = (
                    t.replace(minute=0, second=0) - SECOND
                    if minute is None
                    else t.replace(minute=minute, second=59)
                )
            elif t.second not in self.seconds:
                second = _before(self.seconds, t.second)
                t = t.replace(second=0) - SECOND if second is None else t.replace(second=second)
            else:
                return t
        return None


def _after(values: tuple[int, ...], current: int) -> int | None:
    index = bisect.bisect_right(values, current)
    return values[index] if index < len(values) else None


def _before(values: tuple[int, ...], current: int) -> int | None:
    index = bisect.bisect_left(values, current)
    return values[index - 1] if index > 0 else None


def _start_of_day(t: datetime) -> datetime:
    return t.replace(hour=0, minute=0, second=0)


def _offset(aware: datetime) -> timedelta:
    offset = aware.utcoffset()
    assert offset is not None
    return offset


def zone(name: str) -> ZoneInfo:
    """The IANA zone `name`; CronError when the database has no such zone."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise CronError(f"{name!r} is not a time zone of the IANA database") from None


@dataclass(frozen=True)
class CronSchedule:
    """A cron expression read in a time zone: the instants (ticks, in UTC) it names."""

    cron: Cron
    zone: ZoneInfo

    @classmethod
    def of(cls, expression: str, timezone: str, *, with_seconds: bool = False) -> CronSchedule:
        return cls(Cron.parse(expression, with_seconds=with_seconds), zone(timezone))

    def _wall(self, instant: datetime) -> datetime:
        return instant.astimezone(self.zone).replace(tzinfo=None)

    def tick_of(self, local: datetime) -> datetime:
        """The instant a matching wall-clock time names (the module docstring's rules)."""
        first = local.replace(tzinfo=self.zone, fold=0).astimezone(UTC)
        if self._wall(first) == local:
            return first  # it exists; fold 0 is its first occurrence
        # In a gap: search the instant the gap ends. Before it the wall clock reads less
        # than `local`, from it on more; fold 1 reads `local` with the later offset, so it
        # lies before the jump.
        low = local.replace(tzinfo=self.zone, fold=1).astimezone(UTC)
        high = first
        while high - low > SECOND:
            middle = low + (high - low) // 2
            middle = middle.replace(microsecond=0)
            if self._wall(middle) < local:
                low = middle
            else:
                high = middle
        return high

    def next_after(self, instant: datetime) -> datetime | None:
        """The first tick strictly after `instant`."""
        local = self.cron.next_local(self._wall(instant))
        while local is not None:
            tick = self.tick_of(local)
            # only in the second pass of a repeated hour can a later local time name an
            # instant already behind: its first occurrence was before the clocks went back
            if tick > instant:
                return tick
            local = self.cron.next_local(local)
        return None

    def latest_at_or_before(self, instant: datetime) -> datetime | None:
        """The last tick at or before `instant`."""
        wall = instant.astimezone(self.zone)
        start = wall.replace(tzinfo=None)
        if wall.fold:
            # the second pass of a repeated stretch: every local time up to its end had its
            # first occurrence before `instant`
            start += _offset(wall.replace(fold=0)) - _offset(wall)
        local = self.cron.latest_local(start)
        while local is not None:
            tick = self.tick_of(local)
            if tick <= instant:
                return tick
            local = self.cron.latest_local(local - SECOND)
        return None

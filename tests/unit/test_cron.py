"""Cron expressions: parsing, and next/latest tick against an independent oracle that walks
UTC minute by minute and asks, of each instant, whether the zone's wall clock makes it a
tick (hypothesis, in zones with daylight-saving changes of one hour and of 30 minutes)."""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evora.domain.cron import Cron, CronError, CronSchedule

MINUTE = timedelta(minutes=1)
# How far the oracle walks; a tick beyond it must be beyond it for the implementation too.
WINDOW = timedelta(days=2)
ZONES = ("Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "UTC", "Asia/Kolkata")


# -- parsing --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "minutes", "hours", "days", "months", "weekdays"),
    [
        ("* * * * *", range(60), range(24), range(1, 32), range(1, 13), range(7)),
        (
            "*/15 9-17/4 1,15 jan-mar MON-fri",
            [0, 15, 30, 45],
            [9, 13, 17],
            [1, 15],
            [1, 2, 3],
            [1, 2, 3, 4, 5],
        ),
        ("5/20 0 */10 12 7", [5, 25, 45], [0], [1, 11, 21, 31], [12], [0]),
        ("@hourly", [0], range(24), range(1, 32), range(1, 13), range(7)),
        ("@daily", [0], [0], range(1, 32), range(1, 13), range(7)),
        ("@weekly", [0], [0], range(1, 32), range(1, 13), [0]),
        ("@monthly", [0], [0], [1], range(1, 13), range(7)),
        ("  0 0 1 1 *  ", [0], [0], [1], [1], range(7)),
    ],
)
def test_parse(
    expression: str,
    minutes: list[int],
    hours: list[int],
    days: list[int],
    months: list[int],
    weekdays: list[int],
) -> None:
    cron = Cron.parse(expression)
    assert cron.seconds == (0,)
    assert (cron.minutes, cron.hours, cron.days, cron.months, cron.weekdays) == tuple(
        tuple(values) for values in (minutes, hours, days, months, weekdays)
    )


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("* * * *", "five fields"),
        ("* * * * * *", "five fields"),
        ("60 * * * *", "minute: 60 is outside 0-59"),
        ("* 24 * * *", "hour"),
        ("* * 0 * *", "day-of-month"),
        ("* * * 13 *", "month"),
        ("* * * * 8", "day-of-week"),
        ("*/0 * * * *", "step"),
        ("5-1 * * * *", "backwards"),
        ("a * * * *", "not a number"),
        ("1,,2 * * * *", "not a number"),
        ("\uff10 * * * *", "not a number"),  # a full-width zero
        ("@often", "unknown macro"),
        ("0 0 30 2 *", "no day that exists"),
        ("0 0 31 4,6,9,11 *", "no day that exists"),
    ],
)
def test_invalid_expressions(expression: str, message: str) -> None:
    with pytest.raises(CronError, match=message):
        Cron.parse(expression)


def test_seconds_only_when_asked() -> None:
    cron = Cron.parse("*/20 * * * * *", with_seconds=True)
    assert cron.seconds == (0, 20, 40)
    assert Cron.parse("* * * * *", with_seconds=True).seconds == (0,)


def test_unknown_zone() -> None:
    with pytest.raises(CronError, match="IANA"):
        CronSchedule.of("* * * * *", "Mars/Olympus_Mons")


def test_day_fields_or_when_both_restricted() -> None:
    # the 13th, or any Friday; with `*`-led day-of-month, only Fridays
    either = CronSchedule.of("0 0 13 * 5", "UTC")
    fridays = CronSchedule.of("0 0 */1 * 5", "UTC")
    start = datetime(2026, 2, 1, tzinfo=UTC)  # a Sunday
    assert _ticks(either, start, 3) == [
        datetime(2026, 2, 6, tzinfo=UTC),
        datetime(2026, 2, 13, tzinfo=UTC),  # both
        datetime(2026, 2, 20, tzinfo=UTC),
    ]
    assert _ticks(CronSchedule.of("0 0 14 * 5", "UTC"), start, 3)[1] == datetime(
        2026, 2, 13, tzinfo=UTC
    )
    assert _ticks(fridays, start, 2) == [
        datetime(2026, 2, 6, tzinfo=UTC),
        datetime(2026, 2, 13, tzinfo=UTC),
    ]


def test_leap_day() -> None:
    leap = CronSchedule.of("0 12 29 2 *", "UTC")
    assert leap.next_after(datetime(2026, 1, 1, tzinfo=UTC)) == datetime(
        2028, 2, 29, 12, tzinfo=UTC
    )
    assert leap.latest_at_or_before(datetime(2026, 1, 1, tzinfo=UTC)) == datetime(
        2024, 2, 29, 12, tzinfo=UTC
    )


# -- daylight saving, by example ------------------------------------------------------------


def _ticks(schedule: CronSchedule, after: datetime, count: int) -> list[datetime]:
    ticks: list[datetime] = []
    for _ in range(count):
        tick = schedule.next_after(after)
        assert tick is not None
        ticks.append(tick)
        after = tick
    return ticks


def _local(schedule: CronSchedule, ticks: list[datetime]) -> list[str]:
    return [t.astimezone(schedule.zone).strftime("%m-%d %H:%M%z") for t in ticks]


def test_daily_runs_at_local_time_across_both_changes() -> None:
    berlin = CronSchedule.of("0 9 * * *", "Europe/Berlin")
    spring = _ticks(berlin, datetime(2026, 3, 28, tzinfo=UTC), 2)
    assert _local(berlin, spring) == ["03-28 09:00+0100", "03-29 09:00+0200"]
    assert spring[1] - spring[0] == timedelta(hours=23)
    autumn = _ticks(berlin, datetime(2026, 10, 24, tzinfo=UTC), 2)
    assert _local(berlin, autumn) == ["10-24 09:00+0200", "10-25 09:00+0100"]
    assert autumn[1] - autumn[0] == timedelta(hours=25)


def test_skipped_local_time_runs_at_the_next_valid_instant_once() -> None:
    new_york = CronSchedule.of("*/20 2 * * *", "America/New_York")
    # 2026-03-08: 02:00 EST jumps to 03:00 EDT, so 02:00, 02:20 and 02:40 do not exist
    ticks = _ticks(new_york, datetime(2026, 3, 7, 12, tzinfo=UTC), 4)
    assert _local(new_york, ticks) == [
        "03-08 03:00-0400",
        "03-09 02:00-0400",
        "03-09 02:20-0400",
        "03-09 02:40-0400",
    ]
    assert new_york.latest_at_or_before(ticks[0] + timedelta(minutes=30)) == ticks[0]


def test_repeated_local_time_runs_once() -> None:
    lord_howe = CronSchedule.of("45 1 * * *", "Australia/Lord_Howe")
    # 2026-04-05: 02:00 +11 goes back to 01:30 +1030, so 01:45 happens twice
    ticks = _ticks(lord_howe, datetime(2026, 4, 4, tzinfo=UTC), 2)
    assert _local(lord_howe, ticks) == ["04-05 01:45+1100", "04-06 01:45+1030"]
    second_pass = datetime(2026, 4, 4, 15, 10, tzinfo=UTC)  # 01:40 +1030, the second time
    assert second_pass.astimezone(lord_howe.zone).fold == 1
    assert lord_howe.next_after(second_pass) == ticks[1]
    assert lord_howe.latest_at_or_before(second_pass) == ticks[0]


# -- the oracle -----------------------------------------------------------------------------


def _day_matches(cron: Cron, local: datetime) -> bool:
    by_day = local.day in cron.days
    by_weekday = local.isoweekday() % 7 in cron.weekdays
    both = cron.days_restricted and cron.weekdays_restricted
    return local.month in cron.months and (by_day or by_weekday if both else by_day and by_weekday)


def _matches(cron: Cron, local: datetime) -> bool:
    return local.minute in cron.minutes and local.hour in cron.hours and _day_matches(cron, local)


def _is_tick(schedule: CronSchedule, instant: datetime) -> bool:
    """Whether the wall clock makes this minute a tick: it reads a matching time for the
    first time, or it just jumped forward over a matching time."""
    wall = instant.astimezone(schedule.zone)
    if wall.fold == 0 and _matches(schedule.cron, wall.replace(tzinfo=None)):
        return True
    before = (instant - MINUTE).astimezone(schedule.zone).replace(tzinfo=None)
    skipped = before + MINUTE
    while skipped < wall.replace(tzinfo=None):
        if _matches(schedule.cron, skipped):
            return True
        skipped += MINUTE
    return False


def _oracle_next(schedule: CronSchedule, after: datetime) -> datetime | None:
    minute = after.replace(second=0, microsecond=0) + MINUTE
    while minute <= after + WINDOW:
        if _is_tick(schedule, minute):
            return minute
        minute += MINUTE
    return None


def _oracle_latest(schedule: CronSchedule, at: datetime) -> datetime | None:
    minute = at.replace(second=0, microsecond=0)
    while minute >= at - WINDOW:
        if _is_tick(schedule, minute):
            return minute
        minute -= MINUTE
    return None


@functools.cache
def _transitions(name: str) -> list[datetime]:
    """The instants in 2024-2027 at which the zone's offset changes (to the half hour)."""
    zone = ZoneInfo(name)
    found = []
    step = timedelta(minutes=30)
    t = datetime(2024, 1, 1, tzinfo=UTC)
    offset = t.astimezone(zone).utcoffset()
    while t.year < 2028:
        t += step
        current = t.astimezone(zone).utcoffset()
        if current != offset:
            found.append(t)
            offset = current
    return found or [datetime(2026, 6, 1, tzinfo=UTC)]


def _field(low: int, high: int, *, star_weight: int) -> st.SearchStrategy[str]:
    number = st.integers(low, high)
    single = number.map(str)
    span = st.tuples(number, number).map(lambda ab: f"{min(ab)}-{max(ab)}")
    stepped = st.tuples(st.sampled_from(["*", f"{low}-{high}"]), st.integers(1, 7)).map(
        lambda s: f"{s[0]}/{s[1]}"
    )
    listed = st.lists(st.one_of(single, span), min_size=1, max_size=4).map(",".join)
    return st.one_of(*[st.just("*")] * star_weight, single, span, stepped, listed)


# Minutes and hours that often fall on or around the changes (between 00:00 and 04:00).
_EXPRESSIONS = st.tuples(
    _field(0, 59, star_weight=1),
    st.one_of(_field(0, 23, star_weight=1), _field(0, 4, star_weight=0)),
    _field(1, 31, star_weight=6),
    _field(1, 12, star_weight=8),
    _field(0, 7, star_weight=4),
).map(" ".join)


@st.composite
def _cases(draw: st.DrawFn) -> tuple[CronSchedule, datetime]:
    name = draw(st.sampled_from(ZONES))
    expression = draw(_EXPRESSIONS)
    try:
        cron = Cron.parse(expression)
    except CronError:
        cron = Cron.parse("* * * * *")
    transition = draw(st.sampled_from(_transitions(name)))
    offset = draw(st.integers(-36 * 3600, 36 * 3600)) + draw(st.sampled_from([0, 0.5, 0.999]))
    return CronSchedule(cron, ZoneInfo(name)), transition + timedelta(seconds=offset)


@settings(max_examples=250, deadline=None)
@given(_cases())
def test_next_after_matches_the_oracle(case: tuple[CronSchedule, datetime]) -> None:
    schedule, after = case
    expected = _oracle_next(schedule, after)
    actual = schedule.next_after(after)
    if expected is None:
        assert actual is None or actual > after + WINDOW
    else:
        assert actual == expected


@settings(max_examples=250, deadline=None)
@given(_cases())
def test_latest_at_or_before_matches_the_oracle(case: tuple[CronSchedule, datetime]) -> None:
    schedule, at = case
    expected = _oracle_latest(schedule, at)
    actual = schedule.latest_at_or_before(at)
    if expected is None:
        assert actual is None or actual < at - WINDOW
    else:
        assert actual == expected

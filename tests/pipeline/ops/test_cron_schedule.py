"""Cron schedules and time zones are checked before a manifest reaches a cluster."""

from __future__ import annotations

from datetime import date, datetime

import pytest

from pipeline.ops.schedule import (
    check_cron,
    check_timezone,
    clear_schedule,
    dst_problems,
    fires_within,
    next_fires,
)


@pytest.mark.parametrize(("expr", "want"), [
    ("0 2 * * *", "0 2 * * *"),
    ("  30   1 * *  * ", "30 1 * * *"),
    ("*/15 0-6 ? JAN-MAR MON-FRI", "*/15 0-6 ? JAN-MAR MON-FRI"),
    ("0 2 1,15 * 0", "0 2 1,15 * 0"),
    ("59 23 31 12 6", "59 23 31 12 6"),
    ("0 */2 * * sun", "0 */2 * * sun"),
    ("@Daily", "@daily"),
    ("@hourly", "@hourly"),
])
def test_valid_schedules(expr, want):
    assert check_cron(expr) == want


@pytest.mark.parametrize(("expr", "message"), [
    ("61 2 * * *", "minute field '61': 61 is out of range; allowed 0-59"),
    ("0 24 * * *", "hour field '24': 24 is out of range; allowed 0-23"),
    ("0 2 0 * *", "day of month field '0': 0 is out of range; allowed 1-31"),
    ("0 2 * 13 *", "month field '13': 13 is out of range; allowed 1-12 or JAN-DEC"),
    ("0 2 * * 7", "day of week field '7': 7 is out of range; allowed 0-6 or SUN-SAT"),
    ("0 2 * *", "has 4 field(s)"),
    ("0 2 * * * *", "has 6 field(s)"),
    ("@nightly", "unknown macro"),
    ("*/0 * * * *", "step '0' must be a whole number >= 1"),
    ("5-1 * * * *", "runs backwards"),
    ("? * * * *", "'?' only fits"),
    ("0 2 * FOO *", "'FOO' is not a number or name"),
    ("0 2-* * * *", "'*' is not a number or name"),
    ("0 1-2-3 * * *", "is not N, N-M"),
    ("CRON_TZ=UTC 0 2 * * *", "give the zone with --timezone"),
])
def test_bad_schedules_name_the_option_and_the_field(expr, message):
    with pytest.raises(ValueError) as e:
        check_cron(expr, "--schedule")
    assert str(e.value).startswith(f"--schedule {expr!r}") and message in str(e.value)


@pytest.mark.parametrize("tz", ["UTC", "Europe/Zurich", "America/Argentina/Buenos_Aires", "Etc/GMT+5"])
def test_known_time_zones(tz):
    assert check_timezone(tz) == tz


@pytest.mark.parametrize("tz", ["Mars/Olympus_Mons", "Europe/Zürich", "", " UTC", "../../etc/passwd", "/etc/localtime",
                                "localtime", "posixrules"])
def test_unknown_time_zones_name_the_option(tz):
    with pytest.raises(ValueError, match="--timezone"):
        check_timezone(tz)


def test_the_next_times_follow_each_field_and_the_day_rule():
    assert next_fires("0 2 * * *", datetime(2026, 12, 7, 11), 2) == [datetime(2026, 12, 8, 2), datetime(2026, 12, 9, 2)]
    assert next_fires("*/15 9-17 * * MON-FRI", datetime(2026, 12, 11, 17, 50), 1) == [datetime(2026, 12, 14, 9)]
    # both day fields restricted: either matches (the 13th, a Sunday, and every Monday)
    assert next_fires("0 0 13 * 1", datetime(2026, 12, 7, 1), 2) == [datetime(2026, 12, 13), datetime(2026, 12, 14)]
    assert next_fires("@weekly", datetime(2026, 12, 7), 1) == [datetime(2026, 12, 13)]  # Sunday 00:00
    # strictly after the start: a start on a fire time gives the next one
    assert next_fires("0 2 * * *", datetime(2026, 12, 8, 2), 1) == [datetime(2026, 12, 9, 2)]
    # N/S runs from N to the field's top in steps of S (robfig/cron), not N alone
    assert next_fires("5/20 * * * *", datetime(2026, 12, 7), 3) == [
        datetime(2026, 12, 7, 0, 5), datetime(2026, 12, 7, 0, 25), datetime(2026, 12, 7, 0, 45)]


def test_a_schedule_with_no_real_date_never_fires():
    assert not fires_within("0 2 31 2 *", datetime(2026, 12, 7))  # February 31st
    assert fires_within("0 2 29 2 *", datetime(2026, 12, 7))  # leap days come within five years


def test_clock_changes_that_skip_or_repeat_a_nightly_time_are_named():
    skip, twice = dst_problems("0 2 * * *", "Europe/Berlin", date(2026, 12, 7))
    assert skip.startswith("Europe/Berlin skips 2027-03-28 02:00") and "does not run" in skip
    assert twice.startswith("Europe/Berlin repeats 2027-10-31 02:00") and "runs twice" in twice
    assert dst_problems("30 3 * * *", "Europe/Berlin", date(2026, 12, 7)) == []
    assert dst_problems("0 2 * * *", "UTC", date(2026, 12, 7)) == []
    (ny,) = dst_problems("0 1 * * *", "America/New_York", date(2026, 12, 7))
    assert ny.startswith("America/New_York repeats 2027-11-07 01:00")


def test_a_star_with_step_one_leaves_the_day_fields_anded_as_robfig_cron_does():
    """``*/1`` (or ``1,*``) in day-of-month keeps cron's star flag: Mondays only, not every day."""
    assert next_fires("0 3 */1 * 1", datetime(2026, 12, 7), 2) == [datetime(2026, 12, 7, 3), datetime(2026, 12, 14, 3)]
    assert next_fires("0 3 1,* * 1", datetime(2026, 12, 7), 1) == [datetime(2026, 12, 7, 3)]


def test_a_clock_going_back_at_midnight_repeats_the_evening_before():
    (repeat,) = dst_problems("30 23 * * *", "America/Santiago", date(2025, 1, 1))
    assert repeat.startswith("America/Santiago repeats 2025-04-05 23:30")


def test_the_suggested_time_is_clear_of_the_zones_own_changes():
    """03:30 is clear in Berlin, not in Helsinki (its changes fall at 03:00 and 04:00)."""
    assert clear_schedule("0 2 * * *", "Europe/Berlin", date(2026, 1, 1)) == "30 3 * * *"
    assert clear_schedule("0 2 * * *", "Europe/Helsinki", date(2026, 1, 1)) == "30 4 * * *"
    assert dst_problems("30 4 * * *", "Europe/Helsinki", date(2026, 1, 1)) == []

"""Check cron schedules and time zones before they reach a cluster.

Contract: ``check_cron(expr, option)`` accepts what the KubeRay RayCronJob controller
(robfig/cron ``ParseStandard``, like Kubernetes CronJob) accepts for a standard
schedule: five fields ``minute hour day-of-month month day-of-week`` with ``*``, ``?``
(day fields), numbers, ``a-b`` ranges, ``/step``, ``,`` lists and JAN-DEC / SUN-SAT
names, or one of the ``@yearly @annually @monthly @weekly @daily @midnight @hourly``
macros. Anything else raises a ValueError naming ``option``, the value, the bad field
and its allowed range. A ``CRON_TZ=``/``TZ=`` prefix is refused: the zone comes from
its own option. ``check_timezone(tz, option)`` accepts IANA names known to zoneinfo.
``next_fires(expr, start, n)`` gives the schedule's next times (naive wall-clock times);
``fires_within(expr, start, years)`` says whether it fires at all (robfig/cron gives up
after five years and KubeRay v1.6 then starts a job at once); ``dst_problems(expr, tz,
start)`` names the nights a zone's clock change skips or repeats (robfig/cron runs a time
the clock skips never, and one it repeats twice).
"""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta

MACROS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
_MONTHS = {m: i for i, m in enumerate(
    ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"], start=1)}
_DAYS = {d: i for i, d in enumerate(["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"])}
# (name, low, high, names) per field, as robfig/cron bounds them.
FIELDS = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 6, _DAYS),
)
_NUM = re.compile(r"^[0-9]+\Z")


def check_cron(expr: str, option: str = "--schedule") -> str:
    """Return the normalised schedule (single spaces) or raise ValueError."""
    s = " ".join(expr.split())
    allowed = f"5 fields 'minute hour day-of-month month day-of-week' or one of {' '.join(MACROS)}"
    if "TZ=" in s.upper():
        raise ValueError(f"{option} {expr!r}: no CRON_TZ=/TZ= prefix; give the zone with --timezone")
    if s.startswith("@"):
        if s.lower() in MACROS:
            return s.lower()
        raise ValueError(f"{option} {expr!r}: unknown macro; allowed: {allowed}")
    parts = s.split(" ")
    if len(parts) != 5:
        raise ValueError(f"{option} {expr!r} has {len(parts)} field(s); allowed: {allowed}")
    for part, (name, lo, hi, names) in zip(parts, FIELDS):
        _check_field(part, name, lo, hi, names, expr, option)
    return s


def _check_field(part: str, name: str, lo: int, hi: int, names: dict[str, int], expr: str, option: str) -> None:
    where = f"{option} {expr!r}: {name} field {part!r}"
    rng = f"{lo}-{hi}" + (f" or {list(names)[0]}-{list(names)[-1]}" if names else "")
    for item in part.split(","):
        base, _, step = item.partition("/")
        if step and (not _NUM.match(step) or int(step) < 1):
            raise ValueError(f"{where}: step {step!r} must be a whole number >= 1")
        if base in ("*", "?"):
            if base == "?" and name not in ("day of month", "day of week"):
                raise ValueError(f"{where}: '?' only fits the day-of-month or day-of-week field")
            continue
        bounds = base.split("-")
        if len(bounds) > 2 or not all(bounds):
            raise ValueError(f"{where}: {item!r} is not N, N-M, *, or */S; allowed values {rng}")
        values = [_value(b, names, where, rng) for b in bounds]
        for v in values:
            if not lo <= v <= hi:
                raise ValueError(f"{where}: {v} is out of range; allowed {rng}")
        if len(values) == 2 and values[0] > values[1]:
            raise ValueError(f"{where}: range {base!r} runs backwards")


def _value(token: str, names: dict[str, int], where: str, rng: str) -> int:
    if _NUM.match(token):
        return int(token)
    if token.upper() in names:
        return names[token.upper()]
    raise ValueError(f"{where}: {token!r} is not a number or name; allowed {rng}")


def check_timezone(tz: str, option: str = "--timezone") -> str:
    """Return ``tz`` if it is an IANA zone name known here (zoneinfo), else ValueError."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    # "localtime" and "posixrules" are files in the zone database, not zones a cluster's
    # container is sure to resolve alike.
    if not tz or tz != tz.strip() or tz.startswith(("/", ".")) or ".." in tz or tz in ("localtime", "posixrules"):
        raise ValueError(f"{option} {tz!r} is not an IANA time zone name like Europe/Zurich or UTC")
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(
            f"{option} {tz!r} is not a known IANA time zone; allowed: names like UTC, "
            "Europe/Zurich, America/New_York (zoneinfo)"
        ) from None
    return tz


#: The macros as the five fields they stand for (robfig/cron's parser).
_MACRO_FIELDS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
                 "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *"}


def expand(expr: str) -> tuple[list[set[int]], bool, bool]:
    """A schedule ``check_cron`` accepted as the set of values of each field (minute, hour,
    day of month, month, day of week, 0 = Sunday), and whether the day-of-month and
    day-of-week fields are unrestricted as robfig/cron reads them: an item ``*`` or ``?``
    without a step above 1 (``*/1``, ``1,*`` too) marks the field so; a day then matches
    when both fields do, else when either restricted one does."""
    s = check_cron(expr)
    parts = _MACRO_FIELDS.get(s, s).split(" ")
    sets: list[set[int]] = []
    for part, (_, lo, hi, names) in zip(parts, FIELDS):
        values: set[int] = set()
        for item in part.split(","):
            base, _, step = item.partition("/")
            if base in ("*", "?"):
                a, b = lo, hi
            else:
                bounds = [int(x) if _NUM.match(x) else names[x.upper()] for x in base.split("-")]
                a, b = bounds[0], bounds[-1] if len(bounds) == 2 or not step else hi
            values.update(range(a, b + 1, int(step) if step else 1))
        sets.append(values)
    return sets, _starred(parts[2]), _starred(parts[4])


def _starred(field: str) -> bool:
    """robfig/cron's star bit: some item is ``*``/``?`` with no step above 1."""
    for item in field.split(","):
        base, _, step = item.partition("/")
        if base in ("*", "?") and (not step or int(step) <= 1):
            return True
    return False


def _day_matches(day: date, sets: list[set[int]], any_dom: bool, any_dow: bool) -> bool:
    if day.month not in sets[3]:
        return False
    dom, dow = day.day in sets[2], (day.isoweekday() % 7) in sets[4]
    if any_dom or any_dow:
        return dom and dow
    return dom or dow


def next_fires(expr: str, start: datetime, n: int, days: int = 5 * 366) -> list[datetime]:
    """The schedule's first ``n`` times after ``start`` (naive wall-clock times), looking at
    most ``days`` days ahead."""
    sets, any_dom, any_dow = expand(expr)
    out: list[datetime] = []
    for d in range(days + 1):
        day = start.date() + timedelta(days=d)
        if not _day_matches(day, sets, any_dom, any_dow):
            continue
        for hour in sorted(sets[1]):
            for minute in sorted(sets[0]):
                t = datetime(day.year, day.month, day.day, hour, minute)
                if t > start:
                    out.append(t)
                    if len(out) == n:
                        return out
    return out


def fires_within(expr: str, start: datetime, years: int = 5) -> bool:
    """Whether the schedule fires within ``years`` years of ``start`` (``0 2 31 2 *`` never does)."""
    return bool(next_fires(expr, start, 1, days=years * 366))


def dst_problems(expr: str, tz: str, start: date, days: int = 400) -> list[str]:
    """One line per kind of clock change in ``tz`` over ``days`` days from ``start`` that hits
    a time the schedule fires at: a skipped time (the night never runs) or a repeated one (it
    runs twice). [] for zones without clock changes or schedules clear of them."""
    from zoneinfo import ZoneInfo

    zone = ZoneInfo(tz)
    sets, any_dom, any_dow = expand(expr)
    skipped: list[str] = []
    repeated: list[str] = []
    changed = []  # days whose noon offset differs from the day before's: a change between
    for d in range(days):
        day = start + timedelta(days=d)
        noon = datetime(day.year, day.month, day.day, 12, tzinfo=zone)
        if noon.utcoffset() != (noon - timedelta(days=1)).utcoffset():
            changed.append(day)
    # A change between two noons falls on either day (at 24:00 it repeats the evening before).
    near = sorted({x for c in changed for x in (c - timedelta(days=1), c)})
    for day in near:
        if not _day_matches(day, sets, any_dom, any_dow):
            continue
        for hour in sorted(sets[1]):
            for minute in sorted(sets[0]):
                wall = datetime(day.year, day.month, day.day, hour, minute, tzinfo=zone)
                there = wall.astimezone(ZoneInfo("UTC")).astimezone(zone)
                if there.replace(tzinfo=None) != wall.replace(tzinfo=None):
                    skipped.append(f"{day} {hour:02d}:{minute:02d}")
                elif wall.replace(fold=1).utcoffset() != wall.replace(fold=0).utcoffset():
                    repeated.append(f"{day} {hour:02d}:{minute:02d}")
    out = []
    if skipped:
        out.append(f"{tz} skips {skipped[0]} (the clock jumps forward): that night does not run")
    if repeated:
        out.append(f"{tz} repeats {repeated[0]} (the clock goes back): that night runs twice (the second run "
                   "finds the date held, exits 75 and the RayJob fails)")
    return out


#: Nightly times tried, in order, for a schedule clear of a zone's clock changes.
_CLEAR_TIMES = ("30 3", "30 4", "30 5", "0 12")


def clear_schedule(expr: str, tz: str, start: date) -> str | None:
    """``expr`` at the first of ``_CLEAR_TIMES`` that no clock change of ``tz`` hits (its day
    fields kept), or None when none is clear."""
    days = _MACRO_FIELDS.get(check_cron(expr), check_cron(expr)).split(" ")[2:]
    for time in _CLEAR_TIMES:
        candidate = " ".join([time, *days])
        if not dst_problems(candidate, tz, start):
            return candidate
    return None

"""Check cron schedules and time zones before they reach a cluster.

Contract: ``check_cron(expr, option)`` accepts what the KubeRay RayCronJob controller
(robfig/cron ``ParseStandard``, like Kubernetes CronJob) accepts for a standard
schedule: five fields ``minute hour day-of-month month day-of-week`` with ``*``, ``?``
(day fields), numbers, ``a-b`` ranges, ``/step``, ``,`` lists and JAN-DEC / SUN-SAT
names, or one of the ``@yearly @annually @monthly @weekly @daily @midnight @hourly``
macros. Anything else raises a ValueError naming ``option``, the value, the bad field
and its allowed range. A ``CRON_TZ=``/``TZ=`` prefix is refused: the zone comes from
its own option. ``check_timezone(tz, option)`` accepts IANA names known to zoneinfo.
"""

from __future__ import annotations

import re

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

    if not tz or tz != tz.strip() or tz.startswith(("/", ".")) or ".." in tz:
        raise ValueError(f"{option} {tz!r} is not an IANA time zone name like Europe/Zurich or UTC")
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(
            f"{option} {tz!r} is not a known IANA time zone; allowed: names like UTC, "
            "Europe/Zurich, America/New_York (zoneinfo)"
        ) from None
    return tz

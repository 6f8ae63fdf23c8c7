"""Whether this machine was busy while something was timed: one rule for `bench job` and
`eval`, whose time figures are only a measurement on a quiet machine.

Contract: ``busy_note(loads, cpus)``: words for a load average above the CPU count at any
of ``loads`` (e.g. the 1-minute load at the start and at the end), else None. A trial read
an eval's time columns taken beside another job as a method's cost (4.5x instead of 1.3x).
"""

from __future__ import annotations

import os


def load_now() -> float:
    """The 1-minute load average (0.0 where the system does not tell it)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def busy_note(loads: list[float], cpus: int | None) -> str | None:
    """See the module contract."""
    if not cpus or not any(x > cpus for x in loads):
        return None
    return (f"the load average ({', '.join(f'{x:.2f}' for x in loads)} at the start and end) was above this "
            f"machine's {cpus} CPUs: other work shared them")

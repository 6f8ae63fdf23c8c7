"""Ray's own processes give way to the model's compute: ``as_background_work`` / ``as_compute``.

Why: on a machine of few cores the embedded Ray's processes (the driver, GCS, raylet,
Ray Data's helper actors, idle pool workers) wake up often: about 1,900 times a second
in all during the sample job on the 2-core dev machine (measured 2026-11-26 from
``/proc/<pid>/task/<tid>/schedstat``), at about 13% of one core. Under Linux's normal
policy a waking thread preempts a running one; when it preempts one of the generate
actor's two compute threads, the other waits for it at the next parallel region's
barrier. The compute threads then ran 86% / 78.5% of the time and waited 7.5% / 8.3% in
the run queue, against 88.6% / 95.4% and 0.9% / 0.1% with the same engine in one
process; the rows' prefill took 2.47 s a row under Ray against 2.04 s.

Linux's ``SCHED_BATCH`` policy keeps a thread's fair share of the CPU but its wake-ups
never preempt a running thread of the normal policy: it runs at the next scheduler tick
(a few ms), which a batch job's bookkeeping does not notice. So the driver puts itself
in ``SCHED_BATCH`` before it starts the embedded Ray (every process Ray starts inherits
it), and the generate stage puts its own thread back in the normal policy before it
loads the model, so the threads it starts (the engine's thread, and the OpenMP pool that
thread's first parallel region creates) compute at the normal policy.

Contract:
- ``as_background_work()``: the calling thread becomes ``SCHED_BATCH``; the threads and
  processes it starts afterwards inherit it. Returns a one-line description, or None
  where nothing changed: no ``SCHED_BATCH`` (macOS, Windows), the call was refused, or
  ``LONGDOC_RAY_SCHED_BATCH=0`` in the environment (everything at the normal policy).
- ``as_compute()``: the calling thread leaves ``SCHED_BATCH`` for the normal policy
  (allowed without privileges: both are fair policies at the same nice value). A no-op,
  returning None, where the thread is not ``SCHED_BATCH`` (a Ray started by
  ``ray start`` on a cluster node, the in-process runner, or the setting off).
Both act on the calling thread only (Linux policies are per thread), never raise, and
are harmless to call again.
"""

from __future__ import annotations

import os

OFF_SWITCH = "LONGDOC_RAY_SCHED_BATCH"


def _supported() -> bool:
    return all(hasattr(os, name) for name in ("SCHED_BATCH", "SCHED_OTHER", "sched_setscheduler", "sched_getscheduler"))


def as_background_work() -> str | None:
    """The calling thread (and what it starts later) to ``SCHED_BATCH``; see the module doc."""
    if os.environ.get(OFF_SWITCH, "1") == "0" or not _supported():
        return None
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except OSError:
        return None
    return "Ray's processes run as SCHED_BATCH (their wake-ups do not preempt the model's compute threads)"


def as_compute() -> str | None:
    """The calling thread back to the normal policy if it is ``SCHED_BATCH``; see the module doc."""
    if not _supported():
        return None
    try:
        if os.sched_getscheduler(0) != os.SCHED_BATCH:
            return None
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    except OSError:
        return None
    return "compute threads at the normal policy (Ray's own processes run as SCHED_BATCH)"

"""A driver-side watchdog that aborts a run whose generate actor pool is gone for good.

Why: when the last actor of a Ray Data actor pool dies and Ray may not restart it
(``resources.max_retries`` exhausted, or 0), Ray Data 2.60 sometimes raises (the run
aborts and its missing requests become retryable error rows) and sometimes spins
forever in its scheduling loop, with nothing left to run the pool's tasks. A
nightly job must never hang: the watchdog turns the second case into the first.

Contract: ``PoolWatchdog(marker, grace_s, poll_s)`` used as a context manager around
the driver's iteration over the dataset, with ``progress()`` called per batch. A
thread polls the GCS actor table of this job every ``poll_s``; when actors whose
class name contains ``marker``, created since the watchdog started, have been
seen, every one of them is DEAD, and no
batch arrived for ``grace_s``, it sets ``fired``/``reason`` and interrupts the main
thread (KeyboardInterrupt; a real SIGINT to the main thread when that has not landed
within 15 s). ``guarded(watchdog, iterate)`` runs ``iterate`` and turns
that interrupt into ``PoolLost`` (a RuntimeError); a real Ctrl-C still propagates.
The actor table is read through ``ray._private.state`` (no dashboard needed: the
embedded Ray runs without one).
"""

from __future__ import annotations

import _thread
import signal
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_LIVE_STATES = ("ALIVE", "PENDING_CREATION", "RESTARTING", "DEPENDENCIES_UNREADY")


class PoolLost(RuntimeError):
    """The generate actor pool died and Ray will not bring it back."""


class PoolWatchdog:
    """See the module docstring."""

    def __init__(self, marker: str = "GenerateStage", grace_s: float = 30.0, poll_s: float = 2.0) -> None:
        self.marker, self.grace_s, self.poll_s = marker, grace_s, poll_s
        self.fired = False
        self.reason = ""
        self._last_progress = time.monotonic()
        self._lock = threading.Lock()
        self._active = False
        self._stop = threading.Event()
        self._acknowledged = threading.Event()  # set by guarded once the interrupt landed
        self._thread: threading.Thread | None = None

    def progress(self) -> None:
        self._last_progress = time.monotonic()

    def __enter__(self) -> PoolWatchdog:
        import ray

        self._job = ray.get_runtime_context().get_job_id()
        # Pools of earlier runs in this driver (`longdoc eval` runs one per method) are
        # dead by now: only actors created from here on are this run's.
        self._earlier = {a["ActorID"] for a in self._pool()}
        self._active = True
        self._last_progress = time.monotonic()
        self._thread = threading.Thread(target=self._watch, name="longdoc-pool-watchdog", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._active = False
        self._stop.set()

    def _pool(self) -> list[dict]:
        from ray._private import state

        earlier = getattr(self, "_earlier", set())
        return [
            a for a in state.actors().values()
            if a.get("JobID") == self._job and self.marker in str(a.get("ActorClassName", ""))
            and a.get("ActorID") not in earlier
        ]

    def _watch(self) -> None:
        seen, dead_since = False, None
        while not self._stop.wait(self.poll_s):
            try:
                pool = self._pool()
            except Exception:  # noqa: BLE001 - a GCS hiccup must not kill the watchdog
                continue
            if any(a.get("State") in _LIVE_STATES for a in pool):
                seen, dead_since = True, None
                continue
            if not (seen or pool):
                continue  # the pool has not started yet
            now = time.monotonic()
            dead_since = dead_since or now
            if now - max(dead_since, self._last_progress) < self.grace_s:
                continue
            with self._lock:
                if not self._active:
                    return
                self.fired = True
                self.reason = (
                    f"every generate actor ({len(pool)}) is dead and Ray will not restart them "
                    f"(resources.max_retries exhausted); no rows for {self.grace_s:.0f}s"
                )
                _thread.interrupt_main()
            # interrupt_main only lands when the main thread next runs Python code; one
            # blocked in a C call never sees it. A real SIGINT also breaks a blocking call.
            if not self._acknowledged.wait(15.0):
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            return


def guarded(watchdog: PoolWatchdog, iterate: Callable[[], T]) -> T:
    """Run ``iterate()`` under ``watchdog``; its interrupt becomes PoolLost."""
    try:
        with watchdog:
            return iterate()
    except KeyboardInterrupt:
        if not watchdog.fired:
            raise
        watchdog._acknowledged.set()
        raise PoolLost(watchdog.reason) from None

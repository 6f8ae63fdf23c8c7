"""A driver-side watchdog that aborts a run whose generate actor pool is gone or never comes.

Why: when the last actor of a Ray Data actor pool dies and Ray may not restart it
(``resources.max_retries`` exhausted, or 0), Ray Data 2.60 sometimes raises (the run
aborts and its missing requests become retryable error rows) and sometimes spins
forever in its scheduling loop, with nothing left to run the pool's tasks. And a pool
whose actors need a resource no node has (a GPU on a CPU cluster, a custom resource
nobody offers) waits for ever too: Ray keeps the actors pending, Ray Data waits for
them. A nightly job must never hang: the watchdog turns both into aborts.

Contract: ``PoolWatchdog(marker, grace_s, poll_s, pending_timeout_s, required)`` used
as a context manager around the driver's iteration over the dataset, with
``progress()`` called per batch. A thread polls the GCS actor table of this job every
``poll_s`` (actors whose class name contains ``marker``, created since the watchdog
started) and fires when
- the pool was seen, every actor of it is DEAD and no batch arrived for ``grace_s``
  (``PoolLost``), or
- ``pending_timeout_s`` is set and for that long no actor of the pool was alive or
  being constructed while at least one waited for a node to place it on (pending,
  no worker process yet), and no batch arrived (``PoolUnschedulable``; its message
  names the resources one actor needs, ``required``, and what the cluster's nodes have).
Firing sets ``fired``/``reason`` and interrupts the main thread with a signal of its
own, ``WATCHDOG_SIGNAL``, whose handler the watchdog installs while it is active
(``_thread.interrupt_main``, then a real signal to the main thread when that has not
landed within ``follow_up_s``). Not SIGINT: a driver started in the background by a
non-interactive shell (cron, a CI script, ``cmd &``) inherits SIGINT ignored, Python
then installs no KeyboardInterrupt handler, and an interrupt by SIGINT would never
land: the run would hang for ever (seen on this machine). Used outside the main thread
(no handler can be installed there) it falls back to SIGINT.
``guarded(watchdog, iterate)`` runs ``iterate`` and turns that interrupt into the
exception (both are RuntimeErrors); a real Ctrl-C still propagates.
The actor table is read through ``ray._private.state`` (no dashboard needed: the
embedded Ray runs without one). For tests that must not depend on timing,
``wait_for_polls(n)`` returns once the thread has evaluated the pool ``n`` times and
``saw_alive`` is set once an actor of the pool was seen alive.
"""

from __future__ import annotations

import _thread
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_PENDING_STATES = ("PENDING_CREATION", "DEPENDENCIES_UNREADY", "RESTARTING")
_LIVE_STATES = ("ALIVE", *_PENDING_STATES)
_HIDDEN_RESOURCES = ("node:", "object_store_memory", "accelerator_type:")


#: The signal the watchdog interrupts the driver's main thread with (see the module docstring).
WATCHDOG_SIGNAL = signal.SIGUSR2


class _Fired(BaseException):
    """Raised in the main thread by the watchdog's signal handler (a BaseException, like
    KeyboardInterrupt, so that no ``except Exception`` on the way swallows it)."""


class PoolLost(RuntimeError):
    """The generate actor pool died and Ray will not bring it back."""


class PoolUnschedulable(PoolLost):
    """No node of the cluster can hold a generate actor (a resource it needs is missing)."""


def waiting_for_a_node(actor: dict[str, Any]) -> bool:
    """Pending with no worker process yet: Ray has found no node with the actor's resources.

    An actor whose constructor runs (a model loading for minutes) is also PENDING_CREATION,
    but it has a worker process (a pid and an address); that one is alive for the watchdog.
    """
    if actor.get("State") not in _PENDING_STATES:
        return False
    address = actor.get("Address") or {}
    return not actor.get("Pid") and not address.get("IPAddress")


def _amount(name: str, value: float) -> str:
    if name == "memory" or name.endswith("_memory"):
        return f"{value / 2**30:.1f} GiB"
    return f"{value:g}"


def describe_unschedulable(required: dict[str, float], nodes: list[dict[str, float]], waited_s: float) -> str:
    """Why no node takes a generate actor: the resources missing, each node's resources.

    ``required``: one actor's resources (``CPU``, ``GPU``, custom); ``nodes``: the
    resources of each alive node (ray.nodes()'s ``Resources``).
    """
    missing = [
        f"{name} {_amount(name, need)} (the most one node has: "
        f"{_amount(name, max((n.get(name, 0.0) for n in nodes), default=0.0))})"
        for name, need in sorted(required.items())
        if need > 0 and not any(n.get(name, 0.0) >= need for n in nodes)
    ]
    needs = ", ".join(f"{k} {_amount(k, v)}" for k, v in sorted(required.items()) if v > 0)
    have = "; ".join(
        ", ".join(f"{k} {_amount(k, v)}" for k, v in sorted(n.items()) if not k.startswith(_HIDDEN_RESOURCES))
        for n in nodes
    ) or "no alive node"
    what = ("missing on every node: " + ", ".join(missing)) if missing else (
        "no single node has all of them free at once")
    return (
        f"no node can take a generate actor after {waited_s:.0f}s (resources.schedule_timeout_s): "
        f"each needs {needs}; {what}; the cluster's {len(nodes)} node(s) have: {have}. Allowed: "
        "resources the cluster has (resources.num_gpus, num_cpus, custom_resources), or nodes that offer them"
    )


class PoolWatchdog:
    """See the module docstring."""

    def __init__(
        self,
        marker: str = "GenerateStage",
        grace_s: float = 30.0,
        poll_s: float = 2.0,
        pending_timeout_s: float | None = None,
        required: dict[str, float] | None = None,
        follow_up_s: float = 15.0,
    ) -> None:
        self.marker, self.grace_s, self.poll_s = marker, grace_s, poll_s
        self.pending_timeout_s, self.required = pending_timeout_s, dict(required or {})
        self.follow_up_s = follow_up_s
        self.fired = False
        self.reason = ""
        #: What the pool waits for now, in words ('' when it does not wait): the progress
        #: line shows it, so a pool no node can take is not silence until the timeout.
        self.waiting_note = ""
        self.error: type[PoolLost] = PoolLost
        self.saw_alive = threading.Event()
        self._polls = 0
        self._polled = threading.Condition()
        self._last_progress = time.monotonic()
        self._lock = threading.Lock()
        self._active = False
        self._stop = threading.Event()
        self._acknowledged = threading.Event()  # set by guarded once the interrupt landed
        self._thread: threading.Thread | None = None
        self._signal = signal.SIGINT  # WATCHDOG_SIGNAL once its handler is installed
        self._previous_handler: Any = None

    def progress(self) -> None:
        self._last_progress = time.monotonic()

    def wait_for_polls(self, n: int, timeout_s: float = 120.0) -> bool:
        """Block until the thread has evaluated the pool ``n`` times in all (False on timeout)."""
        with self._polled:
            return self._polled.wait_for(lambda: self._polls >= n, timeout=timeout_s)

    @property
    def polls(self) -> int:
        return self._polls

    def __enter__(self) -> PoolWatchdog:
        import ray

        self._job = ray.get_runtime_context().get_job_id()
        # Pools of earlier runs in this driver (`longdoc eval` runs one per method) are
        # dead by now: only actors created from here on are this run's.
        self._earlier = {a["ActorID"] for a in self._pool()}
        if threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(WATCHDOG_SIGNAL, self._on_signal)
            self._signal = WATCHDOG_SIGNAL
        self._active = True
        self._last_progress = time.monotonic()
        self._thread = threading.Thread(target=self._watch, name="longdoc-pool-watchdog", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        # The main thread has left the guarded body: an interrupt that fired has landed
        # (that is how it left) or no longer matters; no follow-up signal, and the
        # handler raises nothing from here on.
        self._acknowledged.set()
        with self._lock:
            self._active = False
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(30.0, 2 * self.poll_s))
        if self._signal == WATCHDOG_SIGNAL:
            signal.signal(WATCHDOG_SIGNAL, self._previous_handler)
            self._signal = signal.SIGINT

    def _on_signal(self, _signum: int, _frame: Any) -> None:
        """The main thread's handler of WATCHDOG_SIGNAL: leave the guarded body."""
        if self.fired and not self._acknowledged.is_set():
            raise _Fired()

    def _pool(self) -> list[dict]:
        from ray._private import state

        earlier = getattr(self, "_earlier", set())
        return [
            a for a in state.actors().values()
            if a.get("JobID") == self._job and self.marker in str(a.get("ActorClassName", ""))
            and a.get("ActorID") not in earlier
        ]

    def _waiting_note(self, n: int, waited_s: float) -> str:
        """``waiting_note`` for ``n`` actors waiting ``waited_s`` for a node."""
        each = ", ".join(f"{_amount(k, v)} {k}" for k, v in sorted(self.required.items())) or "its resources"
        limit = f" of {self.pending_timeout_s:.0f} s (resources.schedule_timeout_s)" if self.pending_timeout_s else ""
        return f"{n} generate actor(s) wait for a node with {each} free: {waited_s:.0f} s{limit}"

    def _nodes(self) -> list[dict[str, float]]:
        import ray

        return [dict(n.get("Resources") or {}) for n in ray.nodes() if n.get("Alive")]

    def _watch(self) -> None:
        seen, dead_since, waiting_since = False, None, None
        while not self._stop.wait(self.poll_s):
            try:
                pool = self._pool()
            except Exception:  # noqa: BLE001 - a GCS hiccup must not kill the watchdog
                continue
            now = time.monotonic()
            reason, error = None, PoolLost
            waiting = [a for a in pool if waiting_for_a_node(a)]
            running = [a for a in pool if a.get("State") in _LIVE_STATES and not waiting_for_a_node(a)]
            if any(a.get("State") == "ALIVE" for a in pool):
                self.saw_alive.set()
            if running:
                seen, dead_since, waiting_since = True, None, None
                self.waiting_note = ""
            elif waiting:
                seen, dead_since = True, None
                waiting_since = waiting_since or now
                self.waiting_note = self._waiting_note(len(waiting), now - waiting_since)
                if self.pending_timeout_s is not None and (
                    now - max(waiting_since, self._last_progress) >= self.pending_timeout_s
                ):
                    try:
                        nodes = self._nodes()
                    except Exception:  # noqa: BLE001
                        nodes = []
                    reason = describe_unschedulable(self.required, nodes, now - waiting_since)
                    error = PoolUnschedulable
            elif seen or pool:  # every actor of the pool is dead
                waiting_since = None
                dead_since = dead_since or now
                if now - max(dead_since, self._last_progress) >= self.grace_s:
                    reason = (
                        f"every generate actor ({len(pool)}) is dead and Ray will not restart them "
                        f"(resources.max_retries exhausted); no rows for {self.grace_s:.0f}s"
                    )
            with self._polled:
                self._polls += 1
                self._polled.notify_all()
            if reason is None:
                continue
            with self._lock:
                if not self._active:
                    return
                self.fired, self.reason, self.error = True, reason, error
                _thread.interrupt_main(self._signal)
            # interrupt_main only lands when the main thread next runs Python code; one
            # blocked in a C call never sees it. A real signal also breaks a blocking call.
            if not self._acknowledged.wait(self.follow_up_s):
                signal.pthread_kill(threading.main_thread().ident, self._signal)
            return


def guarded(watchdog: PoolWatchdog, iterate: Callable[[], T]) -> T:
    """Run ``iterate()`` under ``watchdog``; its interrupt becomes PoolLost / PoolUnschedulable."""
    try:
        with watchdog:
            return iterate()
    except _Fired:
        watchdog._acknowledged.set()
        raise watchdog.error(watchdog.reason) from None
    except KeyboardInterrupt:
        if not watchdog.fired:
            raise
        watchdog._acknowledged.set()
        raise watchdog.error(watchdog.reason) from None

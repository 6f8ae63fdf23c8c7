"""The generate actors' engines, as the Ray runner's progress line sees them.

Why: on the Ray runner each engine lives inside a Ray Data actor (pipeline/stage_actors.py
``GenerateStage``), so the driver saw nothing of it until rows were written: a long Finch
pass looked like a hang, and the ETA could only use the rows-written rate. Each generate
actor posts its engine's numbers (stages/decoding/snapshot.py ``EngineSnapshot``) to a
small board actor; the driver reads the board without ever blocking its progress tick.

Contract:
- ``EngineBoard`` (a Ray actor, ``num_cpus=0``) keeps each reporter's latest report and the
  time it arrived, on the board's own clock (reporters on other nodes need no common
  clock). ``reports()`` returns the reports younger than ``STALE_S``: a dead actor stops
  posting, so its last report leaves the sums within ``STALE_S``; a restarted actor posts
  under its own id again and replaces it.
- ``open_board(name)`` (driver) creates the run's board, named ``board_name(run_id)``
  (the name the plan hands the generate actors), and returns a ``BoardView``. ``view.activity()`` is ``"engine: ..."`` (``"<n> engines:
  ..."`` with several reporters; snapshot.py ``engines_line``) or "" before any report;
  ``view.progress()`` is the summed ``EngineSnapshot.progress()`` tuple, or None before
  any report (pipeline/progress.py ``RunProgress.activity``/``engine``). Neither blocks:
  one read of the board is in flight at a time, looked at with ``ray.wait(timeout=0)``
  and issued again at most every ``READ_EVERY_S``; a board that fails or is gone leaves
  the last reports read until they are ``STALE_S`` old, then nothing. ``close()`` kills the
  board; the view then says nothing.
- ``post_reports(name, snapshot, stop)`` (generate actor, on a daemon thread) posts
  ``snapshot()`` every ``POST_EVERY_S`` until ``stop`` is set, fire-and-forget (a post
  still unanswered skips the next one), and never raises: a lost board never fails a row.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from stages.decoding.snapshot import EngineSnapshot, engines_line

log = logging.getLogger("longdoc")

STALE_S = 30.0  # a report older than this (a dead or stuck actor) leaves the sums
POST_EVERY_S = 1.0  # how often a generate actor posts: the line lags the engine by ~3 s at most (post, read, tick)
READ_EVERY_S = 1.0  # how often the driver asks the board (its progress tick is 1 s)
BOARD_PREFIX = "longdoc-engine-board-"


def board_name(run_id: str) -> str:
    """A name for run ``run_id``'s board (a named Ray actor in the driver's namespace): the
    run id, and a suffix of its own, so a run id used again in the same Ray (a resumed run,
    a test) never meets an earlier board."""
    return f"{BOARD_PREFIX}{run_id}-{uuid.uuid4().hex[:6]}"


class EngineBoard:
    """The latest report of each generate actor (module contract); a Ray actor's class."""

    def __init__(self, stale_s: float = STALE_S) -> None:
        self.stale_s = stale_s
        self._reports: dict[str, tuple[float, dict[str, Any]]] = {}

    def post(self, reporter: str, snapshot: dict[str, Any]) -> None:
        """``reporter``'s engine now (``asdict`` of an EngineSnapshot)."""
        self._reports[reporter] = (time.monotonic(), snapshot)

    def reports(self) -> list[dict[str, Any]]:
        """The reports younger than ``stale_s``, one per reporter; older ones are dropped."""
        now = time.monotonic()
        self._reports = {k: v for k, v in self._reports.items() if now - v[0] < self.stale_s}
        return [snap for _, snap in self._reports.values()]


def _remote_board():
    import ray

    return ray.remote(num_cpus=0, max_restarts=0)(EngineBoard)


def open_board(name: str, stale_s: float = STALE_S) -> BoardView:
    """Create the board named ``name`` (``board_name``; Ray is up) and return the driver's
    view of it."""
    board = _remote_board().options(name=name).remote(stale_s)
    return BoardView(board, stale_s, name=name)


class BoardView:
    """The driver's view of a board: never blocks (module contract). Thread-safe: the
    progress line asks from its tick thread and from the main thread."""

    def __init__(self, board: Any, stale_s: float = STALE_S, clock: Callable[[], float] = time.monotonic,
                 name: str = "") -> None:
        self.board, self.stale_s, self.clock, self.name = board, stale_s, clock, name
        self._lock = threading.Lock()
        self._pending: Any = None  # the read in flight (an ObjectRef), if any
        self._asked = float("-inf")  # when it was issued
        self._reports: list[EngineSnapshot] = []
        self._read_at: float | None = None  # when the reports held were read
        self._said = False
        self._closed = False

    def _poll(self) -> None:
        import ray

        with self._lock:
            if self._closed:
                self._reports = []
                return
            now = self.clock()
            try:
                if self._pending is not None:
                    ready, _ = ray.wait([self._pending], timeout=0)
                    if ready:
                        ref, self._pending = self._pending, None
                        self._reports = [EngineSnapshot.from_dict(d) for d in ray.get(ref)]
                        self._read_at = now
                if self._pending is None and now - self._asked >= READ_EVERY_S:
                    self._pending, self._asked = self.board.reports.remote(), now
            except Exception as e:  # noqa: BLE001 - the line only: the run never fails for it
                self._pending = None
                if not self._said:
                    self._said = True
                    log.debug("the engine board could not be read (%s: %s)", type(e).__name__, e)
            if self._read_at is not None and now - self._read_at >= self.stale_s:
                self._reports, self._read_at = [], None  # a board gone quiet: its numbers are old

    def snapshots(self) -> list[EngineSnapshot]:
        """The engines' latest reports as last read (one per live generate actor)."""
        self._poll()
        return list(self._reports)

    def activity(self) -> str:
        """``"engine: ..."`` / ``"<n> engines: ..."`` summed over the reports; "" before any."""
        snaps = self.snapshots()
        return engines_line(EngineSnapshot.total(snaps), len(snaps)) if snaps else ""

    def progress(self) -> tuple[int, int, int, int, float] | None:
        """The summed engines' ``progress()`` tuple; None before any report."""
        snaps = self.snapshots()
        return EngineSnapshot.total(snaps).progress() if snaps else None

    def close(self) -> None:
        """Take the read in flight (so no unread error is left behind) and kill the board."""
        import ray

        with self._lock:
            try:
                if self._pending is not None:
                    ray.wait([self._pending], timeout=2.0)
                    ray.get(self._pending, timeout=0.1)
            except Exception:  # noqa: BLE001 - an answer no one needs any more
                pass
            self._pending, self._closed = None, True
            try:
                ray.kill(self.board)
            except Exception:  # noqa: BLE001 - gone already
                pass


def post_reports(name: str, snapshot: Callable[[], EngineSnapshot], stop: threading.Event,
                 every_s: float = POST_EVERY_S) -> None:
    """Post ``snapshot()`` to board ``name`` every ``every_s`` seconds until ``stop`` is set
    (module contract); run it on a daemon thread of the generate actor."""
    import ray

    board = None
    pending = None
    reporter = ""
    said = False
    while True:
        try:
            if board is None:
                board = ray.get_actor(name)
                reporter = ray.get_runtime_context().get_actor_id() or threading.current_thread().name
            if pending is not None:
                ready, _ = ray.wait([pending], timeout=0)
                if ready:
                    pending = None
                    ray.get(ready[0])  # a board gone raises here, not as an unread error later
            if pending is None:
                pending = board.post.remote(reporter, asdict(snapshot()))
        except Exception as e:  # noqa: BLE001 - a lost board must not fail a row
            board, pending = None, None
            if not said:
                said = True
                log.info("progress reports to the driver stopped for now (%s: %s); rows go on",
                         type(e).__name__, e)
        if stop.wait(every_s):
            return

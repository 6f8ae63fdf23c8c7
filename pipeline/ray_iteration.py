"""The driver's iteration over the Ray Data plan, and a stop after which none of its tasks runs.

Contract: ``PlanIteration(ds)()`` yields the dataset's figure tables (pyarrow, one per
block the write stage staged) in the calling thread; Ray's own iteration runs on a
thread of its own (``longdoc-ray-plan``). ``stop()`` (once it ran to its end, a no-op; also run
when the consumer closes the iteration early, not when an exception leaves it: the
consumer stops then, once it has handled the exception) returns once Ray's execution of
the plan has ended: every task and actor of it finished or killed, so no write task of
the run stages a block after ``stop`` returns.

Why (pipeline/runner.py, an interrupted run): the run's record counts the blocks its write
tasks staged, the ones the iteration had not handed over yet included, by listing the
staging folder. Ray Data's write stage runs in other processes; a listing made while
one of them could still stage a block undercounted the record (seen: 2 rows recorded,
4 staged). Ray Data 2.60 left three ways for that:
- an interrupt (KeyboardInterrupt) raised in the main thread while it waits inside
  Ray's iterator for the first block (``_ClosingIterator.get_next``) makes Ray shut its
  executor down with ``force=False``: tasks are cancelled by an interrupt in their
  worker and not waited for (a write under way, e.g. an upload on fsspec's own
  thread, still lands), and a later ``shutdown(force=True)`` is a no-op. Here the
  interrupt lands in this module's queue wait instead, never in Ray's code;
- ``StreamingExecutor.shutdown(force=True)`` cancels every active task by force (its
  worker is killed) but does not wait for a map task to end: it ``ray.get``s the
  task's ObjectRefGenerator, which returns at once. ``stop`` notes the tasks before
  the shutdown (it forgets them) and waits for each to end (``completed()``);
- the shutdown joins its scheduling loop for 2 s only: a loop step still under way then
  may dispatch a task after the cancels. ``stop`` waits for the loop thread to end,
  then for the tasks it left too.
Left: a task dispatched in the instant between ``stop``'s note and Ray's cancel is
killed, not waited for; it cannot have staged a block in that instant (its worker has
yet to receive its input and write a Parquet file).
The executor is found by its thread (Ray names it ``StreamingExecutor-<dataset id>``):
Ray Data gives the consumer no handle on it before the first block arrives, which is
exactly when an interrupt is most likely (tests/pipeline/test_ray_iteration.py pins
this down, so a Ray upgrade that renames it fails there, not silently).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("longdoc")

#: How long ``stop`` waits for Ray's iteration thread to end once the executor is shut down.
STOP_WAIT_S = 120.0
#: How often the consumer's wait wakes: ``_thread.interrupt_main`` (pipeline/watchdog.py)
#: lands only when the main thread runs Python code.
WAKE_S = 0.5


class PlanIteration:
    """See the module docstring. One iteration per object."""

    def __init__(self, ds: Any) -> None:
        self._ds = ds
        self._pump: threading.Thread | None = None
        self._stopped = False  # a stop ran to its end: a later one returns at once
        self._deadline: float | None = None  # the first stop's: a later one, after an interrupted first, keeps it

    def __call__(self) -> Iterator[Any]:
        """Yield the figure tables of ``ds`` (``iter_batches(batch_size=None, pyarrow)``)."""
        out: queue.SimpleQueue = queue.SimpleQueue()

        def pump() -> None:
            try:
                # Never left early, even once stopped: closing Ray's iterator shuts its executor
                # down from here too, racing ``stop``'s note of the tasks it has to wait for.
                # The iteration ends when ``stop`` has shut the executor down.
                for batch in self._ds.iter_batches(batch_size=None, batch_format="pyarrow"):
                    out.put((batch, None))
            except BaseException as e:  # noqa: BLE001 - Ray's error is the consumer's to raise
                out.put((None, e))
                return
            out.put((None, None))

        self._pump = threading.Thread(target=pump, name="longdoc-ray-plan", daemon=True)
        self._pump.start()
        try:
            while True:
                try:
                    batch, error = out.get(timeout=WAKE_S)
                except queue.Empty:
                    continue
                if error is not None:
                    raise error
                if batch is None:
                    break
                yield batch
        except GeneratorExit:
            # The consumer left early: ``close``, or an exception raised in its loop's body (its
            # frame unwinding closes this generator before the consumer's handler runs). A
            # signal cutting this stop short leaves the rest to the consumer's own (``stop``).
            self.stop()
            raise
        # An exception raised here (an interrupt in the wait above, the watchdog's, Ray's error)
        # leaves the stop to the consumer (pipeline/runner.py): the watchdog must first hear
        # its interrupt landed, or it signals again into a stop under way.
        self.stop()  # the plan ended: returns at once

    def stop(self) -> None:
        """Stop Ray's execution of the plan; returns once no task of it can stage a block, or
        after ``STOP_WAIT_S`` from the first call in all (with a warning). A stop that ran to
        its end is not run again; one cut short (a signal landed in it: a generator's close
        runs it while an exception unwinds, before the runner's handler) is carried on by the
        next call, to the same deadline."""
        pump = self._pump
        if pump is None or self._stopped:
            return
        if self._deadline is None:
            self._deadline = time.monotonic() + STOP_WAIT_S
        deadline = self._deadline
        # Until Ray's iteration has ended: an executor not started at the first look (Ray
        # still planning) is found at a later one, its tasks noted and waited for alike.
        while pump.is_alive() and time.monotonic() < deadline:
            for executor in self._executors():
                _shut_down(executor, deadline)
            pump.join(0.1)
        self._stopped = True
        if pump.is_alive():
            log.warning("longdoc: Ray's iteration did not end within %.0f s of the stop", STOP_WAIT_S)

    def _executors(self) -> list[Any]:
        """The live streaming executors of this dataset (any execution index)."""
        dataset = self._ds.get_dataset_id().rpartition("_")[0]  # less the execution index
        prefix = f"StreamingExecutor-{dataset}_"
        return [t for t in threading.enumerate()
                if t.name.startswith(prefix) and callable(getattr(t, "shutdown", None))]


def _shut_down(executor: Any, deadline: float) -> None:
    """Shut ``executor`` down by force and wait (until ``deadline``, monotonic) for every
    task it dispatched to end."""
    import ray

    def left() -> float:
        return max(deadline - time.monotonic(), 0.0)

    try:
        running = _active_tasks(executor)  # before the shutdown, which forgets them
        executor.shutdown(force=True)  # cancels each by force (its worker killed), kills the pools
        executor.join(left())  # its loop has ended: nothing is dispatched any more
        running += _active_tasks(executor)  # dispatched by a step still under way
        # A map task's waitable is its ObjectRefGenerator: ready at its next output, not
        # at its end; ``completed()`` is ready when the task has ended (or was killed).
        ends = {(w.completed() if isinstance(w, ray.ObjectRefGenerator) else w): None for w in running}
        if ends:
            ray.wait(list(ends), num_returns=len(ends), timeout=left(), fetch_local=False)
    except Exception as e:  # noqa: BLE001 - a stop must not turn an interrupt into a crash
        log.warning("longdoc: stopping Ray's execution: %s: %s", type(e).__name__, e)


def _active_tasks(executor: Any) -> list[Any]:
    """The waitables of the tasks ``executor``'s operators have running."""
    return [task.get_waitable() for op in list(getattr(executor, "_topology", {}))
            for task in op.get_active_tasks()]

"""pipeline/ray_iteration.py: an interrupt while the driver waits for Ray's first block stops
the plan's execution, and no task of it stages a block once ``stop`` has returned.

Real Ray (the session's embedded instance), a real dataset whose map stage stages its block
slowly, the way an upload to an object store goes on fsspec's own thread while the task's
thread waits for it, and a real SIGINT to this process. Before the fix the interrupt landed
in Ray's iterator, which shut its executor down without force: the write task was
interrupted, its upload went on, and its block appeared after the runner had counted the
staged blocks (an interrupted run's record undercounted its rows).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from pipeline.ray_iteration import PlanIteration

UPLOAD_S = 10.0  # how long staging one block takes: far longer than the stop


def _slow_stage(staged: Path, started: Path):
    """A map_batches function staging each block ``UPLOAD_S`` after it starts, on a thread."""

    def stage(batch):
        import uuid

        name = uuid.uuid4().hex
        (started / name).touch()

        def upload() -> None:
            time.sleep(UPLOAD_S)
            tmp = staged / f".{name}.tmp"
            tmp.write_bytes(b"block")
            os.replace(tmp, staged / f"{name}.staged")

        worker = threading.Thread(target=upload)
        worker.start()
        worker.join()
        return batch

    return stage


def test_an_interrupt_before_the_first_block_leaves_no_write_under_way(ray_session, tmp_path, caplog):
    import ray.data

    staged, started = tmp_path / "staged", tmp_path / "started"
    staged.mkdir()
    started.mkdir()
    ds = ray.data.range(2, override_num_blocks=2).map_batches(
        _slow_stage(staged, started), batch_size=None, num_cpus=0.25)
    plan = PlanIteration(ds)

    signalled: list[float] = []

    def interrupt() -> None:  # once a write is under way, as the runner's SIGINT lands
        deadline = time.monotonic() + 120
        while not any(started.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.05)
        signalled.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=interrupt, daemon=True).start()
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            for _ in plan():  # no block comes before the interrupt: each takes UPLOAD_S
                pytest.fail("a block arrived before the interrupt")
        plan.stop()  # as the runner does once it has the interrupt
        assert any(started.iterdir()), "the interrupt came before any write started"
        stopped = time.monotonic() - t0
        counted = set(staged.iterdir())  # what the runner's listing sees after the stop
        # The stop ended the write under way (its worker killed), not waited it out: a stop
        # that found no executor (a Ray that renamed its thread) would return only once the
        # plan had ended, every block staged, at least UPLOAD_S after the write started.
        assert counted == set(), "the stop waited for the write instead of ending it"
        assert time.monotonic() - signalled[0] < UPLOAD_S - 2, "the stop waited for the plan to end"
        time.sleep(UPLOAD_S + 2)
        assert set(staged.iterdir()) == counted, (
            f"a block was staged after the stop ({stopped:.1f} s after the start)")
        # The stop found Ray's executor and waited for its tasks without a hitch.
        assert not [r for r in caplog.records if r.name == "longdoc"], caplog.text
    finally:
        signal.signal(signal.SIGINT, previous)
    plan.stop()  # a stop that ran to its end: a no-op



def test_a_tasks_error_is_raised_in_the_consumers_loop(ray_session):
    """A task's error reaches the consumer as an exception, not as an iteration that just
    ends, which the runner would take for a plan run to its end."""
    import ray.data

    def boom(batch):
        raise ValueError("boom in a map task")

    plan = PlanIteration(ray.data.range(1).map_batches(boom, batch_size=None, num_cpus=0.25))
    with pytest.raises(Exception, match="boom in a map task"):
        for _ in plan():
            pass
    plan.stop()  # as the runner does once it has the error

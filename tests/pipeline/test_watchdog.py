"""The driver-side watchdog: a dead generate pool aborts the wait; a live one is left alone.

Real Ray (the session's embedded instance), a real actor killed with ray.kill; the
"hang" is a loop that would wait 60 s, as Ray Data's scheduling loop can forever.
"""

from __future__ import annotations

import time

import pytest

from pipeline.watchdog import PoolLost, PoolWatchdog, guarded


def _probe_actor():
    import ray

    @ray.remote(max_restarts=0, num_cpus=0)
    class GenerateStageProbe:
        def ping(self) -> int:
            return 1

    actor = GenerateStageProbe.remote()
    ray.get(actor.ping.remote())
    return actor


def test_a_dead_pool_turns_the_endless_wait_into_an_abort(ray_session):
    import ray

    watchdog = PoolWatchdog(marker="GenerateStageProbe", grace_s=1.0, poll_s=0.2)

    def hang() -> str:
        actor = _probe_actor()  # the pool starts inside the run, as Ray Data's does
        time.sleep(0.5)
        ray.kill(actor)
        t = time.monotonic()
        while time.monotonic() - t < 60:  # what Ray Data's loop does when the pool is gone
            time.sleep(0.05)
        return "finished"

    t = time.monotonic()
    with pytest.raises(PoolLost, match="every generate actor .* is dead"):
        guarded(watchdog, hang)
    assert watchdog.fired and time.monotonic() - t < 30


def test_a_main_thread_blocked_in_a_c_call_is_interrupted_too(ray_session):
    """interrupt_main never lands in a blocking C call (a lock wait here); the watchdog's
    follow-up SIGINT does."""
    import threading

    import ray

    watchdog = PoolWatchdog(marker="GenerateStageProbe", grace_s=1.0, poll_s=0.2)

    def blocked() -> str:
        actor = _probe_actor()
        time.sleep(0.5)
        ray.kill(actor)
        threading.Event().wait(90)  # one C-level wait, no Python code runs meanwhile
        return "finished"

    t = time.monotonic()
    with pytest.raises(PoolLost):
        guarded(watchdog, blocked)
    assert time.monotonic() - t < 45


def test_a_live_pool_and_a_finished_run_are_left_alone(ray_session):
    import ray

    watchdog = PoolWatchdog(marker="GenerateStageProbe", grace_s=0.5, poll_s=0.1)
    actors = []

    def work() -> str:
        actors.append(_probe_actor())
        for _ in range(15):  # 1.5 s: three grace periods, the pool alive throughout
            time.sleep(0.1)
        return "finished"

    assert guarded(watchdog, work) == "finished"
    ray.kill(actors[0])  # after the run: the watchdog is stopped and must not fire
    time.sleep(1.0)
    assert not watchdog.fired


def test_an_earlier_runs_dead_pool_is_not_this_runs(ray_session):
    import ray

    earlier = _probe_actor()
    ray.kill(earlier)  # e.g. `longdoc eval`: the previous method's pool, dead before this run
    time.sleep(0.5)
    watchdog = PoolWatchdog(marker="GenerateStageProbe", grace_s=0.3, poll_s=0.1)

    def slow_start() -> str:
        time.sleep(1.5)  # this run's pool is still loading its model: no actor yet
        return "finished"

    assert guarded(watchdog, slow_start) == "finished" and not watchdog.fired

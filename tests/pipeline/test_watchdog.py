"""The driver-side watchdog: a dead or unplaceable generate pool aborts the wait; a live one,
or one still loading its model, is left alone.

Real Ray (the session's embedded instance), real actors killed with ray.kill. Every step
waits for an event (the watchdog has seen the actor alive, has evaluated the pool N
times, an actor reached a state, a file exists), never for a time: the tests cannot pass
or fail by how fast the machine is. The "hang" is a loop that would wait 120 s, as Ray
Data's scheduling loop can forever; its bound only turns a broken watchdog into a failure.
"""

from __future__ import annotations

import threading
import time

import pytest

from pipeline.watchdog import (
    PoolLost,
    PoolUnschedulable,
    PoolWatchdog,
    describe_unschedulable,
    guarded,
)

HANG_S = 120.0  # a bound on the simulated endless wait, not a synchronisation


def _probe_class(**options):
    import ray

    @ray.remote(max_restarts=0, num_cpus=0, **options)
    class GenerateStageProbe:
        def __init__(self, gate: str | None = None) -> None:
            import os

            # A model that loads until the test says so: the constructor waits for a file.
            while gate and not os.path.exists(gate):
                threading.Event().wait(0.05)

        def ping(self) -> int:
            return 1

    return GenerateStageProbe


def _probe_actor():
    import ray

    actor = _probe_class().remote()
    ray.get(actor.ping.remote())
    return actor


def _endless_wait() -> str:
    """What Ray Data's loop does when the pool is gone: Python code that never returns."""
    never = threading.Event()
    t = time.monotonic()
    while not never.wait(0.05) and time.monotonic() - t < HANG_S:
        pass
    return "finished"


def _wait_for_state(actor, state: str, timeout_s: float = 60.0) -> None:
    from ray._private import state as gcs

    actor_id = actor._actor_id.hex()
    done = threading.Event()
    deadline = time.monotonic() + timeout_s
    while not done.wait(0.05):
        if gcs.actors().get(actor_id, {}).get("State") == state:
            return
        assert time.monotonic() < deadline, f"actor never reached {state}"


def test_a_dead_pool_turns_the_endless_wait_into_an_abort(ray_session):
    import ray

    watchdog = PoolWatchdog(marker="GenerateStageProbe", grace_s=0.0, poll_s=0.1)

    def hang() -> str:
        actor = _probe_actor()  # the pool starts inside the run, as Ray Data's does
        assert watchdog.saw_alive.wait(60), "the watchdog never saw the pool alive"
        ray.kill(actor)
        return _endless_wait()

    with pytest.raises(PoolLost, match="every generate actor .* is dead") as info:
        guarded(watchdog, hang)
    assert watchdog.fired and type(info.value) is PoolLost


def _blocked_in_a_c_call(watchdog: PoolWatchdog):
    """A run body that starts the pool, kills it once the watchdog saw it, then blocks in
    one C-level wait (no Python code runs meanwhile) until HANG_S."""

    def blocked() -> str:
        import ray

        actor = _probe_actor()
        assert watchdog.saw_alive.wait(60)
        ray.kill(actor)
        threading.Event().wait(HANG_S)
        return "finished"

    return blocked


def test_a_main_thread_blocked_in_a_c_call_is_interrupted_too(ray_session):
    """interrupt_main never lands in a blocking C call (a lock wait here); the watchdog's
    follow-up signal does."""
    watchdog = PoolWatchdog(marker="GenerateStageProbe", grace_s=0.0, poll_s=0.1, follow_up_s=0.5)
    with pytest.raises(PoolLost):
        guarded(watchdog, _blocked_in_a_c_call(watchdog))


def test_a_live_pool_and_a_finished_run_are_left_alone(ray_session):
    import ray

    watchdog = PoolWatchdog(marker="GenerateStageProbe", grace_s=0.0, poll_s=0.05)
    actors = []

    def work() -> str:
        actors.append(_probe_actor())
        assert watchdog.saw_alive.wait(60)
        # Five more evaluations of the live pool, each with no batch for longer than the grace.
        assert watchdog.wait_for_polls(watchdog.polls + 5)
        return "finished"

    assert guarded(watchdog, work) == "finished"
    assert not watchdog._thread.is_alive()  # stopped and joined when the run ended
    ray.kill(actors[0])  # after the run: nothing watches any more
    _wait_for_state(actors[0], "DEAD")
    assert not watchdog.fired


def test_an_earlier_runs_dead_pool_is_not_this_runs(ray_session):
    import ray

    earlier = _probe_actor()
    ray.kill(earlier)  # e.g. `longdoc eval`: the previous method's pool, dead before this run
    _wait_for_state(earlier, "DEAD")
    watchdog = PoolWatchdog(marker="GenerateStageProbe", grace_s=0.0, poll_s=0.05)

    def slow_start() -> str:
        assert watchdog.wait_for_polls(5)  # this run's pool has not started yet
        return "finished"

    assert guarded(watchdog, slow_start) == "finished" and not watchdog.fired


def test_a_pool_no_node_can_take_aborts_naming_the_resource(ray_session, tmp_path):
    """An actor needing a resource no node has stays pending for ever; the watchdog ends the
    wait after pending_timeout_s. One whose constructor runs (a model loading) is alive."""
    import ray

    need = {"CPU": 1.0, "no_such_accelerator": 1.0}
    watchdog = PoolWatchdog(marker="GenerateStageProbe", grace_s=0.0, poll_s=0.05,
                            pending_timeout_s=0.5, required=need)
    gate = tmp_path / "model-loaded"

    def hang() -> str:
        pending = _probe_class(resources={"no_such_accelerator": 1}).remote()
        assert pending is not None
        return _endless_wait()

    with pytest.raises(PoolUnschedulable, match="no_such_accelerator") as info:
        guarded(watchdog, hang)
    msg = str(info.value)
    assert "missing on every node: no_such_accelerator 1 (the most one node has: 0)" in msg
    assert "CPU 8" in msg and "resources.schedule_timeout_s" in msg
    # Meanwhile the progress line said what the pool waited for (pipeline/runner.py).
    assert watchdog.waiting_note.startswith("1 generate actor(s) wait for a node with 1 CPU, 1 no_such_accelerator free: ")
    assert watchdog.waiting_note.endswith(" s (resources.schedule_timeout_s)")

    # A constructor that runs for as long as it likes: the actor has a worker process, so
    # it is not waiting for a node, and the watchdog leaves it alone.
    # (The timeout is armed once the worker process exists: starting one takes seconds, and
    # a real timeout of minutes covers that; here only "constructing is not waiting" is tested.)
    watchdog = PoolWatchdog(marker="GenerateStageProbe", grace_s=0.0, poll_s=0.05,
                            pending_timeout_s=None, required={"CPU": 1.0})
    slow = []

    def load_slowly() -> str:
        slow.append(_probe_class().remote(str(gate)))
        from ray._private import state as gcs

        actor_id = slow[0]._actor_id.hex()
        t = time.monotonic()
        while not gcs.actors().get(actor_id, {}).get("Pid"):  # event: its worker process exists
            threading.Event().wait(0.05)
            assert time.monotonic() - t < 60
        watchdog.pending_timeout_s = 0.2
        assert watchdog.wait_for_polls(watchdog.polls + 10)  # 10 looks while it loads: > 0.2 s
        gate.write_text("done")  # the model is loaded
        ray.get(slow[0].ping.remote())
        return "finished"

    assert guarded(watchdog, load_slowly) == "finished" and not watchdog.fired
    ray.kill(slow[0])


def test_the_unschedulable_message_names_what_is_missing_and_what_nodes_have():
    nodes = [{"CPU": 8.0, "memory": 4 * 2**30, "node:127.0.0.1": 1.0, "object_store_memory": 1e8},
             {"CPU": 2.0, "worker_pool": 1.0}]
    msg = describe_unschedulable({"CPU": 1.0, "GPU": 0.5}, nodes, 601)
    assert "after 601s" in msg and "each needs CPU 1, GPU 0.5" in msg
    assert "missing on every node: GPU 0.5 (the most one node has: 0)" in msg
    assert "have: CPU 8, memory 4.0 GiB; CPU 2, worker_pool 1." in msg and "127.0.0.1" not in msg
    both = describe_unschedulable({"CPU": 4.0, "worker_pool": 1.0}, nodes, 5)
    assert "no single node has all of them free at once" in both


def test_the_abort_lands_in_a_driver_that_ignores_sigint(ray_session):
    """A driver started in the background by a non-interactive shell (cron, a CI script,
    `cmd &`) inherits SIGINT ignored: the watchdog's own signal still lands, in a blocking
    C call too, and the previous handlers are back afterwards."""
    import signal

    from pipeline.watchdog import WATCHDOG_SIGNAL

    watchdog = PoolWatchdog(marker="GenerateStageProbe", grace_s=0.0, poll_s=0.1, follow_up_s=0.5)
    before_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    before_own = signal.getsignal(WATCHDOG_SIGNAL)
    try:
        t = time.monotonic()
        with pytest.raises(PoolLost):
            guarded(watchdog, _blocked_in_a_c_call(watchdog))
        assert time.monotonic() - t < HANG_S
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN and signal.getsignal(WATCHDOG_SIGNAL) == before_own
    finally:
        signal.signal(signal.SIGINT, before_int)

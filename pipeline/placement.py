"""Where a run runs: the runner it takes, the CPUs its generate actors get, the Ray it joins
or starts, and whether its model stages fit there.

Contract:
- ``resolve_runner(runner, spec, address)``: ``ray`` or ``local`` as asked; ``auto`` picks
  ``local`` (pipeline/local_plan.py, this process, no Ray) without a Ray cluster and with one
  generate actor, else ``ray`` (pipeline/plan.py). ``cluster_address`` is the cluster a run
  joins (``--address``, else ``$RAY_ADDRESS``; None: this machine).
- ``with_actor_cpus(spec, runner, address)``: the spec with ``resources.num_cpus`` a number
  (``auto``: this machine's ``usable_cores()`` for a run on it, shared by the generate
  actors; 1 on a cluster).
- ``crowded_note(spec, address)``: words for a run on this machine whose generate actors
  outnumber its cores (each engine holds a model copy and they share the cores), else None.
- ``starved_io_note(spec, nodes)``: words for a run on a cluster whose model stages' actors
  hold every CPU, so the read and write tasks wait, else None.
- ``check_fits(spec, runner)``: every model stage fits this machine (``local``: its GPUs;
  ``ray``: the embedded Ray's nodes), else ValueError naming the field and the fix.
- ``init_ray(address, spec)``: joins the cluster (refused at once where nothing answers at
  the address, or named when the connection fails) or starts an embedded Ray of its own,
  keeping this process's interrupt handlers; True when it started one.
pipeline/runner.py runs the job wherever these put it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import threading

from pipeline.choices import RUNNERS
from schemas.spec import JobSpec


def actor_resources(spec: JobSpec) -> dict[str, float]:
    """What Ray must find on one node for one generate actor (CPU, GPU, custom resources)."""
    from pipeline.plan import model_stages

    return model_stages(spec)[-1].needs()


def check_fits(spec: JobSpec, runner: str) -> None:
    """The one fit check, before anything is read or written: every model stage of the plan
    (pipeline/plan.py ``model_stages``, as both runners fold them) must fit this machine.

    ``runner`` ``ray`` (the embedded Ray: nothing will be added): each stage's CPUs, GPUs and
    custom resources against the alive nodes' (ValueError naming what is missing).
    ``local`` (one process, no scheduler): each stage's GPUs against the GPUs this machine
    has (ValueError naming the field); CPUs and custom resources are Ray's to schedule."""
    from pipeline.plan import model_stages

    stages = [st for st in model_stages(spec) if runner == "ray" or st.num_gpus > 0]
    if not stages:
        return
    if runner == "ray":
        import ray

        from pipeline.watchdog import describe_unschedulable

        nodes = [dict(n.get("Resources") or {}) for n in ray.nodes() if n.get("Alive")]
        for st in stages:
            need = st.needs()
            if not any(all(n.get(k, 0.0) >= v for k, v in need.items()) for n in nodes):
                raise ValueError(describe_unschedulable(need, nodes, 0.0).replace(
                    "after 0s (resources.schedule_timeout_s)", "on this machine (embedded Ray)").replace(
                    "a generate actor", f"a {st.name} actor"))
        return
    from stages.decoding.backends import accelerator_count

    have = accelerator_count()
    for st in stages:
        if math.ceil(st.num_gpus) > have:
            here = f"{st.gpu_field}: 0 (on the CPU)" if have == 0 else f"{st.gpu_field} <= {have}"
            raise ValueError(f"{st.gpu_field}: {st.num_gpus:g} GPU(s) asked; this machine has {have}; allowed: "
                             f"{here} here, or a Ray cluster with GPUs (--address or $RAY_ADDRESS)")


def starved_io_note(spec: JobSpec, nodes: list[dict]) -> str | None:
    """A note (the run works, late) when the model stages' actors at their pools' smallest
    hold every CPU of the cluster's alive ``nodes`` (ray.nodes()): Ray then runs the read and
    write tasks (pipeline/plan.py ``IO_TASK_CPUS`` each) only while an actor lets go, so rows
    are staged late and an interrupt keeps fewer (a trial's `resources.num_cpus` equal to its
    node's 2 cores: Ray's "Cluster resources are not enough" warning, 93 s against 30 s)."""
    from pipeline.plan import IO_TASK_CPUS, model_stages

    total = sum(float((n.get("Resources") or {}).get("CPU", 0.0)) for n in nodes if n.get("Alive"))
    held = sum(st.num_cpus * (st.actors if isinstance(st.actors, int) else st.actors[0])
               for st in model_stages(spec))
    if not total or held + IO_TASK_CPUS <= total:
        return None
    return (f"note: the model stages' actors hold {held:g} of the {total:g} CPU(s) the cluster has now (an "
            "autoscaler may add more): Ray runs the "
            f"read and write tasks ({IO_TASK_CPUS:g} CPU each) only while an actor lets go, so rows are staged "
            "late (an interrupt keeps fewer) and Ray may warn that cluster resources are not enough; fix: a "
            "smaller resources.num_cpus (leave a core for them), fewer actors, or more nodes")


def crowded_note(spec: JobSpec, address: str | None) -> str | None:
    """A note (not a refusal: the run works) when ``resources.actors`` on this machine exceeds
    its usable cores: the engines only share the cores, so the extra ones add no speed and
    each holds a copy of the model (a trial ran 6 actors on 2 cores)."""
    actors, cores = spec.resources.max_actors, usable_cores()
    if cluster_address(address) is not None or actors <= cores or spec.resources.num_gpus > 0:
        return None  # a cluster's nodes are not this machine's; on GPUs each actor has its own
    return (f"resources.actors {actors} on this machine's {cores} core(s): the engines share the cores, so "
            f"more than {cores} add no speed and each holds a copy of {spec.generation.model!r}; "
            f"fix: resources.actors {cores}, or a Ray cluster (--address)")


def cluster_address(address: str | None) -> str | None:
    """The Ray cluster a run joins: ``address``, else ``$RAY_ADDRESS``; None: the embedded Ray."""
    return address or os.environ.get("RAY_ADDRESS")


def usable_cores() -> int:
    """The cores a run on this machine may use: ``OMP_NUM_THREADS`` when set (the caller chose
    a thread count, as `make test` does), else the CPUs this process may be scheduled on."""
    try:
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    except (KeyError, ValueError):
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def with_actor_cpus(spec: JobSpec, runner: str, address: str | None) -> JobSpec:
    """``spec`` with ``resources.num_cpus`` a number for this run (``auto`` resolved by
    ResourcesSpec.cpus_per_actor: this machine's cores for the in-process runner's one engine
    or shared by an embedded Ray's generate actors, 1 on a cluster), so the plan, the generate
    actors' torch threads and the run record use one figure.

    Why not a fixed default: a laptop run of a spec without the field read with one of its
    cores (the in-process runner is the only work on the machine)."""
    res = spec.resources
    if res.num_cpus != "auto":
        return spec
    cores = None if cluster_address(address) else usable_cores()
    cpus = res.cpus_per_actor(cores, 1 if runner == "local" else res.max_actors)
    return spec.model_copy(update={"resources": res.model_copy(update={"num_cpus": cpus})})


def resolve_runner(runner: str, spec: JobSpec, address: str | None) -> str:
    """The runner a run uses: ``ray`` or ``local`` as asked; ``auto``: ``local`` when the run
    has no Ray cluster (no ``address``, no ``$RAY_ADDRESS``) and one generate actor
    (``resources.actors: 1``), else ``ray``.

    Why local then: an embedded Ray on one machine runs the same single engine, and its
    processes only compete with it for the cores (pipeline/local_plan.py has the
    figures); a cluster, or a pool of several actors, is what Ray is for.
    """
    if runner not in RUNNERS:
        raise ValueError(f"runner {runner!r} is not one of {', '.join(RUNNERS)}")
    if runner != "auto":
        return runner
    return auto_runner(spec.resources.actors, address)


def auto_runner(actors: int | list[int] | tuple[int, int], address: str | None) -> str:
    """``auto``'s choice for a generate pool of ``actors`` (``resources.actors``): ``local``
    without a Ray cluster (``address``, ``$RAY_ADDRESS``) for one actor, else ``ray``."""
    return "local" if cluster_address(address) is None and actors == 1 else "ray"


def init_ray(address: str | None, spec: JobSpec) -> bool:
    """Connect to (or start) Ray; True when this call started an embedded Ray."""
    import ray

    if ray.is_initialized():
        return False
    with _our_signal_handlers():
        return _start_ray(ray, address, spec)


@contextlib.contextmanager
def _our_signal_handlers():
    """Keep this process's SIGINT and SIGTERM handlers across ``ray.init``.

    Why: ray.init installs a SIGTERM handler of its own (``sys.exit(15)``), and Ray's core
    native ones (absl's failure handler: a stack dump and a killed driver) over Python's.
    Putting ours back, at the Python and the C level alike, lets an interrupt reach
    run_job (pipeline/cli.py's RunInterrupted), so the run is recorded and exits 143.
    """
    main = threading.current_thread() is threading.main_thread()
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            if handler is not None:
                signal.signal(signum, handler)


def _start_ray(ray, address: str | None, spec: JobSpec) -> bool:
    """init_ray's body: ray.init on a cluster or embedded."""
    from pipeline.ray_console import (
        MODEL_STACK_ENV,
        quiet_native_stderr,
        quiet_python_loggers,
        quiet_worker_tracebacks,
    )

    address = cluster_address(address)
    env = dict(MODEL_STACK_ENV)
    quiet_python_loggers()  # Ray's console chatter off unless LONGDOC_RAY_LOGS=1 (--verbose)
    if address:
        _reachable(address)
        try:
            ray.init(address=address, runtime_env={"env_vars": env}, log_to_driver=True)
        except ConnectionError as e:  # an OSError: not the storage failure the CLI would call it
            auth = os.environ.get("RAY_AUTH_MODE", "unset")
            raise ValueError(
                f"--address {address}: cannot connect to the Ray cluster ({e}); fix: give the head's GCS "
                "address (host:6379 by default; the Jobs API's http://host:8265 is `longdoc submit`'s), "
                f"and for a cluster with token authentication (RAY_AUTH_MODE is {auth} here) set "
                "RAY_AUTH_MODE=token and RAY_AUTH_TOKEN") from None
        quiet_native_stderr()
        quiet_worker_tracebacks()
        return False
    # Embedded Ray: logical CPUs are a scheduling budget, not cores. Give every actor
    # pool its slot plus room for read/write tasks, so pools never wait on each other.
    res = spec.resources
    max_actors = res.max_actors
    logical = max(os.cpu_count() or 1, int(max_actors * res.cpus_per_actor(usable_cores(), max_actors)
                                           + res.compress_actors + 2) + 1)
    # The spec's custom resources exist on the embedded node, so a spec written for a
    # cluster (actors pinned to labelled nodes) runs unchanged on one machine.
    custom = {k: float(v) * max_actors for k, v in res.custom_resources.items()}
    ray.init(
        # "local": a new instance even where a `ray start` cluster runs on this machine (without
        # it ray.init attaches to that one and refuses num_cpus); --address names a cluster.
        address="local",
        num_cpus=logical,
        resources=custom or None,
        include_dashboard=False,
        runtime_env={"env_vars": env},
        log_to_driver=True,
        logging_level=logging.WARNING,
    )
    quiet_native_stderr()  # after ray.init: Ray's own processes must not inherit the filter
    quiet_worker_tracebacks()
    return True


def _reachable(address: str, timeout_s: float = 3.0) -> None:
    """ValueError naming ``address`` when nothing answers at its host and port: ray.init waits
    on an address where nothing listens for minutes (over ten, seen here) before it fails.
    ``auto`` and addresses without a port are left to Ray."""
    import socket

    hostport = address.rpartition("://")[2].rstrip("/")  # ray://host:10001, or a bare host:port
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise ValueError(f"--address {address}: nothing answers there ({e.strerror or e}); fix: give the Ray "
                         "head's address (host:6379 by default), or run without --address and $RAY_ADDRESS "
                         "on this machine") from None

"""Run a job: skip finished requests, execute the plan (on Ray, or in this process), commit, summarise.

Contract: ``run_job`` returns a RunResult once every request of the run date has
exactly one row in the output table (written now or by an earlier run of the date):
- Reruns heal: requests with a row are skipped, except error rows picked by
  ``retry_errors`` (default ``retryable``: infrastructure failures), which are redone
  and REPLACE their old row (stages/partition.py ``commit_date``); never a duplicate.
- Ray giving up (actor restarts / task retries exhausted) does not lose rows: every
  request without a row becomes an error row with ``error_kind`` retryable and the
  reason, the summary says ``status: failed``, and the next run retries them.
- Blocks are staged while the run goes and published (compacted) at its end; rows
  staged by a crashed run are published at the start of the next one.
- The run summary JSON lands atomically at ``{output}.runs/{run_date}/{run_id}.json``
  (stages/layout.py ``run_record_path``; pipeline/report/summary.py ``run_summary`` lists
  its fields), beside the output root, never in it: the root holds only the
  ``run_date=D/*.parquet`` rows, so Polars, pandas, DuckDB and Spark read the folder
  without options. Staged blocks and the ledger live in ``{output}.runs/`` too.
- The input is listed once (``stages.read.list_shards``, before Ray starts) and read
  once (the read stage); the abort path and the progress total take the run's requests
  from the read stage's ledger (stages/ledger.py), never from the input again.
- An input row repeated exactly (same id, text and question: the same request_id) is
  one request: it gets one row, published once, counted once (``duplicates`` in the
  summary counts the repeats dropped).
- Two runners of the same stages (``resolve_runner``): ``ray`` (the Ray Data plan of
  pipeline/plan.py, on a cluster or an embedded Ray) and ``local`` (pipeline/local_plan.py,
  one process, no Ray: what ``auto`` picks on one machine with one generate actor). Both
  write the same staged blocks, rows, summary and run record; an exception of the local
  plan takes the abort path below like Ray giving up.
- An interrupt (SIGINT, or SIGTERM raised as ``RunInterrupted`` by pipeline/cli.py) while
  the stages run stops the engine after its step in hand and keeps every staged row
  staged (nothing is published, no error rows are made): the summary says ``status:
  interrupted`` (``interrupted_by``: the signal) and the run record is written; the next
  run of the date publishes the staged rows first and does only the rest. One that lands
  while the rows are published is recorded the same way (the publish resumes next run).
- A run resumed under the same run id (``--run-id``, an eval's ``--eval-id``) keeps the
  earlier attempts' records: its summary lists them in ``earlier_attempts`` (start, end,
  wall time, rows, status) and ``wall_s_all_attempts`` sums their wall times with its own,
  the time the run id's rows cost.
- A generate pool that no node can take (a GPU or custom resource the cluster lacks)
  fails at once on the embedded Ray (``ValueError`` naming the resource, nothing
  written), and on a cluster after ``resources.schedule_timeout_s`` without a placed
  actor (an abort like the others: retryable rows, status failed, the message names
  the resource and what the nodes have).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa

from pipeline.choices import RUNNERS
from pipeline.report.summary import RunTally, package_versions, run_record_json, run_summary
from schemas.output import (
    FILE_SCHEMA,
    RETRY_POLICIES,
    RETRYABLE,
    SCHEMA_VERSION,
    output_row,
    rows_to_table,
)
from schemas.spec import JobSpec
from stages.layout import run_record_path, staging_dir
from stages.ledger import clear as clear_ledger
from stages.ledger import read_ledger
from stages.partition import commit_date, scan_date
from stages.read import list_shards
from stages.write import TEXT_COLUMNS, staged_file_name, write_bytes_atomic, write_table_atomic

log = logging.getLogger("longdoc")
MISSING_BLOCK_ROWS = 10_000  # error rows of an aborted run staged per file
LEDGER_LOOK_S = 10.0  # how often the progress line looks for a complete ledger (one listing)


class RunInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM during a run, raised in the main thread (pipeline/cli.py's handler)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass
class RunResult:
    run_id: str
    run_date: str
    output_uri: str
    summary: dict[str, Any]
    skipped: int = 0


def today_utc() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d")


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]


def output_root(spec: JobSpec, run_date: str) -> str:
    return spec.output.uri.replace("{job}", spec.name).replace("{run_date}", run_date)


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


@contextlib.contextmanager
def _interrupts_held():
    """Within the block SIGINT and SIGTERM are noted, not raised; yields the list of those
    that arrived (signal numbers), for the caller to act on after the block.

    Why: between the last row and the run record the runner closes the progress line and
    builds the summary; an interrupt raised there would leave the run without a record
    (it came in at any point once the rows were done: the faster the machine, the likelier).
    A second signal in the block goes to the handler the block replaced (pipeline/cli.py's
    raises RunInterrupted, and the command exits without waiting for the record): a storage
    listing that hangs here must not make the process deaf.
    Outside the main thread (no handlers can be set there) the block runs as is.
    """
    arrived: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield arrived
        return
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def note(signum: int, frame) -> None:
        previous = saved[signal.Signals(signum)]
        if arrived and callable(previous):
            previous(signum, frame)
        arrived.append(signum)

    for signum in saved:
        signal.signal(signum, note)
    try:
        yield arrived
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def _start_ray(ray, address: str | None, spec: JobSpec) -> bool:
    """init_ray's body: ray.init on a cluster or embedded."""
    from pipeline.progress import MODEL_STACK_ENV, quiet_native_stderr, quiet_python_loggers

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


# What a resumed run keeps of each earlier attempt of its run id.
ATTEMPT_FIELDS = ("started_at", "finished_at", "wall_s", "rows", "failed", "skipped", "status")


def _earlier_attempts(root: str, run_date: str, run_id: str) -> list[dict[str, Any]]:
    """The attempts recorded under ``run_id`` before this one, oldest first ([] for a new id)."""
    from pipeline.report.load import read_run_record

    record = read_run_record(root, run_date, run_id)
    if not record:
        return []
    last = record.get("summary", {})
    return [*last.get("earlier_attempts", []), {k: last.get(k) for k in ATTEMPT_FIELDS}]


def run_job(
    spec: JobSpec,
    run_date: str | None = None,
    run_id: str | None = None,
    address: str | None = None,
    progress: bool = True,
    retry_errors: str = "retryable",
    runner: str = "ray",
    timeline: dict[str, Any] | None = None,
) -> RunResult:
    """Run ``spec`` for ``run_date``; see the module docstring for the contract.

    ``retry_errors``: which error rows already written for the date are retried
    (``all`` | ``retryable`` (error_kind retryable) | ``none``). ``runner``: ``ray``
    (the Ray Data plan, pipeline/plan.py, on ``address`` or an embedded Ray) or
    ``local`` (the same stages in this process, pipeline/local_plan.py; no Ray is
    imported); ``resolve_runner`` picks one for ``auto``. ``timeline``: the local
    plan's stamps and engine figures, for benchmarks.
    """
    if retry_errors not in RETRY_POLICIES:
        raise ValueError(f"--retry-errors {retry_errors!r} is not one of {', '.join(RETRY_POLICIES)}")
    if runner not in ("ray", "local"):
        raise ValueError(f"runner {runner!r} is not one of ray, local")
    from pipeline.plan import spec_problems

    problems = spec_problems(spec)  # a budget that can never fit: refused before anything runs
    if problems:
        raise ValueError("; ".join(problems))
    spec = with_actor_cpus(spec, runner, address)
    started_at = _now_iso()
    run_date = run_date or today_utc()
    run_id = run_id or new_run_id()
    root = output_root(spec, run_date)
    # The input is listed here, once, and the list handed on (plan, progress, abort path).
    # First of all: a missing prefix, bad credentials or a FIFO fail before Ray starts or
    # anything is written.
    shards = list_shards(spec.input, run_date)
    # Read before the stages run: after them, an interrupt must find nothing left to do but
    # write the record.
    earlier = _earlier_attempts(root, run_date, run_id)
    if runner == "local":
        check_fits(spec, "local")

    from pipeline.progress import RunProgress, ledger_total

    # Rows a crashed earlier run left staged are published first: staging then holds
    # only this run's blocks, and the skip set below sees every row ever written.
    commit_date(root, run_date, run_id)
    clear_ledger(root, run_date)  # a crashed run's ledger describes another run's requests
    before = scan_date(root, run_date)
    skip = before.skip(retry_errors)
    retried = len(before.rows) - len(skip)
    next_ledger_look = time.monotonic()

    def look_ledger() -> None:
        """The total of a JSONL/Parquet corpus: known once the read stage has read it all."""
        nonlocal next_ledger_look
        if bar.enabled and bar.total is None and time.monotonic() >= next_ledger_look:
            next_ledger_look = time.monotonic() + LEDGER_LOOK_S
            ledger = read_ledger(root, run_date, run_id)
            if ledger.complete(len(shards)):
                bar.total = ledger_total(ledger.iter_requests(spec, shards, run_id, run_date), skip)

    stop_engine = None  # the Ray runner's engines end with Ray (pipeline/cli.py shuts it down)
    if runner == "ray":
        batches, guard = _ray_batches(spec, address, progress, run_id, run_date, root, skip, shards)
        # After Ray's start: its console filter decides which stream the line goes to.
        bar = RunProgress.for_run(spec, len(shards), len(skip), enabled=progress)
    else:
        bar = RunProgress.for_run(spec, len(shards), len(skip), enabled=progress)
        from pipeline.local_plan import LocalPlan

        # In one process the engine is at hand: the line says what it holds between rows.
        def on_wait() -> None:  # the total appears as soon as the ledger has it, before the first row
            look_ledger()
            bar.tick()

        local = LocalPlan(spec, run_id, run_date, root, skip, shards, timeline, on_wait=on_wait)
        batches, guard, bar.activity = local.batches, None, local.activity
        stop_engine = local.stop
    t0 = time.perf_counter()  # after Ray's start; the models load after this, in both runners
    n_shards = len(shards)
    _say(progress, f"longdoc: run {run_id} date {run_date}: {n_shards} input file(s), "
         f"{len(skip)} request(s) already done, {retried} error row(s) to retry "
         f"(--retry-errors {retry_errors}); output {root}"
         + ("; runner local: in this process, no Ray" if runner == "local" else "")
         + f"; {spec.resources.num_cpus:g} CPU(s) per generate actor")
    tally = RunTally()  # the run's aggregates, folded block by block: not the rows
    seen_ids: set[str] = set()  # request ids written by this run: a repeat is dropped
    duplicates = 0
    abort: BaseException | None = None
    interrupted: KeyboardInterrupt | None = None

    def iterate() -> None:
        nonlocal duplicates
        for batch in batches():
            if guard is not None:
                guard.progress()
            ids = batch.column("request_id").to_pylist()
            fresh = []
            for i, rid in enumerate(ids):  # a repeat may sit in the same batch as its first
                if rid not in seen_ids:
                    seen_ids.add(rid)
                    fresh.append(i)
            if len(fresh) < len(ids):  # an input row repeated exactly: one request, one row
                duplicates += len(ids) - len(fresh)
                batch = batch.take(fresh)
            tally.add(batch)
            look_ledger()
            bar.update(tally.rows, tally.failed, int(tally.sums["output_tokens"]))

    try:
        # The watchdog (pipeline/watchdog.py) turns Ray Data's occasional endless wait on
        # a dead actor pool, or on one no node can take, into an abort like Ray's own.
        if guard is None:
            iterate()
        else:
            from pipeline.watchdog import guarded

            guarded(guard, iterate)
    except KeyboardInterrupt as e:  # SIGINT, or SIGTERM as RunInterrupted (pipeline/cli.py)
        interrupted = e
        if stop_engine is not None:
            stop_engine()
    except Exception as e:  # Ray gave up (actor restarts/task retries exhausted, node lost)
        abort = e
    with _interrupts_held() as arrived:
        bar.activity = None  # the last line counts rows only
        bar.close()
    if arrived and interrupted is None:  # after the last row, before publishing: not published
        interrupted = RunInterrupted(arrived[0])
    if abort is not None:
        # Never a missing row: every request without one becomes a retryable error row.
        tally.add(write_missing_as_errors(spec, root, run_date, run_id, abort, shards))
    stale: frozenset[str] = frozenset()
    if abort is None and interrupted is None:
        # A complete run yields every request of its input: an error row it was asked to
        # retry and did not produce again is no longer a request (e.g. a file that failed
        # to read as a whole now reads, and its documents have rows of their own).
        stale = frozenset(set(before.rows) - skip - seen_ids)
    commit = {"staged_files": 0, "files_written": 0}
    if interrupted is None:
        try:
            commit = commit_date(root, run_date, run_id, stale=stale)
            clear_ledger(root, run_date)
        except KeyboardInterrupt as e:
            # An interrupt while publishing: commit_date resumes where it stopped (rows
            # already swapped in are recognised), so the next run finishes the publish;
            # this run is still recorded, as interrupted.
            interrupted = e
    # else: staged rows stay staged; the next run of the date publishes them first
    # The record is written whatever arrives now; an interrupt after publishing is moot
    # (the run is complete, and the process ends as soon as it returns).
    with _interrupts_held():
        wall = time.perf_counter() - t0
        # The date as a whole (this run plus earlier runs it resumed or healed): a rerun
        # that only fills gaps must not hide rows that failed before; each request once.
        after = scan_date(root, run_date).counts()
        summary = run_summary(tally, wall_s=wall, date_counts=after, aborted=abort)
        if interrupted is not None:
            summary.update(status="interrupted", interrupted_by=str(interrupted) or "SIGINT")
        summary.update(run_id=run_id, run_date=run_date, job=spec.name, skipped=len(skip), retried=retried,
                       retry_errors=retry_errors, schema_version=SCHEMA_VERSION, output_uri=root,
                       started_at=started_at, finished_at=_now_iso(), staged_blocks=commit["staged_files"],
                       files_written=commit["files_written"], duplicates=duplicates, versions=package_versions())
        if earlier:  # a resumed run id: its first attempts' times are not overwritten
            summary.update(earlier_attempts=earlier,
                           wall_s_all_attempts=wall + sum(a.get("wall_s") or 0.0 for a in earlier))
        write_bytes_atomic(run_record_json(summary, spec.model_dump(mode="json")),
                           run_record_path(root, run_date, run_id))
    return RunResult(run_id, run_date, root, summary, skipped=len(skip))


def _ray_batches(spec: JobSpec, address: str | None, progress: bool, run_id: str, run_date: str,
                 root: str, skip: frozenset[str], shards: list[str]):
    """Start (or join) Ray and build the Ray Data plan: (a function iterating its figure
    tables, the watchdog that guards the iteration)."""
    import ray.data

    from pipeline.plan import build_plan
    from pipeline.progress import quiet_issue_detectors, ray_logs_wanted
    from pipeline.watchdog import PoolWatchdog

    if init_ray(address, spec):  # keeps our interrupt handlers (_our_signal_handlers)
        check_fits(spec, "ray")
    ctx = ray.data.DataContext.get_current()
    # Order only where it changes which rows exist: input.limit keeps the FIRST documents.
    # Elsewhere the rows' order is no contract (README: match by doc_id and prompt), and an
    # ordered run holds every finished block behind the slowest earlier one: the first
    # staged block then waits for the first input file's read, however many files run.
    ctx.execution_options.preserve_order = spec.input.limit is not None
    # One progress line of our own (pipeline/progress.py); Ray Data's bars only with --verbose.
    ctx.enable_progress_bars = progress and sys.stderr.isatty() and ray_logs_wanted()
    quiet_issue_detectors(ctx)  # Ray's repeated high-memory warning; see its docstring
    if "RAY_DATA_EXECUTION_NO_PROGRESS_TIMEOUT_S" not in os.environ:
        # Ray Data aborts a dataset whose operators emit nothing for 30 min; one batch of
        # long documents on CPU can legitimately take that long (seen: 4 x 5k-token
        # prefills on a shared core). Deadlines belong to the scheduler (RayJob
        # activeDeadlineSeconds, see pipeline/ops/render.py); the env var still overrides.
        # A pool that can never be placed is the watchdog's (resources.schedule_timeout_s).
        ctx.execution_no_progress_timeout_s = -1
    ds, _ = build_plan(spec, run_id, run_date, root, skip, shards)
    watchdog = PoolWatchdog(pending_timeout_s=spec.resources.schedule_timeout_s,
                            required=actor_resources(spec))
    return (lambda: ds.iter_batches(batch_size=None, batch_format="pyarrow")), watchdog

def write_missing_as_errors(spec: JobSpec, root: str, run_date: str, run_id: str, err: BaseException,
                            shards: list[str]) -> pa.Table:
    """Stage a retryable error row for every request of the run that has no row.

    The requests come from the read stage's ledger (stages/ledger.py), with one
    placeholder per input file it had not finished: the input is not read again.
    Runs only when the run aborted. Returns the staged rows' figures (FILE_SCHEMA less
    the text columns), staged in files of at most MISSING_BLOCK_ROWS rows.
    """
    have = set(scan_date(root, run_date).rows)
    reason = f"run aborted before this request was written ({type(err).__name__}: {_reason(err)})"
    rows: list[dict[str, Any]] = []
    staged: list[pa.Table] = []

    def stage() -> None:  # a block at a time: the ledger is read block by block too
        table = rows_to_table(rows, FILE_SCHEMA)
        name = staged_file_name([r["request_id"] for r in rows])
        write_table_atomic(table, f"{staging_dir(root, run_date)}/{run_id}/{name}")
        staged.append(table.drop_columns(list(TEXT_COLUMNS)))
        rows.clear()

    for req in read_ledger(root, run_date, run_id).iter_requests(spec, shards, run_id, run_date):
        if req["request_id"] not in have:
            have.add(req["request_id"])
            rows.append(output_row(spec, req, error=f"run: {reason}", error_kind=RETRYABLE))
            if len(rows) >= MISSING_BLOCK_ROWS:
                stage()
    if rows:
        stage()
    return pa.concat_tables(staged) if staged else _empty_figures()


def _reason(err: BaseException, limit: int = 500) -> str:
    """The last non-empty line of a (possibly wrapped, multi-line) Ray error: its cause."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return (lines[-1] if lines else "no message")[:limit]


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _empty_figures() -> pa.Table:
    return FILE_SCHEMA.empty_table().drop_columns(list(TEXT_COLUMNS))


def _say(enabled: bool, msg: str) -> None:
    if enabled:
        print(msg, file=sys.stderr, flush=True)

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
- The input is listed once (``stages.listing.list_input``, before Ray starts) and read
  once (the read stage); the abort path and the progress total take the run's requests
  from the read stage's ledger (stages/ledger.py), never from the input again.
- A complete run replaces the date's rows it supersedes (stages/partition.py
  ``superseded``): an earlier spec's rows of the same documents and prompts (another
  model, budget or instruction gives other request ids) and the input-error rows of lines
  since fixed, so a date holds one row per document and prompt of its input, not one
  per spec it was ever run with. The summary counts them (``superseded``).
- A complete date run again (the same spec over the same input files, every request with a
  row it would skip, no error row to retry) is recognised before the input is read, Ray
  starts or a model loads, from the mark the last complete run left (stages/completion.py;
  any run that goes on to run its stages removes it first): it is said, and recorded as a
  run with nothing to do (``nothing_to_do``, ``note``; rows 0, ``skipped`` the input's
  requests), as `longdoc report` lists such runs. Another spec, listing or file stamp, or an
  error row to retry, and the run reads its input as before.
- An input row repeated exactly (same id, text and question: the same request_id) is
  one request: it gets one row, published once, counted once (``duplicates`` in the
  summary counts the repeats dropped).
- Two runners of the same stages (pipeline/placement.py ``resolve_runner``): ``ray`` (the Ray Data plan of
  pipeline/plan.py, on a cluster or an embedded Ray) and ``local`` (pipeline/local_plan.py,
  one process, no Ray: what ``auto`` picks on one machine with one generate actor). Both
  write the same staged blocks, rows, summary and run record; an exception of the local
  plan takes the abort path below like Ray giving up.
- An interrupt (SIGINT, or SIGTERM raised as ``RunInterrupted`` by pipeline/cli.py) while
  the stages run stops the engine after its step in hand and keeps every staged row
  staged (nothing is published, no error rows are made); on the local runner the rows the
  engine had finished are staged then too, whatever batch they sat in, so an interrupt
  loses only the work in hand; on the Ray runner its execution is stopped (every task
  ended or killed) before the run counts the blocks staged, so the record counts every
  row it staged. The summary says ``status:
  interrupted`` (``interrupted_by``: the signal) and the run record is written; the next
  run of the date publishes the staged rows first and does only the rest. One that lands
  while the rows are published is recorded the same way (the publish resumes next run).
- A run resumed under the same run id (``--run-id``, an eval's ``--eval-id``) keeps the
  earlier attempts' records: its summary lists them in ``earlier_attempts`` (start, end,
  wall time, rows, status) and ``wall_s_all_attempts`` sums their wall times with its own,
  the time the run id's rows cost.
- One run writes a date at a time (pipeline/date_lease.py): ``run_job`` takes the date's
  lease before it publishes anything or a model loads, and raises ``DateInUse`` naming a
  live holder. A run whose lease another process took over (it stalled past the lease's
  life) stops at its next block and publishes nothing, recorded as interrupted
  (``interrupted_by: date taken over``, ``taken_over``: why, ``taken_over_by``: the run; or
  ``lease not renewed`` when storage kept it from renewing: a rerun publishes its rows).
- A generate pool that no node can take (a GPU or custom resource the cluster lacks)
  fails at once on the embedded Ray (``ValueError`` naming the resource, nothing
  written), and on a cluster after ``resources.schedule_timeout_s`` without a placed
  actor (an abort like the others: retryable rows, status failed, the message names
  the resource and what the nodes have).
"""

from __future__ import annotations

import contextlib
import logging
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
import pyarrow.compute as pc

from pipeline.date_lease import DateLease
from pipeline.host_load import load_now, shared_threads_note
from pipeline.placement import (
    actor_resources,
    check_fits,
    init_ray,
    starved_io_note,
    with_actor_cpus,
)
from pipeline.report.summary import RunTally, package_versions, run_record_json, run_summary
from schemas.output import (
    FILE_SCHEMA,
    RETRY_POLICIES,
    RETRYABLE,
    SCHEMA_VERSION,
    error_cause,
    output_row,
    rows_to_table,
)
from schemas.spec import JobSpec
from stages.completion import clear_completion, completion_key, read_completion, write_completion
from stages.layout import run_record_path, staging_dir
from stages.ledger import clear as clear_ledger
from stages.ledger import read_ledger
from stages.listing import list_input
from stages.partition import DateScan, RunRequests, commit_date, scan_date, superseded
from stages.write import TEXT_COLUMNS, staged_file_name, write_bytes_atomic, write_table_atomic

log = logging.getLogger("longdoc")
MISSING_BLOCK_ROWS = 10_000  # error rows of an aborted run staged per file
LEDGER_LOOK_S = 10.0  # how often the progress line looks for a complete ledger (one listing)


#: ``interrupted_by`` of a run that lost its date to another process / could not renew its lease.
LEASE_LOST, LEASE_NOT_RENEWED = "date taken over", "lease not renewed"


class DateTakenOver(KeyboardInterrupt):
    """The run lost its date's lease (pipeline/date_lease.py): it stops like an interrupted
    run (staged rows kept) and publishes nothing; the process holding the date does."""


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
    listing = list_input(spec.input, run_date)
    shards = listing.shards
    # Read before the stages run: after them, an interrupt must find nothing left to do but
    # write the record.
    earlier = _earlier_attempts(root, run_date, run_id)
    if runner == "local":
        check_fits(spec, "local")
    # One run of a date at a time (pipeline/date_lease.py): taken before anything is
    # published or any model loads; a live holder raises DateInUse naming it.
    lease = DateLease(root, run_date, run_id, spec.name, say=lambda msg: _say(True, msg))
    lease.acquire()
    try:
        return _run_holding(spec, run_date, run_id, root, shards, earlier, started_at, lease,
                            address=address, progress=progress, retry_errors=retry_errors,
                            runner=runner, timeline=timeline,
                            completion=completion_key(spec, listing.digest))
    finally:
        with _interrupts_held():  # the run is recorded: a signal now must not undo its result
            lease.release()


def _run_holding(spec: JobSpec, run_date: str, run_id: str, root: str, shards: list[str], earlier: list[dict[str, Any]],
                 started_at: str, lease: DateLease, *, address: str | None, progress: bool,
                 retry_errors: str, runner: str, timeline: dict[str, Any] | None,
                 completion: str | None) -> RunResult:
    """``run_job`` once the run holds its date: publish what crashed runs staged, run the
    stages (unless the date is complete: ``_nothing_to_run``), publish this run's rows (only
    while it still holds the date), record the run. ``completion``: the key of this run's
    requests (stages/completion.py ``completion_key``; None: never recognised complete)."""

    from pipeline.progress import RunProgress, ledger_total, ticking

    # Rows a crashed earlier run left staged are published first: staging then holds
    # only this run's blocks, and the skip set below sees every row ever written.
    # Still this process's date (an object store's takeover race), and before each file: else DateInUse.
    lease.ensure()
    commit_date(root, run_date, run_id, check=lease.ensure)
    clear_ledger(root, run_date)  # a crashed run's ledger describes another run's requests
    before = scan_date(root, run_date)
    skip = before.skip(retry_errors)
    retried = len(before.rows) - len(skip)
    # A complete date (every request of this input and spec has a row this run would skip,
    # no error row to retry) is recognised from the mark its last complete run left, before
    # the input is read, Ray starts or a model loads: a scheduler that fired twice, or a
    # rerun after success, took ~20 s of Ray and model start to find every request done.
    done = read_completion(root, run_date, completion, spec, shards) if not retried else None
    if done is not None and done.ids <= skip and not superseded(root, run_date, done):
        return _nothing_to_run(spec, run_date, run_id, root, earlier, started_at, before, done,
                               retry_errors=retry_errors, progress=progress)
    # This run may change the date: a mark holds again only once a run completes.
    clear_completion(root, run_date)
    next_ledger_look = time.monotonic()

    def look_ledger() -> None:
        """The total of a JSONL/Parquet corpus: known once the read stage has read it all."""
        nonlocal next_ledger_look
        if bar.enabled and bar.total is None and time.monotonic() >= next_ledger_look:
            next_ledger_look = time.monotonic() + LEDGER_LOOK_S
            ledger = read_ledger(root, run_date, run_id)
            if ledger.complete(len(shards)):
                bar.total = ledger_total(ledger.iter_requests(spec, shards, run_id, run_date), skip)

    def on_wait() -> None:  # the total appears as soon as the ledger has it, before the first row
        look_ledger()
        bar.tick()

    board = None  # the Ray runner's engine board (pipeline/engine_board.py), made before its iteration
    board_at = None  # ... and its name
    stop_engine = None  # the Ray runner's engines end with Ray (pipeline/cli.py shuts it down)
    stop_ray = None  # ... but its execution is stopped before an interrupted run counts its blocks
    if runner == "ray":
        batches, guard, board_at = _ray_batches(spec, address, progress, run_id, run_date, root, skip, shards)
        stop_ray = batches.stop
        # After Ray's start: its console filter decides which stream the line goes to.
        bar = RunProgress.for_run(spec, len(shards), len(skip), enabled=progress)

        def engines() -> str:  # the board, once made (just before the iteration, below)
            return board.activity() if board is not None else ""

        # A pool no node can take says so on the line (pipeline/watchdog.py); then what the
        # generate actors' engines hold (pipeline/engine_board.py); before their first report
        # and the first rows, what Ray is doing (it was silent there while Ray started).
        bar.activity = lambda: (guard.waiting_note if guard is not None else "") or engines() or (
            "" if bar.rows else "Ray: reading the input, loading the model, decoding the first rows")
        if board_at is not None:  # the ETA counts the engines' work, as the local runner's does
            bar.engine = lambda: board.progress() if board is not None else None
    else:
        bar = RunProgress.for_run(spec, len(shards), len(skip), enabled=progress)
        from pipeline.local_plan import LocalPlan

        # In one process the engine is at hand: the line says what it holds between rows.
        local = LocalPlan(spec, run_id, run_date, root, skip, shards, timeline, on_wait=on_wait)
        batches, guard, bar.activity, bar.engine = local.batches, None, local.activity, local.progress
        stop_engine = local.stop
    # A record that the run started, replaced by its full record at the end: a driver Ray
    # ends without a word (its head node lost) leaves this, and `longdoc report` names the run.
    # Written once Ray is up: a cluster that refuses the run leaves no run behind.
    start_record = {"run_id": run_id, "run_date": run_date, "job": spec.name, "status": "running",
                    "started_at": started_at, "output_uri": root, "retry_errors": retry_errors,
                    "schema_version": SCHEMA_VERSION, **({"earlier_attempts": earlier} if earlier else {})}
    write_bytes_atomic(run_record_json(start_record, spec.model_dump(mode="json")),
                       run_record_path(root, run_date, run_id))
    t0 = time.perf_counter()  # after Ray's start; the models load after this, in both runners
    n_shards = len(shards)
    _say(progress, f"longdoc: run {run_id} date {run_date}: {n_shards} input file(s), "
         f"{len(skip)} row(s) of the date already written (this run skips those it asks again), {retried} error row(s) to retry "
         f"(--retry-errors {retry_errors}); output {root}"
         + ("; runner local: in this process, no Ray" if runner == "local" else "")
         + f"; {spec.resources.num_cpus:g} CPU(s) per generate actor")
    if runner == "local" and not spec.resources.num_gpus:  # a cluster's nodes' load is not this one's
        # The load average is the whole machine's (a container's too), so it is weighed
        # against the machine's CPUs, not the ones this process may use (placement.usable_cores).
        note = shared_threads_note(load_now(), os.cpu_count(), spec.resources.num_cpus)
        if note:
            _say(progress, note)
    tally = RunTally()  # the run's aggregates, folded block by block: not the rows
    seen_ids: set[str] = set()  # request ids written by this run: a repeat is dropped
    duplicates = 0
    abort: BaseException | None = None
    interrupted: KeyboardInterrupt | None = None

    def take(batch) -> None:
        """Fold one written block's figures into the run's tally."""
        nonlocal duplicates
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

    def iterate() -> None:
        # Ray's iteration blocks between batches: a thread keeps the line moving (the local
        # plan ticks it itself while it waits on its engine).
        with ticking(on_wait if runner == "ray" else None, 1.0):
            for batch in batches():
                if guard is not None:
                    guard.progress()
                take(batch)
                if lease.lost:  # another process took the date over: stop as if interrupted
                    raise DateTakenOver(lease.lost_reason)

    if board_at is not None:  # here, so that the close after the iteration always meets it
        board = _open_board(board_at)
    try:  # the board is closed after the iteration; here too when something escapes the handlers
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
                # The rows the engine finished are staged, whatever batch they sat in; a second
                # signal meanwhile exits at once (pipeline/cli.py), with what is staged so far.
                for batch in stop_engine():
                    take(batch)
            if stop_ray is not None:
                # Before the listing below: Ray's write tasks run in other processes, and one
                # still running could stage a block after it (the record then undercounted).
                # Returns once every task of the plan has ended or been killed
                # (pipeline/ray_iteration.py says why that holds); a second signal meanwhile
                # exits at once, as above.
                stop_ray()
            # Blocks Ray's write tasks staged that the iteration had not handed over yet: the
            # run's record counts every row the next run will publish under its id.
            from pipeline.report.load import staged_tables

            try:
                for table in staged_tables(root, run_date, run_id):
                    fresh = table.filter(pc.invert(pc.is_in(table.column("request_id"), pa.array(sorted(seen_ids), pa.string()))))
                    if fresh.num_rows:
                        take(fresh)
            except FileNotFoundError:  # the date's new holder published them meanwhile (DateTakenOver)
                pass
        except Exception as e:  # Ray gave up (actor restarts/task retries exhausted, node lost)
            abort = e
            if stop_ray is not None:
                # Before the missing requests become error rows (write_missing_as_errors): a write
                # task still running could stage the real row of one of them afterwards. A Ray error
                # has usually ended the iteration already (the stop then returns at once); the
                # watchdog's abort lands outside it, with Ray's tasks still running.
                stop_ray()
    except BaseException:
        if board is not None:  # close() may run twice: the normal path closes it below
            with _interrupts_held():  # a signal in its wait must not replace what is raised
                board.close()
        raise
    with _interrupts_held() as arrived:
        bar.activity = bar.engine = None  # the last line counts rows only
        bar.close()
        if board is not None:
            board.close()
    if arrived and interrupted is None:  # after the last row, before publishing: not published
        interrupted = RunInterrupted(arrived[0])
    if abort is not None:
        # Never a missing row: every request without one becomes a retryable error row.
        tally.add(write_missing_as_errors(spec, root, run_date, run_id, abort, shards))
    stale: frozenset[str] = frozenset()
    replaced: frozenset[str] = frozenset()
    skipped = len(skip)  # the date's rows that were done; of this run's requests once its ledger is read
    run_requests = None  # every request of the input (for the date's completion mark): once the run completed
    shared: dict[str, Any] = {}  # ids naming documents of several input files (RunRequests.shared)
    if abort is None and interrupted is None:
        # A complete run yields every request of its input: an error row it was asked to
        # retry and did not produce again is no longer a request (e.g. a file that failed
        # to read as a whole now reads, and its documents have rows of their own).
        stale = frozenset(set(before.rows) - skip - seen_ids)
        # ... and the rows it replaces: an earlier spec's rows of the same documents and
        # prompts, error rows of input lines since fixed (stages/partition.py ``superseded``).
        run_requests = read_ledger(root, run_date, run_id).run_requests(spec, shards, run_id, run_date)
        if run_requests is not None:
            replaced = superseded(root, run_date, run_requests)
            stale |= replaced
            skipped = len(run_requests.ids & skip)
            if run_requests.shared:
                shared = {"shared_ids": run_requests.shared, "shared_id_examples": run_requests.shared_examples}
    commit = {"staged_files": 0, "files_written": 0}
    def held() -> None:
        """Before each file the publish writes: stop it (as an interrupt) once the date is not ours."""
        if not lease.confirm():
            raise DateTakenOver(lease.lost_reason)

    if interrupted is None and not lease.confirm():
        # Another process took the date over (this run stalled past the lease's life), or the
        # lease could not be renewed: the holder publishes what this run staged; publishing
        # here too could publish a row twice.
        interrupted = DateTakenOver(lease.lost_reason)
    if interrupted is None:
        try:
            commit = commit_date(root, run_date, run_id, stale=stale, check=held)
            clear_ledger(root, run_date)
        except KeyboardInterrupt as e:
            # An interrupt while publishing: commit_date resumes where it stopped (rows
            # already swapped in are recognised), so the next run finishes the publish;
            # this run is still recorded, as interrupted.
            interrupted = e
    # else: staged rows stay staged; the next run of the date publishes them first
    if interrupted is None and run_requests is not None and completion is not None:
        with _interrupts_held():  # published: a signal now is moot, the mark goes with the record
            write_completion(root, run_date, completion, run_requests)
    # The record is written whatever arrives now; an interrupt after publishing is moot
    # (the run is complete, and the process ends as soon as it returns).
    with _interrupts_held():
        wall = time.perf_counter() - t0
        # The date as a whole (this run plus earlier runs it resumed or healed): a rerun
        # that only fills gaps must not hide rows that failed before; each request once.
        after = scan_date(root, run_date).counts()
        summary = run_summary(tally, wall_s=wall, date_counts=after, aborted=abort)
        if interrupted is not None:
            if isinstance(interrupted, DateTakenOver):
                taker = lease.taken_by
                summary.update(status="interrupted", interrupted_by=LEASE_LOST if lease.lost else LEASE_NOT_RENEWED,
                               taken_over=str(interrupted), taken_over_by=taker.run_id if taker is not None else None)
            else:
                summary.update(status="interrupted", interrupted_by=str(interrupted) or "SIGINT")
        summary.update(skipped=skipped, retried=retried, superseded=len(replaced),
                       staged_blocks=commit["staged_files"], files_written=commit["files_written"],
                       duplicates=duplicates, **shared)
        _write_run_record(spec, run_date, run_id, root, summary, earlier=earlier, wall=wall,
                          started_at=started_at, retry_errors=retry_errors)
    return RunResult(run_id, run_date, root, summary, skipped=skipped)


def _write_run_record(spec: JobSpec, run_date: str, run_id: str, root: str, summary: dict[str, Any], *,
                      earlier: list[dict[str, Any]], wall: float, started_at: str, retry_errors: str) -> None:
    """Add the fields every run record carries (who ran, when, on which schema and
    versions; a resumed run id's earlier attempts) to ``summary`` and write it as the
    run's record (stages/layout.py ``run_record_path``), replacing the start record where one was written.
    One place for both ways a run ends (``_run_holding``, ``_nothing_to_run``), so a field
    added to the record reaches both."""
    summary.update(run_id=run_id, run_date=run_date, job=spec.name, retry_errors=retry_errors,
                   schema_version=SCHEMA_VERSION, output_uri=root, started_at=started_at,
                   finished_at=_now_iso(), versions=package_versions())
    if earlier:  # a resumed run id: its first attempts' times are not overwritten
        summary.update(earlier_attempts=earlier,
                       wall_s_all_attempts=wall + sum(a.get("wall_s") or 0.0 for a in earlier))
    write_bytes_atomic(run_record_json(summary, spec.model_dump(mode="json")),
                       run_record_path(root, run_date, run_id))


def _nothing_to_run(spec: JobSpec, run_date: str, run_id: str, root: str, earlier: list[dict[str, Any]],
                    started_at: str, before: DateScan, done: RunRequests, *, retry_errors: str,
                    progress: bool) -> RunResult:
    """The run of a complete date (``before``: its scan; ``done``: the completion mark's
    requests, every one with a row): says so, records the run and returns, with nothing read,
    started or loaded.

    The record is the one a run that found every request done always wrote (rows 0,
    ``skipped``: the input's requests, the date's counts; `longdoc report` lists it as
    "nothing left to do"), with ``nothing_to_do`` and a ``note`` saying what the date holds
    and which --retry-errors would redo its error rows.
    """
    t0 = time.perf_counter()
    counts = before.counts()
    redo = []  # what would make it work, when there are error rows
    if counts[f"errors_{RETRYABLE}"] and retry_errors == "none":
        redo.append(f"--retry-errors retryable retries its {counts[f'errors_{RETRYABLE}']} retryable error row(s)")
    if counts["errors_input"] and retry_errors != "all":
        redo.append(f"--retry-errors all retries its {counts['errors_input']} input error row(s) (fix the input first)")
    note = (f"date {run_date} complete: {counts['rows']} row(s), {counts['failed']} failed; every request of "
            f"the input has a row: nothing to run, no model loaded"
            + (f"; {'; '.join(redo)}" if redo else ""))
    _say(progress, f"longdoc: run {run_id}: {note}; output {root}")
    with _interrupts_held():  # the record is written whatever arrives: the run did all it had to
        wall = time.perf_counter() - t0
        summary = run_summary(RunTally(), wall_s=wall, date_counts=counts, aborted=None)
        summary.update(skipped=len(done.ids), retried=0, superseded=0, staged_blocks=0, files_written=0,
                       duplicates=0, nothing_to_do=True, note=note,
                       **({"shared_ids": done.shared, "shared_id_examples": done.shared_examples}
                          if done.shared else {}))
        _write_run_record(spec, run_date, run_id, root, summary, earlier=earlier, wall=wall,
                          started_at=started_at, retry_errors=retry_errors)
    return RunResult(run_id, run_date, root, summary, skipped=len(done.ids))


def _ray_batches(spec: JobSpec, address: str | None, progress: bool, run_id: str, run_date: str,
                 root: str, skip: frozenset[str], shards: list[str]):
    """Start (or join) Ray and build the Ray Data plan: (its iteration, pipeline/ray_iteration.py:
    called, it yields the figure tables; ``stop()`` ends Ray's execution of the plan; the
    watchdog that guards the iteration; the run's engine board, pipeline/engine_board.py,
    which the generate actors report to, or None where it could not be made)."""
    import ray.data

    from pipeline.plan import build_plan
    from pipeline.ray_console import quiet_issue_detectors, ray_logs_wanted
    from pipeline.ray_iteration import PlanIteration
    from pipeline.watchdog import PoolWatchdog

    if init_ray(address, spec):  # keeps our interrupt handlers (_our_signal_handlers)
        check_fits(spec, "ray")
    elif note := starved_io_note(spec, ray.nodes()):  # a cluster of the user's: its CPUs are theirs to set
        _say(True, note)
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
    from pipeline.engine_board import board_name

    board = board_name(run_id) if progress else None  # only the progress line reads it
    ds, _ = build_plan(spec, run_id, run_date, root, skip, shards, engine_board=board)
    watchdog = PoolWatchdog(pending_timeout_s=spec.resources.schedule_timeout_s,
                            required=actor_resources(spec))
    return PlanIteration(ds), watchdog, board


def _open_board(name: str):
    """The driver's view of the run's engine board (pipeline/engine_board.py), made just
    before the iteration that closes it (the generate actors start with the iteration, and
    look for the board until it is there); None where Ray would not make it: the line then
    waits for rows, as it did."""
    from pipeline.engine_board import open_board

    try:
        return open_board(name)
    except Exception as e:  # noqa: BLE001 - the progress line only: the run goes on without it
        log.debug("no engine board for the progress line (%s: %s)", type(e).__name__, e)
        return None

def write_missing_as_errors(spec: JobSpec, root: str, run_date: str, run_id: str, err: BaseException,
                            shards: list[str]) -> pa.Table:
    """Stage a retryable error row for every request of the run that has no row.

    The requests come from the read stage's ledger (stages/ledger.py), with one
    placeholder per input file it had not finished: the input is not read again.
    Runs only when the run aborted. Returns the staged rows' figures (FILE_SCHEMA less
    the text columns), staged in files of at most MISSING_BLOCK_ROWS rows.
    """
    have = set(scan_date(root, run_date).rows)
    reason = f"run aborted before this request was written ({error_cause(err)})"
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


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _empty_figures() -> pa.Table:
    return FILE_SCHEMA.empty_table().drop_columns(list(TEXT_COLUMNS))


def _say(enabled: bool, msg: str) -> None:
    if enabled:
        print(msg, file=sys.stderr, flush=True)

"""Run a job: connect to Ray, skip finished requests, execute the plan, commit, summarise.

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
- The run summary JSON lands atomically at ``{output}/_runs/{run_date}/{run_id}.json``
  (pipeline/report/summary.py ``run_summary`` lists its fields).
"""

from __future__ import annotations

import logging
import os
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa

from pipeline.report.summary import package_versions, run_record_json, run_summary
from schemas.output import (
    FILE_SCHEMA,
    RETRY_POLICIES,
    RETRYABLE,
    SCHEMA_VERSION,
    output_row,
    rows_to_table,
)
from schemas.spec import JobSpec
from stages.partition import commit_date, scan_date
from stages.write import (
    TEXT_COLUMNS,
    staged_file_name,
    staging_dir,
    write_bytes_atomic,
    write_table_atomic,
)

log = logging.getLogger("longdoc")


@dataclass
class RunResult:
    run_id: str
    run_date: str
    output_uri: str
    summary: dict[str, Any]
    skipped: int = 0
    figures: pa.Table | None = field(default=None, repr=False)


def today_utc() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d")


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]


def output_root(spec: JobSpec, run_date: str) -> str:
    return spec.output.uri.replace("{job}", spec.name).replace("{run_date}", run_date)


def init_ray(address: str | None, spec: JobSpec) -> None:
    import ray

    from pipeline.progress import quiet_native_stderr, quiet_python_loggers

    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    env = {"TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    quiet_python_loggers()  # Ray's console chatter off unless LONGDOC_RAY_LOGS=1 (--verbose)
    if address:
        ray.init(address=address, runtime_env={"env_vars": env}, log_to_driver=True)
        quiet_native_stderr()
        return
    # Embedded Ray: logical CPUs are a scheduling budget, not cores. Give every actor
    # pool its slot plus room for read/write tasks, so pools never wait on each other.
    res = spec.resources
    max_actors = res.actors if isinstance(res.actors, int) else res.actors[1]
    logical = max(os.cpu_count() or 1, int(max_actors * res.num_cpus + res.compress_actors + 2) + 1)
    ray.init(
        num_cpus=logical,
        include_dashboard=False,
        runtime_env={"env_vars": env},
        log_to_driver=True,
        logging_level=logging.WARNING,
    )
    quiet_native_stderr()  # after ray.init: Ray's own processes must not inherit the filter


def run_job(
    spec: JobSpec,
    run_date: str | None = None,
    run_id: str | None = None,
    address: str | None = None,
    progress: bool = True,
    retry_errors: str = "retryable",
) -> RunResult:
    """Run ``spec`` for ``run_date``; see the module docstring for the contract.

    ``retry_errors``: which error rows already written for the date are retried
    (``all`` | ``retryable`` (error_kind retryable) | ``none``).
    """
    import ray.data

    from pipeline.plan import build_plan
    from pipeline.progress import RunProgress, quiet_issue_detectors, ray_logs_wanted
    from pipeline.watchdog import PoolWatchdog, guarded
    from stages.read import list_shards

    if retry_errors not in RETRY_POLICIES:
        raise ValueError(f"--retry-errors {retry_errors!r} is not one of {', '.join(RETRY_POLICIES)}")
    started_at = _now_iso()
    run_date = run_date or today_utc()
    run_id = run_id or new_run_id()
    root = output_root(spec, run_date)
    # Rows a crashed earlier run left staged are published first: staging then holds
    # only this run's blocks, and the skip set below sees every row ever written.
    commit_date(root, run_date, run_id)
    before = scan_date(root, run_date)
    skip = before.skip(retry_errors)
    retried = len(before.rows) - len(skip)
    # Listing the input first: a missing prefix or bad credentials fail before Ray starts.
    shards = list_shards(spec.input, run_date)
    init_ray(address, spec)
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True  # input.limit keeps the first documents
    # One progress line of our own (pipeline/progress.py); Ray Data's bars only with --verbose.
    ctx.enable_progress_bars = progress and sys.stderr.isatty() and ray_logs_wanted()
    quiet_issue_detectors(ctx)  # Ray's repeated high-memory warning; see its docstring
    if "RAY_DATA_EXECUTION_NO_PROGRESS_TIMEOUT_S" not in os.environ:
        # Ray Data aborts a dataset whose operators emit nothing for 30 min; one batch of
        # long documents on CPU can legitimately take that long (seen: 4 x 5k-token
        # prefills on a shared core). Deadlines belong to the scheduler (RayJob
        # activeDeadlineSeconds, see pipeline/ops/render.py); the env var still overrides.
        ctx.execution_no_progress_timeout_s = -1
    t0 = time.perf_counter()
    ds, n_shards = build_plan(spec, run_id, run_date, root, skip, shards)
    _say(progress, f"longdoc: run {run_id} date {run_date}: {n_shards} input file(s), "
         f"{len(skip)} request(s) already done, {retried} error row(s) to retry "
         f"(--retry-errors {retry_errors}); output {root}")
    parts: list[pa.Table] = []
    done = failed = out_tokens = 0
    abort: BaseException | None = None
    bar = RunProgress.for_run(spec, run_date, n_shards, len(skip), enabled=progress)
    watchdog = PoolWatchdog()

    def iterate() -> None:
        nonlocal done, failed, out_tokens
        for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
            watchdog.progress()
            parts.append(batch)
            done += batch.num_rows
            failed += batch.num_rows - batch.column("error").null_count
            out_tokens += int(sum(v for v in batch.column("output_tokens").to_pylist() if v))
            bar.update(done, failed, out_tokens)

    try:
        # The watchdog (pipeline/watchdog.py) turns Ray Data's occasional endless wait on
        # a dead actor pool into an abort like the ones Ray raises itself.
        guarded(watchdog, iterate)
    except Exception as e:  # Ray gave up (actor restarts/task retries exhausted, node lost)
        abort = e
    bar.close()
    if abort is not None:
        # Never a missing row: every request without one becomes a retryable error row.
        missing = write_missing_as_errors(spec, root, run_date, run_id, abort)
        parts.append(missing.drop_columns(list(TEXT_COLUMNS)))
    stale: frozenset[str] = frozenset()
    if abort is None:
        # A complete run yields every request of its input: an error row it was asked to
        # retry and did not produce again is no longer a request (e.g. a file that failed
        # to read as a whole now reads, and its documents have rows of their own).
        produced = {rid for t in parts for rid in t.column("request_id").to_pylist()}
        stale = frozenset(set(before.rows) - skip - produced)
    commit = commit_date(root, run_date, run_id, stale=stale)
    wall = time.perf_counter() - t0
    figures = pa.concat_tables(parts, promote_options="permissive") if parts else _empty_figures()
    # The date as a whole (this run plus earlier runs it resumed or healed): a rerun
    # that only fills gaps must not hide rows that failed before; each request once.
    after = scan_date(root, run_date).counts()
    summary = run_summary(figures, wall_s=wall, date_counts=after, aborted=abort)
    summary.update(run_id=run_id, run_date=run_date, job=spec.name, skipped=len(skip), retried=retried,
                   retry_errors=retry_errors, schema_version=SCHEMA_VERSION, output_uri=root,
                   started_at=started_at, finished_at=_now_iso(), staged_blocks=commit["staged_files"],
                   files_written=commit["files_written"], versions=package_versions())
    write_bytes_atomic(run_record_json(summary, spec.model_dump(mode="json")),
                       f"{root.rstrip('/')}/_runs/{run_date}/{run_id}.json")
    return RunResult(run_id, run_date, root, summary, skipped=len(skip), figures=figures)


def write_missing_as_errors(spec: JobSpec, root: str, run_date: str, run_id: str, err: BaseException) -> pa.Table:
    """Stage a retryable error row for every request of the date that has no row.

    Reads the input again on the driver (documents one file at a time, identity
    columns only kept) because the requests never reached the driver; runs only when
    Ray aborted the run. Returns the staged rows (FILE_SCHEMA).
    """
    from stages.read import (
        expand_requests,
        generation_fingerprint,
        list_shards,
        read_shard,
        resolve_uri,
    )

    have = set(scan_date(root, run_date).rows)
    reason = f"run aborted before this request was written ({type(err).__name__}: {_reason(err)})"
    fingerprint = generation_fingerprint(spec)
    root_uri = resolve_uri(spec.input.uri, run_date)
    rows, n_docs = [], 0
    for shard in list_shards(spec.input, run_date):
        for doc in read_shard(shard, spec.input, root_uri):
            if spec.input.limit is not None and n_docs >= spec.input.limit:
                break
            n_docs += 1
            for req in expand_requests(doc, spec, run_id, run_date, fingerprint):
                if req["request_id"] not in have:
                    have.add(req["request_id"])
                    rows.append(output_row(spec, req, error=f"run: {reason}", error_kind=RETRYABLE))
    table = rows_to_table(rows, FILE_SCHEMA)
    if rows:
        name = staged_file_name([r["request_id"] for r in rows])
        write_table_atomic(table, f"{staging_dir(root, run_date)}/{run_id}/{name}")
    return table


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

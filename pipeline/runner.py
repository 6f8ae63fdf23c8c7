"""Run a job: connect to Ray, skip finished requests, execute the plan, summarise.

Contract: ``run_job`` returns a RunResult once every request of the run date has a
row in the output table (written now or by an earlier run with the same outputs).
Reruns are idempotent: request ids already present under ``run_date=D/`` are
skipped, so crashes and reruns never duplicate rows. A run summary JSON lands at
``{output}/_runs/{run_date}/{run_id}.json``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from schemas.output import OUTPUT_SCHEMA, SCHEMA_VERSION
from schemas.spec import JobSpec
from stages.write import partition_dir

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


def completed_request_ids(root: str, run_date: str) -> frozenset[str]:
    """Request ids already written under the run date's partition (any run id)."""
    fs, path = fsspec.core.url_to_fs(partition_dir(root, run_date))
    if not fs.exists(path):
        return frozenset()
    ids: set[str] = set()
    for f in fs.find(path):
        name = f.rsplit("/", 1)[-1]
        if name.endswith(".parquet") and not name.startswith("."):
            with fs.open(f, "rb") as fh:
                ids.update(pq.read_table(fh, columns=["request_id"]).column(0).to_pylist())
    return frozenset(ids)


def partition_counts(root: str, run_date: str) -> tuple[int, int]:
    """(rows, failed rows) under the run date's partition, across all runs."""
    fs, path = fsspec.core.url_to_fs(partition_dir(root, run_date))
    rows = failed = 0
    if fs.exists(path):
        for f in fs.find(path):
            name = f.rsplit("/", 1)[-1]
            if name.endswith(".parquet") and not name.startswith("."):
                with fs.open(f, "rb") as fh:
                    err = pq.read_table(fh, columns=["error"]).column(0)
                rows += len(err)
                failed += len(err) - err.null_count
    return rows, failed


def init_ray(address: str | None, spec: JobSpec) -> None:
    import ray

    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    env = {"TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    if address:
        ray.init(address=address, runtime_env={"env_vars": env}, log_to_driver=True)
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


def run_job(
    spec: JobSpec,
    run_date: str | None = None,
    run_id: str | None = None,
    address: str | None = None,
    progress: bool = True,
) -> RunResult:
    import ray.data

    from pipeline.plan import build_plan
    from pipeline.report.summary import summarize

    run_date = run_date or today_utc()
    run_id = run_id or new_run_id()
    root = output_root(spec, run_date)
    skip = completed_request_ids(root, run_date)
    init_ray(address, spec)
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True  # input.limit keeps the first documents
    ctx.enable_progress_bars = progress and sys.stderr.isatty()
    if "RAY_DATA_EXECUTION_NO_PROGRESS_TIMEOUT_S" not in os.environ:
        # Ray Data aborts a dataset whose operators emit nothing for 30 min; one batch of
        # long documents on CPU can legitimately take that long (seen: 4 x 5k-token
        # prefills on a shared core). Deadlines belong to the scheduler (RayJob
        # activeDeadlineSeconds, see pipeline/ops/render.py); the env var still overrides.
        ctx.execution_no_progress_timeout_s = -1
    t0 = time.perf_counter()
    ds, n_shards = build_plan(spec, run_id, run_date, root, skip)
    _say(progress, f"longdoc: run {run_id} date {run_date}: {n_shards} input file(s), "
         f"{len(skip)} request(s) already done; output {root}")
    parts: list[pa.Table] = []
    done = failed = out_tokens = 0
    for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
        parts.append(batch)
        done += batch.num_rows
        failed += batch.num_rows - batch.column("error").null_count
        out_tokens += int(sum(v for v in batch.column("output_tokens").to_pylist() if v))
        el = time.perf_counter() - t0
        _say(progress, f"  rows {done} (failed {failed}) | {out_tokens} output tokens | "
             f"{done / el:.2f} rows/s, {out_tokens / el:.1f} tok/s | {el:.0f}s")
    wall = time.perf_counter() - t0
    figures = pa.concat_tables(parts, promote_options="permissive") if parts else _empty_figures()
    summary = summarize(figures, wall_s=wall)
    summary.update(run_id=run_id, run_date=run_date, job=spec.name, skipped=len(skip),
                   schema_version=SCHEMA_VERSION, output_uri=root)
    # The date as a whole (this run plus earlier runs it resumed): a rerun that only
    # fills gaps must not hide rows that failed before.
    date_rows, date_failed = partition_counts(root, run_date)
    summary.update(date_rows=date_rows, date_failed=date_failed,
                   date_failed_fraction=date_failed / date_rows if date_rows else 0.0)
    _write_run_summary(root, run_date, run_id, summary, spec)
    return RunResult(run_id, run_date, root, summary, skipped=len(skip), figures=figures)


def _empty_figures() -> pa.Table:
    return OUTPUT_SCHEMA.empty_table()


def _write_run_summary(root: str, run_date: str, run_id: str, summary: dict, spec: JobSpec) -> None:
    fs, path = fsspec.core.url_to_fs(f"{root.rstrip('/')}/_runs/{run_date}/{run_id}.json")
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(path, "w") as f:
        json.dump({"summary": summary, "spec": spec.model_dump(mode="json")}, f, indent=2, default=str)


def _say(enabled: bool, msg: str) -> None:
    if enabled:
        print(msg, file=sys.stderr, flush=True)

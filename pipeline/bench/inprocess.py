"""A job spec run by `longdoc run --runner local`, with the timeline a benchmark needs.

Why: the bench job's longdoc side (pipeline/bench/job.py) with ``--runner local``, and
on GPU benchmark machines, which have torch and transformers but no Ray (infra/README.md,
"GPU night"), runs the product's in-process runner (pipeline/local_plan.py through
pipeline/runner.py ``run_job``: the same rows, summary and run record as `longdoc run
--runner local`) and reports what `longdoc run` does not print: the engine's own
figures (``EngineStats``) and the seconds before the first row, each apart.

Contract: ``python -m pipeline.bench.inprocess SPEC --date D --run-id R --timeline JSON``
runs the spec for date D with run id R and writes the timeline JSON: wall-clock stamps
(``time.time()``) ``t_start`` (this module imported: the interpreter is up),
``t_imported`` (the stages and torch imported), ``t_generate_ready`` (model loaded,
engine warmed up), ``t_first_start`` (the first batch's tokenization began: its
compression counts, as in a row's ``e2e_s``), ``t_first_submit`` (the first request
reached the engine), ``t_last_written`` (the last batch staged), ``t_committed``;
seconds ``generate_init_s``, ``tokenize_init_s``, ``text_stage_init_s``, ``read_s``
(reading the input and expanding it into requests), ``tokenize_s`` and
``text_stage_s`` (spent on the main thread while the engine decodes); ``engine``
(EngineStats as a dict, plus its describe()), ``documents``, ``requests``,
``batches_in_flight``, ``batch_size``, ``rows``, ``failed``, ``status``, ``commit``
(staged files and rows added) and ``output``. One generate engine whatever
``resources.actors`` says. Imports no Ray.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

T_START = time.time()


def run_inprocess(spec_path: str, run_date: str, run_id: str) -> dict:
    """Run the spec (see the module contract); returns the timeline record."""
    from pipeline.runner import run_job
    from schemas.loading import load_spec

    spec = load_spec(spec_path)
    rec: dict = {"t_start": T_START, "runner": "inprocess", "spec": spec_path}
    result = run_job(spec, run_date=run_date, run_id=run_id, progress=False, runner="local", timeline=rec)
    s = result.summary
    rec.update(t_committed=time.time(), rows=s["rows"], failed=s["failed"], status=s["status"],
               commit={"staged_files": s["staged_blocks"], "added": s["rows"]}, output=result.output_uri)
    return rec


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Run a job spec in one process without Ray (bench job's local runner).")
    p.add_argument("spec")
    p.add_argument("--date", required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--timeline", required=True, help="where to write the timeline JSON")
    a = p.parse_args(argv)
    rec = run_inprocess(a.spec, a.date, a.run_id)
    with open(a.timeline, "w") as f:
        json.dump(rec, f, indent=1, default=str)
    print(f"inprocess: {rec['rows']} rows ({rec['failed']} failed) -> {rec['output']}", flush=True)


if __name__ == "__main__":
    main()
    # Everything is written; leave without the interpreter's teardown. Why: a first run that
    # built a kernel and measured the linear plan on the engine's thread once ended in
    # "terminate called without an active exception" (SIGABRT) while finalizing, after its
    # rows and timeline were written, and the bench read the side as failed (pipeline/cli.py
    # ``_exit_now`` has the same reason). Nothing here needs atexit handlers (no Ray).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

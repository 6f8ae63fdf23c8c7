"""pipeline/local_plan.py and the runner choice: the plan's stages in one process.

The local runner must be the Ray plan without Ray: the same rows for the same spec
(tiny model, fp32 greedy), the same abort path (every request a row, retryable, healed
by a rerun), no Ray imported (`auto` choosing it: tests/pipeline/test_placement.py). The
contract checks both runners share (bad inputs, reruns, duplicates, staged blocks,
readers) are tests/pipeline/test_run.py, parametrized by runner.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.local_plan import LocalPlan, batch_end
from pipeline.report.load import load_output
from pipeline.runner import run_job
from schemas.output import RETRYABLE
from schemas.spec import JobSpec

DATE = "2026-03-01"
ROOT = Path(__file__).resolve().parents[2]
# What both runners must agree on, row by row: timings and the run id differ, and so may
# the drafts (the width rule sees which rows share a step), never the greedy text.
SAME = ("doc_id", "prompt", "output_text", "output_tokens", "error", "error_kind",
        "context_tokens", "doc_tokens", "prompt_tokens", "compression_ratio")


def _spec(tmp_path: Path, model: str, out: str = "out", keep_context: bool = False, **resources) -> JobSpec:
    data = tmp_path / "docs.jsonl"
    if not data.exists():
        docs = [{"id": f"d{i}", "text": f"Document {i} is about the river number {i}. " * (6 + 3 * i),
                 "questions": ["Which river?", "What number?"]} for i in range(5)]
        docs.append({"id": "bad", "body": "no text field"})
        data.write_text("\n".join(json.dumps(d) for d in docs))
    return JobSpec.model_validate({
        "name": "local",
        "input": {"uri": str(data), "format": "jsonl", "question_field": "questions"},
        "task": {"kind": "qa"},
        "compression": {"method": "truncate", "target_tokens": 40},
        "generation": {"model": model, "max_new_tokens": 6, "speculative": {"method": "prompt_lookup"}},
        "resources": {"batch_size": 3, **resources},
        "output": {"uri": str(tmp_path / out), "keep_context": keep_context},
    })


def _rows(uri: str) -> dict[str, dict]:
    return {r["request_id"]: r for r in load_output(uri).to_pylist()}


def test_both_runners_write_the_same_rows(tmp_path, tiny_model_dir, ray_session, monkeypatch, capfd):
    import pipeline.runner

    monkeypatch.setenv("LONGDOC_PROGRESS_INTERVAL_S", "0.01")
    monkeypatch.setattr(pipeline.runner, "LEDGER_LOOK_S", 0.0)
    ray_run = run_job(_spec(tmp_path, str(tiny_model_dir), "out-ray"), run_date=DATE, progress=True, runner="ray")
    # Before its first rows the Ray runner's line moves and says what Ray does, with the
    # run's total once the read stage's ledger has it (a trial saw 15-30 s of silence).
    lines = [ln.strip() for ln in capfd.readouterr().err.splitlines() if ln.strip().startswith("rows ")]
    assert any(ln.startswith("rows 0") and "Ray: reading the input" in ln for ln in lines), lines
    assert any(ln.startswith("rows 0/11 (0%)") for ln in lines), lines
    local_run = run_job(_spec(tmp_path, str(tiny_model_dir), "out-local"), run_date=DATE, progress=False,
                        runner="local")
    by_ray, by_local = _rows(ray_run.output_uri), _rows(local_run.output_uri)
    assert len(by_ray) == 11 and by_ray.keys() == by_local.keys()  # 5 documents x 2 questions + 1 bad line
    for rid, row in by_ray.items():
        assert {k: row[k] for k in SAME} == {k: by_local[rid][k] for k in SAME}, rid
    assert sum(r["error"] is None for r in by_local.values()) == 10
    for key in ("rows", "failed", "status", "tokens_out", "errors_by_kind"):
        assert ray_run.summary[key] == local_run.summary[key], key
    # The local runner's batches end with a whole document (batch_end): 4 + 4 + 3 rows, where
    # Ray Data cuts every 3.
    assert local_run.summary["staged_blocks"] == 3


def test_keep_context_stores_the_text_the_model_read_and_off_leaves_it_null(tmp_path):
    """output.keep_context (schemas/output.py ``context``): truncate's kept text, decoded
    from exactly the document tokens kept_spans names; without the option the column is null."""
    from stages.compression.base import positions_of
    from stages.model_loading import load_tokenizer

    on = run_job(_spec(tmp_path, "random:tiny", "out-on", keep_context=True), run_date=DATE, progress=False,
                 runner="local")
    off = run_job(_spec(tmp_path, "random:tiny", "out-off"), run_date=DATE, progress=False, runner="local")
    tok = load_tokenizer("random:tiny")
    docs = {d["id"]: d["text"] for d in map(json.loads, (tmp_path / "docs.jsonl").read_text().splitlines())
            if "text" in d}
    rows = [r for r in _rows(on.output_uri).values() if r["error"] is None]
    assert len(rows) == 10
    for r in rows:
        ids = tok(docs[r["doc_id"]], add_special_tokens=False)["input_ids"]
        kept = [ids[p] for p in positions_of(r["kept_spans"])]
        assert len(kept) == r["context_tokens"] == 40 < len(ids)  # truncated, not the whole document
        assert r["context"] == tok.decode(kept, skip_special_tokens=False), r["doc_id"]
    assert all(r["context"] is None for r in _rows(on.output_uri).values() if r["error"] is not None)
    assert [r["context"] for r in _rows(off.output_uri).values()] == [None] * 11


def test_a_model_that_does_not_load_aborts_into_retryable_rows_that_a_rerun_heals(tmp_path, tiny_model_dir):
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    failed = run_job(_spec(tmp_path, str(broken)), run_date=DATE, progress=False, runner="local")
    # The model loads once the first input file is read: each of its requests without a row
    # is a retryable row naming the reason (the runner's abort contract).
    assert failed.summary["status"] == "failed" and "config.json" in failed.summary["abort_reason"]
    assert failed.summary["abort_reason"].startswith("StageStartError: the generate stage could not start: ")
    # ... and its stack is kept in the run's record (a driver bug would not hide behind the reason)
    trace = failed.summary["abort_traceback"]
    assert trace.startswith("Traceback (most recent call last):") and "StageStartError" in trace
    aborted = _rows(failed.output_uri)
    assert len(aborted) == 11 and all(r["error_kind"] == RETRYABLE and "run aborted" in r["error"]
                                      for r in aborted.values())
    # The command line says to fix it first: a rerun alone would fail the same way. (A whole
    # folder with a broken config.json: the preflight refuses a folder without weights.)
    whole = tmp_path / "broken-config"
    shutil.copytree(tiny_model_dir, whole)
    (whole / "config.json").write_text("{not json")
    spec_file = tmp_path / "broken.yaml"
    spec_file.write_text(json.dumps(_spec(tmp_path, str(whole), out="out-cli").model_dump(mode="json")))
    res = CliRunner().invoke(app, ["run", str(spec_file), "--runner", "local", "--date", DATE, "--quiet"])
    assert res.exit_code == 1 and "the generate stage could not start" in res.output, res.output
    assert "fix what it says, then run the date again" in res.output
    # The same spec with a model that loads: the retryable rows are redone in place.
    healed = run_job(_spec(tmp_path, str(tiny_model_dir)), run_date=DATE, progress=False, runner="local")
    assert healed.summary["status"] != "failed" and healed.summary["retried"] == 11
    rows = _rows(healed.output_uri)
    assert len(rows) == 11 and sum(r["error"] is None for r in rows.values()) == 10
    assert not rows.keys() & aborted.keys()  # the aborted rows (another model: other ids) are gone


def test_while_it_waits_for_the_engine_the_plan_says_what_the_engine_holds(tmp_path, tiny_model_dir):
    from stages.listing import list_shards

    spec = _spec(tmp_path, str(tiny_model_dir))
    seen: list[str] = []
    plan = LocalPlan(spec, "r1", DATE, str(tmp_path / "out"), frozenset(), list_shards(spec.input, DATE),
                     on_wait=lambda: seen.append(plan.activity()), tick_s=0.001)
    assert plan.activity() == ""  # not started
    tables = list(plan.batches())
    phases = [k for k, _ in itertools.groupby(seen)]
    assert sum(t.num_rows for t in tables) == 11 and phases[:2] == ["reading the first input file", "loading the model"]
    assert seen.count("loading the model") > 1  # ticked while the model loads (it cannot tick itself)
    assert all(s.startswith("engine: ") and " decoding (" in s and "queued" in s for s in phases[2:])
    assert any(" 0 decoding" not in s for s in seen)  # it saw rows decoding
    assert plan.timeline["engine"]["rows_done"] == 10  # the bad line's row never reaches the engine


def test_the_local_runner_imports_no_ray(tmp_path, tiny_model_dir):
    spec = _spec(tmp_path, str(tiny_model_dir))
    (tmp_path / "spec.json").write_text(spec.model_dump_json())
    code = (
        "import json, sys\n"
        "from pipeline.runner import run_job\n"
        "from schemas.spec import JobSpec\n"
        f"spec = JobSpec.model_validate(json.load(open({str(tmp_path / 'spec.json')!r})))\n"
        f"r = run_job(spec, run_date={DATE!r}, progress=False, runner='local')\n"
        "assert r.summary['rows'] == 11, r.summary\n"
        "print('ray' in sys.modules, sorted(m for m in sys.modules if m.startswith('ray.'))[:3])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "False []"


def test_an_unknown_runner_is_refused_before_anything_runs():

    res = CliRunner().invoke(app, ["run", "jobs/sample-qa.yaml", "--runner", "yarn"],
                             env={**os.environ, "COLUMNS": "200"})
    assert res.exit_code == 2
    # an enum option (choices in --help): typer names the value and the choices
    assert "'--runner'" in res.output and "'yarn' is not one of 'auto', 'ray', 'local'" in res.output


def test_a_local_run_without_num_cpus_reads_with_this_machines_cores(tmp_path, tiny_model_dir, monkeypatch):
    """The README's spec has no resources.num_cpus: a laptop run must not read with one core
    (1.69x the documents per hour with both of a 2-core CPU's cores, jobs/results/code-choices.md)."""
    import torch

    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        res = run_job(_spec(tmp_path, str(tiny_model_dir)), run_date=DATE, progress=False, runner="local")
        assert torch.get_num_threads() == 2  # the engine's torch threads
    finally:
        torch.set_num_threads(threads)
    (record,) = (Path(res.output_uri + ".runs") / DATE).glob("*.json")
    assert json.loads(record.read_text())["spec"]["resources"]["num_cpus"] == 2  # the figure the run used


def test_a_rerun_with_nothing_left_loads_no_model_and_says_what_the_date_holds(tmp_path, tiny_model_dir):
    from pipeline.report.summary import format_summary

    spec = _spec(tmp_path, str(tiny_model_dir))
    first = run_job(spec, run_date=DATE, progress=False, runner="local")
    timeline: dict = {}
    again = run_job(spec, run_date=DATE, progress=False, runner="local", timeline=timeline)
    assert again.summary["rows"] == 0 and again.summary["skipped"] == first.summary["rows"] == 11
    # The date's completion mark (stages/completion.py) says it all: nothing read, nothing loaded.
    assert "generate_init_s" not in timeline and "documents" not in timeline and again.summary["nothing_to_do"]
    lines = dict(line.strip().rsplit(None, 1) for line in format_summary(again.summary).splitlines()[1:])
    assert lines["requests already done (skipped)"] == "11" and lines["rows of the date (all runs)"] == "11"
    assert lines["of them failed"] == "1"  # the bad line's row, from the first run
    # Its record carries every field a run that read the input records (`longdoc report`
    # reads both alike), plus what says why it did nothing.
    assert set(first.summary) - set(again.summary) == set()
    assert set(again.summary) - set(first.summary) == {"nothing_to_do", "note"}
    assert again.summary["versions"] == first.summary["versions"] and again.summary["job"] == spec.name


def test_an_interrupt_keeps_every_row_the_engine_had_finished(tmp_path, tiny_model_dir, monkeypatch):
    """A real SIGINT while the rows of one batch decode (pipeline/runner.py's interrupt
    contract): the rows the engine finished are staged though their batch never completed,
    the run is recorded as interrupted with them, and the rerun publishes each request once."""
    from stages.decoding.engine import Engine
    from stages.write import STAGED_SUFFIX

    spec = _spec(tmp_path, str(tiny_model_dir), batch_size=16, decode_slots=1)  # one batch, rows one by one
    finished: list = []
    real_step = Engine.step

    def step(engine):  # the real step; the signal goes out once three rows have finished
        done = real_step(engine)
        finished.extend(done)
        if len(finished) >= 3 and not getattr(engine, "_signalled", False):
            engine._signalled = True
            os.kill(os.getpid(), signal.SIGINT)  # KeyboardInterrupt in the main thread
        return done

    monkeypatch.setattr(Engine, "step", step)
    run = run_job(spec, run_date=DATE, progress=False, runner="local")
    assert run.summary["status"] == "interrupted"
    staged = list((tmp_path / "out.runs").rglob(f"*{STAGED_SUFFIX}"))
    kept = [r for f in staged for r in pq.read_table(f).to_pylist()]
    engine_rows = [r for r in kept if r["doc_id"] != "bad"]
    # Every row finished before the engine stopped (the step in hand may add some), none after.
    assert 3 <= len(engine_rows) == len(finished) < 10, (len(engine_rows), len(finished))
    assert all(r["error"] is None for r in engine_rows)  # abandoned requests have no row at all
    assert run.summary["rows"] == len(kept)
    monkeypatch.setattr(Engine, "step", real_step)
    rerun = run_job(spec, run_date=DATE, progress=False, runner="local")
    assert rerun.summary["status"] != "failed" and rerun.skipped == len(kept)
    rows = _rows(rerun.output_uri)
    assert len(rows) == 11 and sum(r["error"] is None for r in rows.values()) == 10


def test_a_batch_never_splits_a_documents_requests():
    """Three questions a document in batches of four: each batch ends with a whole document
    (a document split across two engine calls was read twice by Finch's shared reading)."""
    rows = [{"doc_id": d, "source_uri": "f.jsonl", "prompt": q} for d in "abcde" for q in "123"]
    cuts, rest = [], rows
    while rest:
        end = batch_end(rest, 4)
        cuts.append("".join(r["doc_id"] for r in rest[:end]))
        rest = rest[end:]
    assert cuts == ["aaabbb", "cccddd", "eee"]
    assert batch_end(rows, 3) == 3 and batch_end(rows[:2], 4) == 2  # already whole; fewer rows than the size
    # One id in two files is two documents; a document with more questions than the size is one batch.
    twins = [{"doc_id": "a", "source_uri": f} for f in ("x", "x", "y", "y")]
    assert batch_end(twins, 1) == 2 and batch_end([{"doc_id": "a", "source_uri": "x"}] * 9, 4) == 9


def test_a_stage_that_cannot_start_is_named_with_its_whole_cause():
    """Review: a multi-line start error lost its stage and cause (only its last line was kept)."""
    import pytest

    from pipeline.local_plan import StageStartError, _starting
    from schemas.output import error_cause

    with pytest.raises(StageStartError) as got:
        with _starting("generate"):
            raise ValueError("Couldn't instantiate the backend tokenizer from one of:\n(1) a file,\n(2) a class.")
    assert error_cause(got.value) == ("StageStartError: the generate stage could not start: ValueError: Couldn't "
                                      "instantiate the backend tokenizer from one of: (1) a file, (2) a class.")

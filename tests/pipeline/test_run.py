"""Whole pipeline through real Parquet, on both runners (real Ray Data, and the same stages
in this process: pipeline/local_plan.py): rows in = rows out."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from alone import run_alone

from pipeline.report.load import load_output, run_summaries
from pipeline.runner import run_job
from schemas.loading import load_spec, spec_from_dict
from schemas.output import INPUT, OUTPUT_COLUMNS
from stages.layout import run_record_dir, run_record_path, staging_dir

DATE = "2026-01-31"


def _corpus(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    (d / "rivers.txt").write_text("Rivers carry water to the sea. The Rhine flows through Basel. " * 5)
    (d / "cities.md").write_text("Zurich is a city on a lake. It has many bridges and old streets. " * 4)
    (d / "empty.txt").write_text("")
    (d / "latin1.txt").write_bytes("caf\xe9 cr\xe8me".encode("latin-1"))
    (d / "huge.txt").write_text("token " * 5000)  # > the tiny model's 4096-token window
    return d


def _spec(tmp_path, model_dir, **extra):
    data = {
        "name": "t",
        "input": {"uri": str(_corpus(tmp_path)), "format": "text"},
        "generation": {"model": str(model_dir), "max_new_tokens": 5},
        "resources": {"batch_size": 2},
        "output": {"uri": str(tmp_path / "out")},
    }
    data.update(extra)
    return spec_from_dict(data)


@pytest.mark.parametrize("runner", ["ray", "local"])
def test_bad_inputs_are_error_rows_and_the_rest_succeeds(runner, tmp_path, tiny_model_dir, ray_session):
    out = tmp_path / "out" / "sample-summarize"  # the README's path, relative to tmp_path
    spec = _spec(tmp_path, tiny_model_dir, output={"uri": str(out)})
    result = run_job(spec, runner=runner, run_date=DATE, run_id="run-a", progress=False)
    table = load_output(result.output_uri)
    assert table.num_rows == 5  # every document has a row
    rows = {r["doc_id"]: r for r in table.to_pylist()}
    assert rows["rivers.txt"]["error"] is None and rows["rivers.txt"]["output_tokens"] > 0
    assert rows["cities.md"]["error"] is None
    assert "empty.txt is empty" in rows["empty.txt"]["error"]
    assert "not valid UTF-8" in rows["latin1.txt"]["error"]
    assert "context of 4096" in rows["huge.txt"]["error"]
    assert {rows[d]["error_kind"] for d in ("empty.txt", "latin1.txt", "huge.txt")} == {INPUT}
    assert result.summary["rows"] == 5 and result.summary["failed"] == 3
    assert set(table.column_names) == set(OUTPUT_COLUMNS)
    # The run record sits beside the table, not in it: the root holds only the rows.
    (run_json,) = Path(run_record_dir(str(out), DATE)).glob("*.json")
    assert run_json.parent == out.parent / "sample-summarize.runs" / DATE
    assert {p.suffix for p in out.rglob("*") if p.is_file()} == {".parquet"}
    recorded = json.loads(run_json.read_text())["summary"]
    assert recorded["rows"] == 5 and recorded["status"] == "partial"
    assert recorded["errors_by_kind"] == {"input": 3, "retryable": 0}
    assert recorded["versions"]["ray"] and recorded["versions"]["pyarrow"] and recorded["finished_at"]

    # Input errors are final: the default rerun skips everything already written. Rerun
    # under the same run id, it keeps the first attempt's record beside its own.
    again = run_job(spec, runner=runner, run_date=DATE, run_id="run-a", progress=False)
    assert again.skipped == 5 and again.summary["rows"] == 0
    (first,) = json.loads(run_json.read_text())["summary"]["earlier_attempts"]
    assert (first["rows"], first["failed"], first["status"], first["wall_s"]) == (5, 3, "partial", recorded["wall_s"])
    assert again.summary["wall_s_all_attempts"] == pytest.approx(recorded["wall_s"] + again.summary["wall_s"])
    # --retry-errors all redoes the 3 error rows and REPLACES them: still 5 rows.
    healed = run_job(spec, runner=runner, run_date=DATE, run_id="run-c", progress=False, retry_errors="all")
    assert healed.skipped == 2 and healed.summary["retried"] == 3 and healed.summary["rows"] == 3
    assert healed.summary["date_rows"] == 5 and healed.summary["date_failed"] == 3
    table2 = load_output(result.output_uri)
    assert table2.num_rows == 5 and len(set(table2.column("request_id").to_pylist())) == 5
    listed = run_summaries(result.output_uri, table2)
    assert [(s["run_id"], s["rows"]) for s in listed] == [("run-a", 2), ("run-c", 3)]
    assert listed[0]["wall_s"] == pytest.approx(again.summary["wall_s_all_attempts"])  # both attempts' time

    # The next night's run lands in its own partition; every reader sees both dates.
    run_job(spec, runner=runner, run_date="2026-02-01", run_id="run-d", progress=False)
    expected = _rows_by_reader(out)
    pandas_rows = expected["pandas"]
    assert {r[0] for r in pandas_rows} == {DATE, "2026-02-01"} and pandas_rows.total() == 10
    for reader, got in expected.items():
        want = pandas_rows if len(next(iter(got))) == 3 else Counter(r[1:] for r in pandas_rows.elements())
        assert got == want, reader
    _run_readme_snippets(tmp_path)


def _rows_by_reader(out) -> dict[str, Counter]:
    """(run_date, request_id, error) per row, or (request_id, error) from readers that
    do not turn the hive folder into a column."""
    import pandas as pd
    import polars as pl
    import pyarrow.dataset as ds

    glob = f"{out}/**/*.parquet"
    con = duckdb.connect()
    got: dict[str, Counter] = {}  # a multiset: the same request_id exists on both dates
    df = pd.read_parquet(out)
    got["pandas"] = Counter((str(d), q, None if pd.isna(e) else e) for d, q, e in
                            zip(df["run_date"], df["request_id"], df["error"]))
    t = ds.dataset(out, partitioning="hive").to_table()
    got["pyarrow.dataset"] = Counter(zip(*(t.column(c).to_pylist() for c in ("run_date", "request_id", "error"))))
    for name, opt in (("duckdb", ""), ("duckdb hive", ", hive_partitioning = true")):
        sql = f"select cast(run_date as varchar), request_id, error from read_parquet('{glob}'{opt})"
        got[name] = Counter(con.execute(sql).fetchall())
    got["duckdb no hive"] = Counter(con.execute(
        f"select request_id, error from read_parquet('{glob}', hive_partitioning = false)").fetchall())
    assert "run_date" not in con.sql(f"select * from read_parquet('{glob}', hive_partitioning = false)").columns
    # Polars reads the folder as it is, no options: run_date comes back as a Date.
    folder = pl.read_parquet(out)
    assert folder.schema["run_date"] == pl.Date
    got["polars"] = Counter(folder.select(pl.col("run_date").cast(pl.String), "request_id", "error").iter_rows())
    lazy = pl.scan_parquet(out).select(pl.col("run_date").cast(pl.String), "request_id", "error")
    got["polars scan"] = Counter(lazy.collect().iter_rows())
    return got


def _readme_blocks(lang: str) -> list[str]:
    """The code blocks of README.md's "Reading the output" section, in one language."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = text[text.index("## Reading the output"):]
    section = section[: section.index("\n## ", 1)]
    return re.findall(rf"```{lang}\n(.*?)```", section, flags=re.S)


def _run_readme_snippets(cwd: Path) -> None:
    """The README's pandas, DuckDB and Polars snippets, run as written."""
    py, sql = _readme_blocks("python"), _readme_blocks("sql")
    assert len(py) == 2 and len(sql) == 1
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(cwd)
        ns: dict = {}
        for block in py:
            exec(compile(block, "README.md", "exec"), ns)  # noqa: S102 - the README's own code
        per_date = duckdb.sql(sql[0]).fetchall()
    assert len(ns["df"]) == 10 and ns["failed_per_date"].tolist() == [3, 3]
    assert len(ns["answers"]) == 10 and ns["answers"]["error"].count() == 6
    assert str(ns["df"]["run_date"].dtype).startswith("datetime64") and len(ns["recent"]) == 10
    assert [(str(d), n, f) for d, n, f, *_ in per_date] == [(DATE, 5, 3), ("2026-02-01", 5, 3)]
    assert [(str(d), n, f) for d, n, f in ns["per_date"].iter_rows()] == [(DATE, 5, 3), ("2026-02-01", 5, 3)]


@pytest.mark.parametrize("runner", ["ray", "local"])
def test_truncate_and_qa_from_jsonl(runner, tmp_path, tiny_model_dir, ray_session):
    data = tmp_path / "qa.jsonl"
    docs = [
        {"id": "a", "text": "The vault code is 7431. " * 40, "questions": ["What is the code?", "Where?"], "answers": ["7431", None]},
        {"id": "b", "body": "missing text field"},
        {"id": "c", "text": "A document whose question field is absent."},
    ]
    # Line 4 repeats line 1 exactly (same id, text and questions: the same request ids):
    # its requests are published once and counted once, as `duplicates`.
    data.write_text("\n".join(json.dumps(d) for d in [*docs, docs[0]]))
    spec = spec_from_dict(
        {
            "name": "qa",
            "input": {"uri": str(data), "format": "jsonl", "question_field": "questions", "answer_field": "answers"},
            "task": {"kind": "qa"},
            "compression": {"method": "truncate", "target_tokens": 50},
            "generation": {"model": str(tiny_model_dir), "max_new_tokens": 4},
            "output": {"uri": str(tmp_path / "out")},
        }
    )
    result = run_job(spec, runner=runner, run_date=DATE, progress=False)
    rows = sorted(load_output(result.output_uri).to_pylist(), key=lambda r: (r["doc_id"], r["prompt"] or ""))
    assert len(rows) == 4 and len({r["request_id"] for r in rows}) == 4
    assert result.summary["rows"] == 4 and result.summary["duplicates"] == 2
    assert [r["prompt"] for r in rows[:2]] == ["What is the code?", "Where?"]
    assert rows[0]["reference"] == "7431"
    for r in rows[:2]:
        assert r["error"] is None and r["context_tokens"] == 50
        assert r["compression_ratio"] == pytest.approx(r["doc_tokens"] / 50)
    assert "field 'text' is missing" in rows[2]["error"] and "qa.jsonl:2" in rows[2]["error"]
    # A row without the question field: an input error row naming the field, not a silent skip.
    assert rows[3]["doc_id"] == "c" and rows[3]["error_kind"] == INPUT
    assert "'questions' (input.question_field) is missing" in rows[3]["error"]


@pytest.mark.parametrize("runner", ["ray", "local"])
def test_a_rerun_with_another_spec_or_a_fixed_line_replaces_the_rows_it_supersedes(runner, tmp_path, tiny_model_dir,
                                                                                   ray_session):
    """A date holds one row per document and prompt of its input (pipeline/runner.py,
    stages/partition.py ``superseded``): a rerun with other settings (other request ids)
    replaced nothing before and left two rows per question; a malformed line fixed left its
    error row beside the new document's row."""
    data = tmp_path / "qa.jsonl"
    good = [{"id": f"d{i}", "text": f"Document {i} names the river number {i}. " * 8, "q": ["Which river?", "Why?"]}
            for i in range(3)]
    lines = [json.dumps(good[0]), '{"id": "d9", "text": "broken', json.dumps(good[1]), json.dumps(good[2])]
    data.write_text("\n".join(lines))

    def spec(**generation):
        return spec_from_dict({
            "name": "qa", "input": {"uri": str(data), "format": "jsonl", "question_field": "q"},
            "task": {"kind": "qa"}, "generation": {"model": str(tiny_model_dir), "max_new_tokens": 4, **generation},
            "output": {"uri": str(tmp_path / "out")}})

    def by_key() -> Counter:
        return Counter((r["doc_id"], r["prompt"]) for r in load_output(str(tmp_path / "out")).to_pylist())

    first = run_job(spec(), run_date=DATE, progress=False, runner=runner)
    assert first.summary["rows"] == 7 and first.summary["failed"] == 1  # 3 x 2 questions + the bad line
    other = run_job(spec(max_new_tokens=6), run_date=DATE, progress=False, runner=runner)
    counts = by_key()
    assert sum(counts.values()) == 7 and max(counts.values()) == 1, counts  # before: 14 rows, 2 per question
    assert other.summary["superseded"] == 7 and other.summary["date_rows"] == 7
    assert {r["output_tokens"] <= 6 for r in load_output(str(tmp_path / "out")).to_pylist() if r["error"] is None}

    lines[1] = json.dumps({"id": "d9", "text": "The fixed line names river nine. " * 8, "q": ["Which river?"]})
    data.write_text("\n".join(lines))
    fixed = run_job(spec(max_new_tokens=6), run_date=DATE, progress=False, runner=runner)
    rows = load_output(str(tmp_path / "out")).to_pylist()
    assert fixed.summary["status"] == "succeeded" and fixed.summary["superseded"] == 1  # the error row
    assert len(rows) == 7 and all(r["error"] is None for r in rows), [r["error"] for r in rows]
    assert fixed.skipped == 6 and fixed.summary["rows"] == 1

    # Under input.limit only the documents the run read are replaced; the others' rows stay.
    limited = run_job(spec(max_new_tokens=5).model_copy(update={"input": spec().input.model_copy(update={"limit": 1})}),
                      run_date=DATE, progress=False, runner=runner)
    assert limited.summary["superseded"] == 2 and sum(by_key().values()) == 7


@pytest.mark.parametrize("runner", ["ray", "local"])
def test_one_big_file_is_written_batch_by_batch(runner, tmp_path, tiny_model_dir, ray_session):
    """A single-file corpus must not reach the generate pool as one block: each
    generate batch is staged as its own file (resume granularity, progress, and work
    for every actor of the pool); the end of the run compacts them into one file."""
    data = tmp_path / "one.jsonl"
    data.write_text("\n".join(json.dumps({"id": f"d{i}", "text": f"Document {i} talks about rivers. " * 8})
                              for i in range(6)))
    spec = spec_from_dict(
        {
            "name": "big",
            "input": {"uri": str(data), "format": "jsonl"},
            "generation": {"model": str(tiny_model_dir), "max_new_tokens": 2},
            "resources": {"batch_size": 2},
            "output": {"uri": str(tmp_path / "out")},
        }
    )
    result = run_job(spec, runner=runner, run_date=DATE, progress=False)
    files = list((tmp_path / "out" / f"run_date={DATE}").glob("*.parquet"))
    assert load_output(result.output_uri).num_rows == 6
    assert result.summary["staged_blocks"] == 3
    assert len(files) == 1 and pq.ParquetFile(files[0]).metadata.num_rows == 6
    assert not list(Path(staging_dir(result.output_uri, DATE)).rglob("*.staged"))  # published, then removed


@pytest.mark.parametrize("runner", ["ray", "local"])
def test_a_complete_date_run_again_reads_nothing_starts_no_ray_and_loads_no_model(runner, tmp_path, tiny_model_dir,
                                                                                  ray_session):
    """A date whose every request has a row, run again (a scheduler that fired twice, a rerun
    after success): the Ray runner started Ray and loaded the model (~18 s on the sample job)
    to find every request skipped; the local one read the whole input. Now the completion
    mark of the last complete run says so (stages/completion.py): the rerun, in a process of
    its own, imports neither Ray nor torch, records a run that had nothing to do (as `report`
    lists it) and says which --retry-errors would redo the error rows. A changed spec is work."""
    spec = _spec(tmp_path, tiny_model_dir)  # five files: two documents and three input-error rows
    first = run_job(spec, runner=runner, run_date=DATE, run_id="run-a", progress=False)
    assert first.summary["rows"] == 5 and first.summary["failed"] == 3
    again = run_alone(f"""
        import json, sys
        from pipeline.runner import run_job
        from schemas.loading import spec_from_dict
        spec = spec_from_dict(json.loads({json.dumps(spec.model_dump(mode="json"))!r}))
        r = run_job(spec, runner={runner!r}, run_date={DATE!r}, run_id="run-b", progress=False)
        done({{"summary": r.summary, "skipped": r.skipped,
               "imported": [m for m in ("ray", "torch", "transformers") if m in sys.modules]}})
    """, timeout_s=300)
    s = again["summary"]
    assert again["imported"] == [], again["imported"]  # no Ray started, no model loaded
    assert again["skipped"] == 5 and (s["rows"], s["skipped"], s["date_rows"], s["date_failed"]) == (0, 5, 5, 3)
    assert s["nothing_to_do"] and s["status"] == "partial"  # the date's status: 3 input-error rows
    assert "--retry-errors all retries its 3 input error row(s)" in s["note"]
    record = json.loads(Path(run_record_path(first.output_uri, DATE, "run-b")).read_text())["summary"]
    assert record["nothing_to_do"] and record["skipped"] == 5
    (listed,) = [r for r in run_summaries(first.output_uri, load_output(first.output_uri)) if r["run_id"] == "run-b"]
    assert listed["nothing_to_do"] and "the date's 5 request(s) were already done" in listed["note"]
    # Another budget: other request ids, so work (and it replaces the rows it supersedes).
    other = spec.model_copy(update={"generation": spec.generation.model_copy(update={"max_new_tokens": 4})})
    changed = run_job(other, runner=runner, run_date=DATE, progress=False)
    assert changed.summary["rows"] == 5 and changed.summary["superseded"] == 5
    assert "nothing_to_do" not in changed.summary
    assert run_job(other, runner=runner, run_date=DATE, progress=False).summary["nothing_to_do"]
    assert load_output(first.output_uri).num_rows == 5


def test_a_complete_date_is_work_again_for_error_rows_retried_a_raised_limit_or_a_changed_file(tmp_path,
                                                                                               tiny_model_dir):
    """The completion mark stands for the input as listed and the spec as written: error rows
    asked to be retried, a larger input.limit, a file added before the limit or a file
    rewritten (the same size) each make the rerun read and run what it must, as before."""
    corpus = _corpus(tmp_path)  # cities.md, empty.txt, huge.txt, latin1.txt, rivers.txt
    spec = spec_from_dict({"name": "t", "input": {"uri": str(corpus), "format": "text", "limit": 3},
                           "generation": {"model": str(tiny_model_dir), "max_new_tokens": 5},
                           "output": {"uri": str(tmp_path / "out")}})

    def run(s=spec, **kw):
        return run_job(s, runner="local", run_date=DATE, progress=False, **kw).summary

    assert run()["rows"] == 3  # cities.md, and empty.txt and huge.txt as input-error rows
    assert run()["nothing_to_do"]
    retried = run(retry_errors="all")
    assert (retried["retried"], retried["rows"]) == (2, 2) and "nothing_to_do" not in retried
    assert run()["nothing_to_do"]
    wider = spec.model_copy(update={"input": spec.input.model_copy(update={"limit": 4})})
    more = run(wider)
    assert (more["rows"], more["skipped"]) == (1, 3) and "nothing_to_do" not in more  # latin1.txt
    assert run(wider)["nothing_to_do"]
    (corpus / "a-first.txt").write_text("A new document, listed first. " * 3)
    added = run(wider)
    assert (added["rows"], added["skipped"], added["date_rows"]) == (1, 3, 5), added  # four files under the limit: one new
    text = (corpus / "cities.md").read_text()
    (corpus / "cities.md").write_text(text.replace("Zurich", "Geneva"))  # the same size
    rewritten = run(wider)
    assert (rewritten["rows"], rewritten["superseded"]) == (1, 1), rewritten
    assert run(wider)["nothing_to_do"]


@pytest.mark.e2e
def test_sample_job_with_the_embedded_model(tmp_path, ray_session):
    spec = load_spec(
        "jobs/sample-summarize.yaml",
        ["input.limit=2", "generation.max_new_tokens=16", "resources.num_cpus=1", f"output.uri={tmp_path}/out"],
    )
    result = run_job(spec, run_date=DATE, progress=False)
    table = load_output(result.output_uri)
    assert table.num_rows == 2
    for r in table.to_pylist():
        assert r["error"] is None, r["error"]
        assert r["output_tokens"] > 0 and len(r["output_text"].split()) >= 3
        assert r["speculative"] == "prompt_lookup" and r["compression"] == "truncate"
        assert r["context_tokens"] <= 1024 and r["doc_tokens"] >= 2000
    assert result.summary["output_tokens_per_s"] > 0


@pytest.mark.e2e
def test_the_embedded_models_output_folder_reads_without_options(tmp_path):
    """The README's promise: Polars, pandas and DuckDB read the output folder as it is.
    The run record lives beside it (``{output}.runs/``), so the folder holds only Parquet;
    an output an earlier version wrote (records in ``{output}/_runs/``) still reports."""
    import pandas as pd
    import polars as pl

    root = tmp_path / "out" / "sample-summarize"
    spec = load_spec("jobs/sample-summarize.yaml", ["input.limit=2", "generation.max_new_tokens=4",
                                                     f"output.uri={root}"])
    result = run_job(spec, runner="local", run_date=DATE, run_id="run-e", progress=False)
    assert result.output_uri == str(root)
    assert [p.name for p in root.iterdir()] == [f"run_date={DATE}"]
    assert Path(run_record_path(str(root), DATE, "run-e")) == tmp_path / "out" / "sample-summarize.runs" / DATE / "run-e.json"
    assert Path(run_record_path(str(root), DATE, "run-e")).is_file()

    df = pl.read_parquet(root)  # no options
    assert df.height == 2 and df.schema["run_date"] == pl.Date
    assert df["run_date"].cast(pl.String).to_list() == [DATE] * 2
    assert pl.scan_parquet(root).select(pl.len()).collect().item() == 2
    assert len(pd.read_parquet(root)) == 2
    ((n, run_date),) = duckdb.sql(
        f"select count(*), any_value(run_date) from read_parquet('{root}/**/*.parquet')").fetchall()
    assert n == 2 and str(run_date) == DATE

    # An output of an earlier version: its run record inside the root, under _runs/.
    (summary,) = run_summaries(str(root), load_output(str(root)))
    assert summary["status"] == result.summary["status"] and summary["throughput_basis"] == "wall"
    legacy = root / "_runs" / DATE / "run-e.json"
    legacy.parent.mkdir(parents=True)
    Path(run_record_path(str(root), DATE, "run-e")).rename(legacy)
    (old,) = run_summaries(str(root), load_output(str(root)))
    assert old == summary  # the report finds it where that version wrote it


def test_an_interrupt_while_publishing_is_recorded_and_the_next_run_publishes(tmp_path, tiny_model_dir, monkeypatch):
    """Ctrl-C after the rows are staged, while they are published: the run record says
    interrupted (nothing lost, nothing published twice) and the next run finishes."""
    import pipeline.runner as runner_module

    spec = _spec(tmp_path, tiny_model_dir)
    real = runner_module.commit_date

    calls: list[int] = []

    def interrupted_publish(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:  # the start's publish of earlier runs' staged rows (none here)
            return real(*args, **kwargs)
        raise KeyboardInterrupt("SIGINT")  # what pipeline/cli.py's handler raises, here at the end's publish

    monkeypatch.setattr(runner_module, "commit_date", interrupted_publish)
    first = run_job(spec, runner="local", run_date=DATE, run_id="run-a", progress=False)
    assert first.summary["status"] == "interrupted" and first.summary["interrupted_by"] == "SIGINT"
    record = json.loads(Path(run_record_path(first.output_uri, DATE, "run-a")).read_text())
    assert record["summary"]["status"] == "interrupted"
    staging = Path(staging_dir(first.output_uri, DATE))
    assert list(staging.rglob("*.staged")), "the staged rows were kept"
    # ... outside the output root: a reader of the folder meets no staged file meanwhile.
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file() and p.suffix != ".parquet"]
    monkeypatch.setattr(runner_module, "commit_date", real)
    second = run_job(spec, runner="local", run_date=DATE, run_id="run-b", progress=False)
    assert second.summary["status"] != "interrupted"
    rows = load_output(second.output_uri).to_pylist()
    assert len(rows) == 5 and len({r["request_id"] for r in rows}) == 5  # every document once
    assert not list(staging.rglob("*.staged"))


def test_an_id_named_in_two_input_files_is_said_and_each_document_keeps_its_rows(tmp_path, tiny_model_dir):
    """A warehouse export in part files: one id in two parts with two texts. Read apart, the
    files cannot refuse it (one file does: stages/read.py); the run says it."""
    parts = tmp_path / "parts"
    parts.mkdir()
    for name, text in (("part-0.jsonl", "The red ticket was closed on Monday. " * 8),
                       ("part-1.jsonl", "The blue ticket is still open. " * 8)):
        (parts / name).write_text(json.dumps({"id": 1002, "text": text, "questions": ["Is it closed?"]}) + "\n"
                                  + json.dumps({"id": f"only-{name}", "text": text, "questions": ["Who?"]}) + "\n")
    spec = _spec(tmp_path, tiny_model_dir, input={"uri": str(parts), "format": "jsonl", "question_field": "questions"},
                 task={"kind": "qa"})
    result = run_job(spec, runner="local", run_date=DATE, progress=False)
    assert result.summary["shared_ids"] == 1
    assert result.summary["shared_id_examples"] == {"1002": [str(parts / "part-0.jsonl"), str(parts / "part-1.jsonl")]}
    rows = load_output(result.output_uri).to_pylist()
    assert sorted(r["doc_id"] for r in rows) == ["1002", "1002", "only-part-0.jsonl", "only-part-1.jsonl"]
    assert all(r["error"] is None for r in rows)
    # `longdoc run` says it (a rerun of another date: the ledger of a complete run knows it).
    from typer.testing import CliRunner

    from pipeline.cli import app

    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(json.dumps(spec.model_dump(mode="json")))  # JSON is YAML
    res = CliRunner().invoke(app, ["run", str(spec_file), "--date", "2026-02-02", "--quiet", "--runner", "local"])
    assert res.exit_code == 0, res.output
    assert "note: 1 document id(s) name documents in more than one input file ('1002' in " in res.output
    assert "give them distinct ids" in res.output

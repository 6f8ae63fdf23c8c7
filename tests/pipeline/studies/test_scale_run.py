"""pipeline/studies/scale_run.py on 40 documents, through the real `longdoc run` CLI on an
embedded Ray: a whole run measured (one driver start, ~20 s of CPU; it says why it needs
more than ~30 s: the embedded Ray and the model start in the subprocess), and, marked
slow (two more driver starts, minutes on a shared machine), a driver SIGKILLed at half
its rows and the same command rerun, which must redo nothing already written."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from pipeline.studies.scale_run import DATE, document_text, main

N_DOCS = 40
ARGS = ["--docs", str(N_DOCS), "--docs-per-file", "10", "--batch-size", "2"]


def test_documents_are_deterministic_and_a_few_hundred_tokens():
    from stages.model_loading import load_tokenizer

    assert document_text(3, 250) == document_text(3, 250) != document_text(4, 250)
    n_tokens = len(load_tokenizer("random:tiny")(document_text(3, 250))["input_ids"])
    assert 200 <= n_tokens <= 600, n_tokens


@pytest.mark.slow  # one whole longdoc run (embedded Ray, workers importing torch): over a minute
def test_a_whole_run_is_measured(tmp_path, capsys):
    res = main([*ARGS, "--out", str(tmp_path), "--runs", "full"])
    full = res["full_run"]
    assert "kill_rerun" not in res
    assert full["exit_code"] == 0
    assert full["rows"] == full["unique_requests"] == N_DOCS and full["errors"] == 0
    assert full["rows_per_s"] == N_DOCS / full["wall_s"]
    assert full["overhead_ms_per_row"] == pytest.approx(1000 * full["wall_s"] / N_DOCS)
    assert 0 < full["generate_busy_s"] < full["wall_s"]  # the rows' device_s, summed
    assert full["run_wall_s"] < full["wall_s"]  # the command also imports and starts Ray
    assert full["driver_peak_rss_mb"] > 100  # Python, Ray and pyarrow live in the driver
    assert full["tree_peak_rss_mb"] > full["driver_peak_rss_mb"]  # GCS, raylet and workers too
    assert full["tree_max_processes"] >= 3
    assert full["staged_blocks"] == N_DOCS // 2  # one staged file per generate batch of 2
    assert 0 < full["first_block_s"] <= full["last_block_s"] < full["wall_s"]
    saved = json.loads((tmp_path / "scale_run.json").read_text())
    assert saved["full_run"]["rows"] == N_DOCS and saved["commit"] and saved["machine"]["cpus"]
    assert "| rows/s (whole command) |" in capsys.readouterr().out
    assert "| driver peak RSS (MB, VmHWM) |" in (tmp_path / "scale_run.md").read_text()


@pytest.mark.slow  # two driver starts (the killed run and its rerun): minutes on a shared core
def test_a_driver_killed_at_half_then_rerun_redoes_nothing(tmp_path):
    # 128 new tokens a row: at 8, a fast CPU (Zen 5) staged the last 38 rows within a few
    # polls of the end, and the run was over before the kill could land at half.
    res = main([*ARGS, "--max-new-tokens", "128", "--out", str(tmp_path), "--runs", "kill"])
    kill = res["kill_rerun"]
    # Killed once half the rows were staged; the rerun skipped at least what was on disk
    # (plus what the killed run's leftover workers staged before its scan: CI once saw 6
    # such rows), computed only the rest, redid none of it, and left every request
    # exactly once without error.
    assert kill["rows_at_kill"] >= kill["kill_target_rows"] == N_DOCS // 2
    assert kill["rows_before_rerun"] < N_DOCS, "nothing was left to rerun"
    assert len(kill["killed_run_ids"]) == 1 and kill["rerun_run_id"] not in kill["killed_run_ids"]
    assert kill["killed_run_status"] == ["running"]  # the record it wrote when it started, and no more
    assert kill["rerun_exit_code"] == 0 and kill["rerun_status"] == "succeeded"
    assert kill["rows_before_rerun"] <= kill["rerun_skipped"] <= kill["killed_run_rows_final"]
    assert kill["rerun_rows"] == N_DOCS - kill["rerun_skipped"]
    assert kill["redone"] == 0 and kill["kept_original_run_id"] == kill["rows_before_rerun"]
    assert kill["straggler_rows"] == kill["killed_run_rows_final"] - kill["rows_before_rerun"] >= 0
    assert kill["final_rows"] == kill["final_unique_requests"] == N_DOCS and kill["final_errors"] == 0
    assert kill["staged_left"] == 0

    # The tool's claims, checked against the files it measured.
    out = tmp_path / "work" / "kill" / "out"
    rows = pq.read_table(out / f"run_date={DATE}", columns=["run_id"]).column("run_id").to_pylist()
    by_run = {r: rows.count(r) for r in set(rows)}
    assert by_run == {kill["killed_run_ids"][0]: kill["killed_run_rows_final"],
                      kill["rerun_run_id"]: N_DOCS - kill["killed_run_rows_final"]}
    assert "**redone** (must be 0) | 0 |" in (tmp_path / "scale_run.md").read_text()


def test_the_sizes_table_puts_the_sizes_side_by_side_with_the_targets():
    from pipeline.studies.scale_run import sizes_markdown

    def run(rss: float, first: float, rows: int) -> dict:
        return {"rows": rows, "errors": 0, "driver_peak_rss_mb": rss, "first_block_s": first,
                "rows_per_s": rows / 100, "steady_rows_per_s": rows / 90, "wall_s": 100.0,
                "tree_peak_rss_mb": 3 * rss, "staged_blocks": rows // 64}

    res = {"machine": {"cpu": "AMD EPYC", "usable_cpus": 2, "cpus": 2, "mem_gb": 23.5, "omp_num_threads": "1",
                       "python": "3.11"}, "measured_at": "t", "commit": "c", "words_per_doc": 20,
           "max_new_tokens": 1, "batch_size": 64, "docs_per_file": 1000, "actors": 1, "command": "cmd",
           "sizes": [{"docs": 10, "full_run": run(400.0, 60.0, 10)}, {"docs": 100, "full_run": run(500.0, 95.0, 100)}]}
    text = sizes_markdown(res)
    assert "| documents | 10 | 100 |" in text
    assert "| driver peak RSS (MB, VmHWM) | 400.0 | 500.0 (1.25x) |" in text
    assert "driver peak RSS 1.25x (target <= 1.3x: PASS); first staged block 1.58x (target <= 1.5x: FAIL)" in text


@pytest.mark.slow  # two whole longdoc runs
def test_several_sizes_run_side_by_side(tmp_path):
    res = main(["--docs", "20,40", "--docs-per-file", "10", "--batch-size", "4", "--out", str(tmp_path)])
    assert [s["docs"] for s in res["sizes"]] == [20, 40]
    assert [s["full_run"]["rows"] for s in res["sizes"]] == [20, 40]
    assert "| documents | 20 | 40 |" in (tmp_path / "scale_sizes.md").read_text()

"""`longdoc bench compress`: Finch vs full prefill side by side, for summaries and for qa."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from pipeline.bench.compress import bench_compress


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("compress")(bench_compress)
    app.command("noop")(lambda: None)  # two commands keep the subcommand name
    return app


@pytest.mark.parametrize("task", ["summarize", "qa"])
def test_bench_compress_prints_ratios(task, tiny_model_dir):
    args = ["compress", "--model", str(tiny_model_dir), "--sizes", "400", "--targets", "64",
            "--chunk", "128", "--sweep-chunks", "", "--task", task]
    res = CliRunner().invoke(_app(), args)
    assert res.exit_code == 0, res.output
    assert f"task={task}" in res.output
    rows = [line for line in res.output.splitlines() if line.startswith("| 400 |")]
    assert [r.split(" | ")[1] for r in rows] == ["full prefill", "finch t=64 c=128"]
    assert rows[0].rstrip(" |").endswith("1.00x | 1.00x")  # full vs itself
    assert rows[1].split(" | ")[5].endswith("x")  # Finch's time vs full


def test_bench_compress_rejects_an_unknown_task(tiny_model_dir):
    res = CliRunner().invoke(_app(), ["compress", "--model", str(tiny_model_dir), "--task", "chat"])
    said = " ".join(res.output.replace("│", " ").split())  # the message as one line, out of its box
    assert res.exit_code != 0 and "'chat' is not one of 'summarize', 'qa'" in said


def test_bench_compress_runs_finch_at_each_layer_cap_and_as_if_uncalibrated(tiny_model_dir):
    args = ["compress", "--model", str(tiny_model_dir), "--sizes", "400", "--targets", "64",
            "--chunk", "128", "--sweep-chunks", "", "--heads", "all", "--max-scoring-layers", "none,1"]
    res = CliRunner().invoke(_app(), args)
    assert res.exit_code == 0, res.output
    assert "heads=all (every head of every layer of 2)" in res.output
    rows = [line.split(" | ")[1] for line in res.output.splitlines() if line.startswith("| 400 |")]
    assert rows == ["full prefill", "finch t=64 c=128", "finch t=64 c=128 layers<=1"]


@pytest.mark.parametrize(("option", "value", "allowed"), [
    ("--max-scoring-layers", "0", "none or a layer count >= 1"),
    ("--max-scoring-layers", "eight", "none or a layer count >= 1"),
    ("--heads", "some", "'some' is not one of 'calibrated', 'all'"),
    # before the model loads: the lists, the corpus
    ("--sizes", "abc", "--sizes 'abc': allowed a comma list of integers >= 1"),
    ("--targets", "-5", "--targets '-5': allowed a comma list of integers >= 1"),
    ("--corpus", "/no/such/folder", "--corpus '/no/such/folder': no .txt files there"),
])
def test_bench_compress_rejects_bad_finch_options(tiny_model_dir, option, value, allowed):
    res = CliRunner().invoke(_app(), ["compress", "--model", str(tiny_model_dir), option, value])
    assert "Traceback" not in res.output
    said = " ".join(res.output.replace("│", " ").split())  # the message as one line, out of its box
    assert res.exit_code != 0 and allowed in said

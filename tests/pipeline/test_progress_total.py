"""The progress line of a JSONL run shows the run's total before its first row is written
(the read stage's ledger has it; pipeline/runner.py looks while the engine works)."""

from __future__ import annotations

import json

import pipeline.runner
from pipeline.runner import run_job
from schemas.loading import spec_from_dict


def test_the_total_shows_before_the_first_row(tmp_path, tiny_model_dir, monkeypatch, capfd):
    with open(tmp_path / "docs.jsonl", "w") as f:
        for i in range(4):
            f.write(json.dumps({"id": f"d{i}", "text": f"Document {i} is short. " * 20}) + "\n")
    spec = spec_from_dict({
        "name": "p", "input": {"uri": str(tmp_path / "docs.jsonl"), "format": "jsonl"},
        "generation": {"model": str(tiny_model_dir), "max_new_tokens": 4},
        "resources": {"batch_size": 4}, "output": {"uri": str(tmp_path / "out")},
    })
    monkeypatch.setenv("LONGDOC_PROGRESS_INTERVAL_S", "0.01")
    monkeypatch.setattr(pipeline.runner, "LEDGER_LOOK_S", 0.0)
    result = run_job(spec, runner="local", run_date="2026-01-01", run_id="p1", progress=True)
    assert result.summary["rows"] == 4
    lines = [ln for ln in capfd.readouterr().err.splitlines() if ln.strip().startswith("rows ")]
    assert any(ln.strip().startswith("rows 0/4 (0%)") for ln in lines), lines

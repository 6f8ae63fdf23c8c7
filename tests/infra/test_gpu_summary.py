"""infra/gpu/summary.py over a GPU session's work folder, built from the committed
results those parts wrote (a cut-short part simply has no line)."""

from __future__ import annotations

import shutil
from pathlib import Path

from gpu_scripts import gpu_script

summary = gpu_script("summary")
RESULTS = Path(__file__).resolve().parents[2] / "jobs" / "results"


def test_every_part_reads_its_results(tmp_path):
    (tmp_path / "a-fp32").mkdir()
    shutil.copy(RESULTS / "bench-decode" / "decode-nvidia-h100-80gb-hbm3-embedded-smollm2-135m-instruct-float32.json",
                tmp_path / "a-fp32")
    (tmp_path / "ac-run").mkdir()
    shutil.copy(RESULTS / "autocompressor" / "train_log_kv.csv", tmp_path / "ac-run" / "train_log.csv")
    shutil.copy(RESULTS / "autocompressor" / "nll_heldout_kv.json", tmp_path / "nll_heldout.json")
    shutil.copy(RESULTS / "2026-11-24-finch-e2e-nvidia-h100.json", tmp_path / "finch-e2e.json")
    md = summary.summary(tmp_path)
    assert md.startswith("# GPU session figures") and "(no result)" not in md
    assert "### a-fp32: embedded:smollm2-135m-instruct" in md and "- B=8: tok/s" in md
    assert "- AutoCompressor training: 600 steps" in md
    assert "held-out NLL (4 docs" in md and "recovered 57% of the gap (met" in md
    assert "- Finch " in md and "target <= 0.7x)" in md


def test_an_empty_work_folder_says_no_result(tmp_path):
    md = summary.summary(tmp_path)
    assert md.count("(no result)") == 3

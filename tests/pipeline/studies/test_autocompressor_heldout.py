"""pipeline/studies/autocompressor_heldout.py on tiny checkpoints: every condition scored
per page, the means and the recovered share of the gap."""

from __future__ import annotations

import json
import math

import pytest

from pipeline.studies.autocompressor_heldout import main


@pytest.mark.parametrize("form", ["vectors", "kv"])
def test_every_condition_on_tiny_checkpoints(form, tiny_autocompressors, pages, tmp_path):
    out = tmp_path / "heldout.json"
    summary = main(["--checkpoint", str(tiny_autocompressors[form]), "--docs", str(pages), "--earlier", "64",
                    "--cont", "16", "--segment", "32", "--out", str(out)])
    assert json.loads(out.read_text()) == summary
    assert summary["docs"] == 3 and [r["id"] for r in summary["rows"]] == ["page-0", "page-1", "page-2"]
    conditions = {"none", "full", "trunc", "ac_none", "ac", "ac_other"} | ({"rec", "rec_other"} if form == "vectors" else set())
    assert conditions | {"recovered", "by_summaries"} == set(summary["mean"])
    assert all(math.isfinite(v) and v > 0 for r in summary["rows"] for k, v in r.items() if k in conditions)
    kept = summary["summary_vectors" if form == "vectors" else "kept_slots"]
    assert kept == (2 * 3 if form == "vectors" else 2 * 8)  # 2 segments x 3 vectors, or every 4th of 32 tokens
    assert summary["compression"] == 64 / kept


def test_earlier_must_be_whole_segments(tiny_autocompressors, pages):
    with pytest.raises(ValueError, match="--earlier 64 must be a multiple of --segment 48"):
        main(["--checkpoint", str(tiny_autocompressors["kv"]), "--docs", str(pages), "--earlier", "64",
              "--segment", "48"])

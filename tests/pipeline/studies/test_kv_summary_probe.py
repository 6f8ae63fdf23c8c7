"""pipeline/studies/kv_summary_probe.py on a tiny model: each layout trains a few steps
and is scored before and after, own page vs another page."""

from __future__ import annotations

import json
import math

import pytest

from pipeline.studies.kv_summary_probe import main, summary_slots


def test_summary_slots_per_layout():
    stride = summary_slots("stride", 4, earlier=16)
    assert stride.nonzero().flatten().tolist() == [3, 7, 11, 15]
    inter = summary_slots("interleaved", 4, earlier=16)
    assert len(inter) == 20 and inter.nonzero().flatten().tolist() == [4, 9, 14, 19]  # a gist after every 4
    end = summary_slots("end", 4, earlier=16)
    assert len(end) == 20 and end[16:].all() and not end[:16].any()


@pytest.mark.parametrize("layout", ["end", "interleaved", "stride"])
def test_a_few_steps_of_each_layout(layout, pages, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    text = pages.read_text()
    (corpus / "train.jsonl").write_text(text)
    (corpus / "heldout.jsonl").write_text(text)
    out = tmp_path / "probe"
    result = main(["--layout", layout, "--stride", "4", "--steps", "2", "--eval-every", "1", "--threads", "1",
                   "--corpus", str(corpus), "--model", "random:tiny", "--earlier", "64", "--cont", "16",
                   "--out", str(out)])
    assert json.loads(out.with_suffix(".json").read_text()) == result
    assert [e["step"] for e in result["evals"]] == [0, 1, 2]
    assert all(math.isfinite(e["own"]) and math.isfinite(e["other"]) for e in result["evals"])
    log = out.with_suffix(".csv").read_text().splitlines()
    assert log[0] == "step,loss,seconds" and len(log) == 3
    assert (corpus / "train_ids.pt").is_file()  # the training pages, tokenized once

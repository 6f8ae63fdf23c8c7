"""pipeline/studies/finch_layouts.py on a tiny input: every layout from one Finch
compression per question, answered and scored."""

from __future__ import annotations

import json

import pytest

from pipeline.studies.finch_layouts import VARIANTS, main, question_set

TARGET = 160
# Layouts that may add context around the kept sentences, past the budget.
OVER_BUDGET = {"none", "t5_next_rel"}


def test_every_layout_on_a_tiny_model(qa_set, tmp_path, capsys):
    out = tmp_path / "layouts.json"
    results = main(["--set", "eval", "--eval-set", str(qa_set), "--model", "random:tiny", "--target", str(TARGET),
                    "--variants", ",".join(VARIANTS), "--max-new-tokens", "4", "--limit", "3", "--out", str(out)])
    assert json.loads(out.read_text()) == results and len(results) == 3
    for rec in results:
        assert rec["kind"] in ("inserted", "native") and rec["sentence_best"]
        for name in VARIANTS:
            assert rec[name] in (0.0, 1.0) and rec[f"{name}_ev"] in (0.0, 1.0), name
            assert isinstance(rec[f"{name}_answer"], str)
            if name not in OVER_BUDGET:
                assert rec[f"{name}_n"] <= TARGET, (name, rec[f"{name}_n"])
        assert rec["none_ev"] == 1.0  # the whole document holds every answer
        assert rec["doc_n"] == TARGET  # Finch keeps exactly the budget in tokens
    table = capsys.readouterr().out
    assert "| all | 3 |" in table and "| inserted | 2 |" in table


def test_unknown_layouts_and_sets_are_refused(qa_set, tmp_path):
    with pytest.raises(SystemExit, match="unknown variants \\['best'\\]; allowed: doc, rel"):
        main(["--variants", "doc,best", "--out", str(tmp_path / "x.json")])
    with pytest.raises(SystemExit, match="unknown --set 'all'; allowed: eval, sample, needles"):
        question_set("all")
    needles = question_set("needles", sample_set=str(qa_set))
    assert [r["kinds"] for r in needles] == [["inserted"] * 3] * 2
    assert all(a in r["text"] for r in needles for a in r["answers"])

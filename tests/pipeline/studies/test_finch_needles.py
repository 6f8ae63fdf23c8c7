"""pipeline/studies/finch_needles.py on a tiny input: every method answers every
inserted-fact question at one budget."""

from __future__ import annotations

import json

import pytest

from pipeline.studies.finch_needles import FINCH, main, questions

METHODS = (*FINCH, "rag", "truncate")


def test_inserted_questions_only_by_question_then_document(qa_set):
    qs = questions(str(qa_set), limit=10)
    assert [(q["doc"], q["a"], q["depth"]) for q in qs] == [("doc-0", "the Black Sea", 0.2),
                                                            ("doc-1", "the Black Sea", 0.2)]
    assert len(questions(str(qa_set), limit=1)) == 1


def test_every_method_on_a_tiny_model(qa_set, tmp_path, capsys):
    out = tmp_path / "needles.json"
    results = main(["--methods", ",".join(METHODS), "--eval-set", str(qa_set), "--model", "random:tiny",
                    "--target", "64", "--chunk", "32", "--max-new-tokens", "4", "--limit", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == results
    assert [r["method"] for r in results] == list(METHODS)
    assert all(r["contains"] in (0.0, 1.0) and r["cpu_s"] >= 0 and isinstance(r["answer"], str) for r in results)
    table = capsys.readouterr().out
    assert all(f"| {m} | " in table for m in METHODS)


def test_an_unknown_method_is_refused_before_loading(tmp_path):
    with pytest.raises(SystemExit, match="unknown methods \\['finch'\\]; allowed: finch-paper"):
        main(["--methods", "finch", "--model", "no-such-model"])

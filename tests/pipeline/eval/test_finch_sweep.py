"""The Finch tuning sweep: one head pass per question, every variant's text and answer."""

from __future__ import annotations

import json

import pytest

from pipeline.eval.finch_sweep import Variant, main, parse_variant, run_sweep

FILLER = ("The committee met in the old library to review the archive. Members read reports about "
          "roads, bridges and the harbour, and agreed to meet again after the summer.\n\n")


def _eval_set(tmp_path):
    recs = [
        {"id": "a", "text": FILLER * 6 + "The vault code of the Zurich branch is 4417.\n\n" + FILLER * 6,
         "questions": ["What is the vault code of the Zurich branch?", "Which number opens the safe in Zurich?"],
         "answers": ["4417", "4417"], "kind": ["inserted", "inserted"], "style": ["echoed", "paraphrased"]},
        {"id": "b", "text": FILLER * 8 + "The ferry Aurora carries 312 passengers.",
         "questions": ["How many passengers does the ferry Aurora carry?"],
         "answers": ["312"], "kind": ["inserted"], "style": ["echoed"]},
    ]
    p = tmp_path / "styled.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return p


def test_variant_names():
    assert parse_variant("heads-lines-f0.5") == Variant("heads-lines-f0.5", "heads", 0.0, False, 0.5)
    assert parse_variant("fused0.7-prose-f0.3-next-doc") == Variant(
        "fused0.7-prose-f0.3-next-doc", "fused", 0.7, True, 0.3, "document", True)
    assert parse_variant("rag").evidence == "rag"
    for bad in ("fused2-prose", "heads-next", "tokens", "fused0.5-f1.5"):
        with pytest.raises(ValueError, match="variant"):
            parse_variant(bad)


def test_sweep_runs_every_variant_and_reuses_its_caches(tmp_path, tiny_model_dir):
    path, out = _eval_set(tmp_path), tmp_path / "sweep"
    variants = ["heads-lines-f0.5", "fused0.5-prose-f0.5-next", "fused1-prose", "rag"]
    rows = run_sweep(str(path), 64, variants, out, max_new_tokens=3, model_name=str(tiny_model_dir))
    assert len(rows) == 3 * len(variants)
    assert {r["style"] for r in rows} == {"echoed", "paraphrased"}
    for r in rows:
        assert r["contains"] in (0.0, 1.0) and r["evidence"] in (0.0, 1.0) and 0 < r["tokens"] <= 64
    # The embedder alone reads the sentence that names the answer for each question.
    assert all(r["evidence"] == 1.0 for r in rows if r["variant"] == "fused1-prose")
    passes = json.loads((out / "headpass.json").read_text())
    answers = json.loads((out / "answers.json").read_text())
    assert len(passes) == 3 and len(answers) <= 3 * len(variants)
    line = next(x for x in (out / "summary.md").read_text().splitlines() if x.startswith("| fused1-prose |"))
    assert line.count("(1.00)") == 3  # evidence on both styles and overall
    again = run_sweep(str(path), 64, variants, out, max_new_tokens=3, model_name=str(tiny_model_dir))
    assert again == rows  # cached head passes and answers: the same rows
    assert json.loads((out / "headpass.json").read_text()) == passes


def test_cli_evidence_only_and_bad_variant(tmp_path, tiny_model_dir, capsys):
    path, out = _eval_set(tmp_path), tmp_path / "ev"
    main(["--eval-set", str(path), "--target", "64", "--variants", "fused0.5-prose-f0.5", "--out", str(out),
          "--evidence-only", "--limit", "2", "--model", str(tiny_model_dir)])
    rows = json.loads((out / "rows.json").read_text())
    assert len(rows) == 2 and all(r["contains"] is None for r in rows)
    assert not (out / "answers.json").exists()  # nothing answered
    assert "- (" in capsys.readouterr().out  # no accuracy without answers, evidence only
    with pytest.raises(SystemExit, match="variant"):
        main(["--variants", "fused9", "--out", str(out)])
